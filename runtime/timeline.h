// A timeline of one stretch of a program (Runtime::begin_timeline .. end_timeline): the device
// time of every launch, fill, copy and upload recorded meanwhile (a timestamp query written
// before and after its commands) and the host's own spans (submissions, waits), for a
// Chrome trace / Perfetto file and a per-kernel summary.
//
// Contract:
// - Off (no begin_timeline), the runtime records no query and reads no clock for it: a launch
//   pays one pointer test.
// - On, each launch (eager, or a graph's launch replayed) is one GPU event named by its kernel
//   (a replayed launch also names its graph). A graph replayed from bundles runs a second set
//   of bundles, recorded at its first replay under a timeline and kept with the graph: the same
//   commands with a stamp between consecutive launches (one stamp per launch, and one before
//   each batch of fills), copied out after the replay; the host's cost per replay is one record,
//   whatever the graph's length. Every stamp is written at BOTTOM_OF_PIPE: an event spans from
//   the completion of the commands before it to the completion of its own, which for the
//   dependent launches vkad records (a barrier between them) is the launch's run time; launches
//   recorded without a barrier between them overlap, and their events share the time.
// - A timestamp costs the device about as much as a third of a dependent dispatch (H200: 1.3-1.9
//   us per stamp after a 3.3 us dispatch, vkad-bench-dispatch), so timing every launch of a
//   dispatch-bound program slows it by half. Replays are therefore sampled: a graph's first
//   replay in a timeline and every `replay_sample`-th after it are timed launch by launch; the
//   others are one device event each ("replay 'g'", category "replay": two stamps around the
//   whole replay). replay_sample 1 times every replay. Eager launches are always timed.
// - Events are kept up to `max_events`; later ones are counted in Timeline::dropped (a replay's
//   launches all or none).
// - A device whose queue has no timestamp queries (rhi::Capabilities::timestamps) gives host
//   spans only, and Timeline::gpu_timestamps says so.
// - GPU times are placed on the host's clock by one calibration at begin_timeline (a stamp
//   written by an empty submission, waited for): Timeline::clock_uncertainty_us bounds the
//   shift between the two clocks; durations are exact to the device's timestamp period.
// These are the public value types (vkad.h, without Vulkan); the runtime's recorder is in
// runtime/timeline_recorder.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace vkad::runtime {

// Runtime::begin_timeline's defaults: events kept (a few hundred bytes each); a graph's replays
// timed launch by launch: its first and every 16th after it (see the contract).
inline constexpr uint64_t kTimelineMaxEvents = 1000000;
inline constexpr uint32_t kTimelineReplaySample = 16;

struct TimelineEvent {
  std::string name;      // the kernel's name, "fill 'x'", "copy 'a' -> 'b'", "synchronize", ...
  std::string category;  // launch, fill, copy, upload (device); submit, wait, replay (host)
  bool gpu = false;      // timestamps on the device, or steady_clock on the host
  uint64_t launch = 0;   // the launch's sequence number (LaunchId) for a launch, else 0
  std::string graph;     // the graph of a replayed launch or a replay span, else ""
  double begin_us = 0;   // microseconds since begin_timeline, on the host's clock
  double end_us = 0;
};

struct TimelineKernelSummary {
  std::string name;
  uint64_t count = 0;
  double total_us = 0, mean_us = 0;
  double share = 0;  // of all GPU event time
};

struct Timeline {
  std::vector<TimelineEvent> events;  // GPU events in recording order, then host spans
  uint64_t dropped = 0;               // events past max_events, not kept
  bool gpu_timestamps = false;        // false: host spans only (see note)
  std::string device;
  std::string note;  // why GPU events are missing, when they are
  double clock_uncertainty_us = 0;
  // Replay sampling (see the contract): replays timed launch by launch, replays timed as one
  // event, and the launches of the latter (not in `events` one by one).
  uint32_t replay_sample = 1;
  uint64_t replays_timed = 0, replays_spanned = 0, spanned_launches = 0;

  // Chrome trace event format (chrome://tracing, ui.perfetto.dev): one track for the device
  // queue, one for the host; times in microseconds.
  std::string chrome_trace_json() const;
  Status write_chrome_trace(const std::string& path) const;
  // GPU events grouped by name, largest total first (a replay timed as one event is not a
  // kernel: left out).
  std::vector<TimelineKernelSummary> summarize() const;
  // summarize() as a text table (name, count, total, mean, share), then what was dropped.
  std::string summary() const;
};

}  // namespace vkad::runtime
