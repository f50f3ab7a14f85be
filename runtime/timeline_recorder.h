// The runtime's half of the timeline (runtime/timeline.h has the contract and the public
// types): query pools, the events waiting for their timestamps, host spans.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "rhi/command_list.h"
#include "rhi/pipeline.h"
#include "runtime/timeline.h"

namespace vkad::rhi {
class Device;
}

namespace vkad::runtime {

// The runtime's recorder: query pools, the events waiting for their timestamps, host spans.
class TimelineRecorder {
 public:
  TimelineRecorder(rhi::Device& device, uint64_t max_events);
  // The calibration (see the contract): called by the runtime with the device idle, `list`
  // open and empty; writes one stamp. After the list's submission completed, calibrate().
  Status begin_calibration(rhi::CommandList& list, double submit_us);
  Status calibrate(double done_us);

  // Opens a GPU event: writes its begin stamp into `list` (first resetting a fresh pool
  // there). false when the event is not kept (past max_events, or no timestamps): then
  // end_gpu must not be called.
  Result<bool> begin_gpu(rhi::CommandList& list, std::string name, const char* category,
                         uint64_t launch, const std::string& graph);
  void end_gpu(rhi::CommandList& list);
  // A host span, times from now_us().
  void host(std::string name, const char* category, double begin_us, double end_us,
            const std::string& graph = {});
  static double now_us();

  // With every submission complete: the events, GPU times read and placed on the host clock.
  Result<Timeline> finish(const std::string& device_name);

 private:
  static constexpr uint32_t kPoolQueries = 4096;
  struct Pending {
    TimelineEvent event;
    uint32_t pool = 0, query = 0;  // begin stamp; end stamp at query + 1
  };
  bool keep();  // counts one event against max_events

  rhi::Device& device_;
  uint64_t max_events_;
  uint64_t kept_ = 0, dropped_ = 0;
  bool timestamps_ = false;
  double period_ns_ = 0;
  uint64_t mask_ = ~uint64_t{0};
  double t0_us_ = 0;  // the host time of begin_timeline
  std::vector<rhi::QueryPool> pools_;
  uint32_t used_ = kPoolQueries;  // queries used in pools_.back()
  std::vector<Pending> pending_;
  std::vector<TimelineEvent> host_;
  // Calibration: the stamp at query 0 of pool 0 and the host times around it.
  double cal_submit_us_ = 0, cal_done_us_ = 0;
  uint64_t cal_ticks_ = 0;
  bool calibrated_ = false;
};

}  // namespace vkad::runtime
