// The runtime's half of the timeline (runtime/timeline.h has the contract and the public
// types): query pools, the events waiting for their timestamps, host spans.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"
#include "rhi/buffer.h"
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
  TimelineRecorder(rhi::Device& device, uint64_t max_events, uint32_t replay_sample);
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

  // A bundled graph replay's launches (runtime/graph.cpp): the graph's timed bundles write one
  // stamp per boundary into a pool of the graph's, and each replay copies them after its
  // bundles into the recorder's storage, so that the next replay may reset the pool. The
  // layout, shared by every replay of the graph, names each launch and its stamps; the events
  // are made from it at finish(), so a replay costs the host one record however many launches
  // it has.
  struct ReplayLayout {
    std::string graph;
    std::vector<std::string> kernels;  // launch i's kernel
    // Launch i runs from stamp launch_stamps[i].first to .second (a stamp between two launches
    // serves both); stamp_count stamps in all.
    std::vector<std::pair<uint32_t, uint32_t>> launch_stamps;
    uint32_t stamp_count = 0;
  };
  // Whether GPU events are kept at all (timestamps, calibrated).
  bool gpu_times() const { return timestamps_ && calibrated_; }
  // A replay of `graph` (`launches` launches) begins: whether its launches are timed one by
  // one (its first replay in this timeline and every replay_sample-th after it), else it is
  // one event. Counted for Timeline's replay figures.
  bool time_replay(uint64_t graph, uint64_t launches);
  // Records into `list` the copy of `layout`'s stamps from `pool` and keeps the replay's
  // launches (numbered from `first_launch`) as events; past max_events, all counted dropped.
  Status replay_stamps(rhi::CommandList& list, rhi::QueryPool& pool,
                       std::shared_ptr<const ReplayLayout> layout, uint64_t first_launch);

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
    // Or a bundled replay: its launches' events, from its stamps copied to stamp_buffers_ at
    // copied_stamp.
    std::shared_ptr<const ReplayLayout> replay;
    uint64_t copied_stamp = 0;
  };
  static constexpr uint64_t kStampBufferStamps = 16384;  // 128 KiB of host-visible memory
  bool keep();                                           // counts one event against max_events

  rhi::Device& device_;
  uint64_t max_events_;
  uint32_t replay_sample_;
  std::unordered_map<uint64_t, uint64_t> replays_;  // per graph, in this timeline
  uint64_t replays_timed_ = 0, replays_spanned_ = 0, spanned_launches_ = 0;
  uint64_t kept_ = 0, dropped_ = 0;
  bool timestamps_ = false;
  double period_ns_ = 0;
  uint64_t mask_ = ~uint64_t{0};
  double t0_us_ = 0;  // the host time of begin_timeline
  std::vector<rhi::QueryPool> pools_;
  uint32_t used_ = kPoolQueries;  // queries used in pools_.back()
  std::vector<Pending> pending_;
  // Copied stamps: buffer b holds those numbered from stamp_base_[b]; the last has room up to
  // its size.
  std::vector<rhi::Buffer> stamp_buffers_;
  std::vector<uint64_t> stamp_base_;
  uint64_t stamps_copied_ = 0;  // the next copied stamp's number
  std::vector<TimelineEvent> host_;
  // Calibration: the stamp at query 0 of pool 0 and the host times around it.
  double cal_submit_us_ = 0, cal_done_us_ = 0;
  uint64_t cal_ticks_ = 0;
  bool calibrated_ = false;
};

}  // namespace vkad::runtime
