#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include "rhi/device.h"
#include "runtime/timeline_recorder.h"

namespace vkad::runtime {

namespace {

// A JSON string literal of `s` (names come from users: kernels, arrays, graphs).
void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void append_number(std::string& out, double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  out += buf;
}

}  // namespace

std::string Timeline::chrome_trace_json() const {
  // pid 1 is the program; tid 1 the device's queue, tid 2 the host thread that called vkad.
  std::string out = "{\"displayTimeUnit\": \"ns\", \"otherData\": {\"device\": ";
  append_json_string(out, device);
  out += ", \"gpu_timestamps\": ";
  out += gpu_timestamps ? "true" : "false";
  out += ", \"dropped_events\": " + std::to_string(dropped) +
         ", \"replay_sample\": " + std::to_string(replay_sample) +
         ", \"replays_spanned\": " + std::to_string(replays_spanned) +
         ", \"clock_uncertainty_us\": ";
  append_number(out, clock_uncertainty_us);
  out += ", \"note\": ";
  append_json_string(out, note);
  out += "},\n\"traceEvents\": [\n";
  out +=
      "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"args\": {\"name\": \"vkad\"}},\n"
      "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 1, \"args\": {\"name\": "
      "\"device queue\"}},\n"
      "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 2, \"args\": {\"name\": "
      "\"host\"}}";
  for (const TimelineEvent& e : events) {
    out += ",\n{\"name\": ";
    append_json_string(out, e.name);
    out += ", \"cat\": ";
    append_json_string(out, e.category);
    out += ", \"ph\": \"X\", \"pid\": 1, \"tid\": ";
    out += e.gpu ? "1" : "2";
    out += ", \"ts\": ";
    append_number(out, e.begin_us);
    out += ", \"dur\": ";
    append_number(out, std::max(0.0, e.end_us - e.begin_us));
    out += ", \"args\": {";
    bool first = true;
    if (e.launch != 0) {
      out += "\"launch\": " + std::to_string(e.launch);
      first = false;
    }
    if (!e.graph.empty()) {
      out += first ? "\"graph\": " : ", \"graph\": ";
      append_json_string(out, e.graph);
    }
    out += "}}";
  }
  out += "\n]}\n";
  return out;
}

Status Timeline::write_chrome_trace(const std::string& path) const {
  const std::string text = chrome_trace_json();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return make_error(ErrorCode::kInvalidArgument,
                      "timeline: cannot write '" + path + "': " + std::strerror(errno));
  }
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    return make_error(ErrorCode::kInvalidArgument,
                      "timeline: writing '" + path + "' failed: " + std::strerror(errno));
  }
  return {};
}

std::vector<TimelineKernelSummary> Timeline::summarize() const {
  std::map<std::string, TimelineKernelSummary> by_name;
  double all = 0;
  for (const TimelineEvent& e : events) {
    if (!e.gpu || e.category == "replay") continue;
    TimelineKernelSummary& s = by_name[e.name];
    s.name = e.name;
    ++s.count;
    const double d = std::max(0.0, e.end_us - e.begin_us);
    s.total_us += d;
    all += d;
  }
  std::vector<TimelineKernelSummary> out;
  out.reserve(by_name.size());
  for (auto& [name, s] : by_name) {
    s.mean_us = s.total_us / static_cast<double>(s.count);
    s.share = all > 0 ? s.total_us / all : 0;
    out.push_back(std::move(s));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.total_us > b.total_us; });
  return out;
}

std::string Timeline::summary() const {
  const std::vector<TimelineKernelSummary> rows = summarize();
  size_t width = 4;
  for (const auto& r : rows) width = std::max(width, r.name.size());
  width = std::min<size_t>(width, 60);
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-*s %8s %12s %10s %7s\n", static_cast<int>(width), "name",
                "count", "total us", "mean us", "share");
  out += buf;
  for (const auto& r : rows) {
    std::string name = r.name.size() > width ? r.name.substr(0, width - 3) + "..." : r.name;
    std::snprintf(buf, sizeof buf, "%-*s %8" PRIu64 " %12.1f %10.2f %6.1f%%\n",
                  static_cast<int>(width), name.c_str(), r.count, r.total_us, r.mean_us,
                  100.0 * r.share);
    out += buf;
  }
  if (!gpu_timestamps) out += "no device times: " + note + "\n";
  if (replays_spanned != 0) {
    out += std::to_string(replays_spanned) + " of " +
           std::to_string(replays_spanned + replays_timed) + " graph replays timed as one event (" +
           std::to_string(spanned_launches) +
           " launches not in the table): each graph's first replay and every " +
           std::to_string(replay_sample) + "th are timed launch by launch (replay_sample)\n";
  }
  if (dropped != 0) {
    out += std::to_string(dropped) + " events past the timeline's max_events were not kept\n";
  }
  return out;
}

TimelineRecorder::TimelineRecorder(rhi::Device& device, uint64_t max_events, uint32_t replay_sample)
    : device_(device),
      max_events_(max_events),
      replay_sample_(std::max<uint32_t>(replay_sample, 1)),
      t0_us_(now_us()) {
  const rhi::Capabilities& caps = device.caps();
  timestamps_ = caps.timestamps;
  period_ns_ = caps.timestamp_period_ns;
  if (caps.timestamp_valid_bits > 0 && caps.timestamp_valid_bits < 64) {
    mask_ = (uint64_t{1} << caps.timestamp_valid_bits) - 1;
  }
}

double TimelineRecorder::now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool TimelineRecorder::time_replay(uint64_t graph, uint64_t launches) {
  const bool timed = replays_[graph]++ % replay_sample_ == 0;
  if (timed) {
    ++replays_timed_;
  } else {
    ++replays_spanned_;
    spanned_launches_ += launches;
  }
  return timed;
}

bool TimelineRecorder::keep() {
  if (kept_ >= max_events_) {
    ++dropped_;
    return false;
  }
  ++kept_;
  return true;
}

Status TimelineRecorder::begin_calibration(rhi::CommandList& list, double submit_us) {
  if (!timestamps_) return {};
  VKAD_ASSIGN_OR_RETURN(rhi::QueryPool pool,
                        device_.create_query_pool(kPoolQueries, "timeline queries"));
  pools_.push_back(std::move(pool));
  list.reset_queries(pools_.back(), 0, kPoolQueries);
  list.write_timestamp(pools_.back(), 0);
  used_ = 1;
  cal_submit_us_ = submit_us;
  return {};
}

Status TimelineRecorder::calibrate(double done_us) {
  if (!timestamps_) return {};
  VKAD_TRY(pools_.front().read(0, 1, &cal_ticks_));
  cal_done_us_ = done_us;
  calibrated_ = true;
  return {};
}

Result<bool> TimelineRecorder::begin_gpu(rhi::CommandList& list, std::string name,
                                         const char* category, uint64_t launch,
                                         const std::string& graph) {
  if (!timestamps_ || !calibrated_ || !keep()) return false;
  if (used_ + 2 > kPoolQueries) {
    VKAD_ASSIGN_OR_RETURN(rhi::QueryPool pool,
                          device_.create_query_pool(kPoolQueries, "timeline queries"));
    pools_.push_back(std::move(pool));
    list.reset_queries(pools_.back(), 0, kPoolQueries);
    used_ = 0;
  }
  Pending& p = pending_.emplace_back();
  p.event.name = std::move(name);
  p.event.category = category;
  p.event.gpu = true;
  p.event.launch = launch;
  p.event.graph = graph;
  p.pool = static_cast<uint32_t>(pools_.size() - 1);
  p.query = used_;
  used_ += 2;
  list.write_timestamp(pools_.back(), p.query);
  return true;
}

void TimelineRecorder::end_gpu(rhi::CommandList& list) {
  list.write_timestamp(pools_[pending_.back().pool], pending_.back().query + 1);
}

Status TimelineRecorder::replay_stamps(rhi::CommandList& list, rhi::QueryPool& pool,
                                       std::shared_ptr<const ReplayLayout> layout,
                                       uint64_t first_launch) {
  const uint64_t events = layout->kernels.size();
  if (!gpu_times() || events == 0) return {};
  if (kept_ + events > max_events_) {
    dropped_ += events;
    return {};
  }
  kept_ += events;
  // A copy lands in one buffer: a new one where the last has no room for all of it.
  const uint32_t count = layout->stamp_count;
  const uint64_t room =
      stamp_buffers_.empty()
          ? 0
          : stamp_base_.back() + stamp_buffers_.back().size() / sizeof(uint64_t) - stamps_copied_;
  if (room < count) {
    const uint64_t stamps = std::max<uint64_t>(count, kStampBufferStamps);
    VKAD_ASSIGN_OR_RETURN(rhi::Buffer b,
                          device_.create_buffer({stamps * sizeof(uint64_t),
                                                 rhi::MemoryUsage::kReadback, "timeline stamps"}));
    stamp_buffers_.push_back(std::move(b));
    stamp_base_.push_back(stamps_copied_);
  }
  list.copy_timestamps(pool, 0, count, stamp_buffers_.back(),
                       (stamps_copied_ - stamp_base_.back()) * sizeof(uint64_t));
  Pending& p = pending_.emplace_back();
  p.event.launch = first_launch;
  p.replay = std::move(layout);
  p.copied_stamp = stamps_copied_;
  stamps_copied_ += count;
  return {};
}

void TimelineRecorder::host(std::string name, const char* category, double begin_us, double end_us,
                            const std::string& graph) {
  if (!keep()) return;
  TimelineEvent& e = host_.emplace_back();
  e.name = std::move(name);
  e.category = category;
  e.begin_us = begin_us - t0_us_;
  e.end_us = end_us - t0_us_;
  e.graph = graph;
}

Result<Timeline> TimelineRecorder::finish(const std::string& device_name) {
  Timeline t;
  t.device = device_name;
  t.dropped = dropped_;
  t.gpu_timestamps = timestamps_;
  t.replay_sample = replay_sample_;
  t.replays_timed = replays_timed_;
  t.replays_spanned = replays_spanned_;
  t.spanned_launches = spanned_launches_;
  if (!timestamps_) {
    t.note = "device '" + device_name + "' has no timestamp queries on its compute queue";
  }
  // The calibration stamp was written between the submission and the end of the wait: it is
  // placed at their midpoint, off by at most half their distance.
  const double cal_us = (cal_submit_us_ + cal_done_us_) / 2 - t0_us_;
  t.clock_uncertainty_us = timestamps_ ? (cal_done_us_ - cal_submit_us_) / 2 : 0;
  auto to_us = [&](uint64_t tick) {
    // Differences modulo the valid bits: a counter that wrapped still gives the interval.
    const uint64_t d = (tick - cal_ticks_) & mask_;
    const double signed_ticks =
        d > (mask_ >> 1) ? -static_cast<double>((mask_ - d) + 1) : static_cast<double>(d);
    return cal_us + signed_ticks * period_ns_ / 1000.0;
  };
  std::vector<uint64_t> ticks;
  for (uint32_t p = 0; p < pools_.size(); ++p) {
    // Queries of pool p that events used: [0, last + 2); read them in one call.
    uint32_t end = 0;
    for (const Pending& e : pending_) {
      if (!e.replay && e.pool == p) end = std::max(end, e.query + 2);
    }
    if (end == 0) continue;
    ticks.assign(end, 0);
    VKAD_TRY(pools_[p].read(0, end, ticks.data()));
    for (Pending& e : pending_) {
      if (e.replay || e.pool != p) continue;
      e.event.begin_us = to_us(ticks[e.query]);
      e.event.end_us = to_us(ticks[e.query + 1]);
    }
  }
  // Copied stamps: the buffer holding stamp n is the last whose base is <= n.
  for (const rhi::Buffer& b : stamp_buffers_) VKAD_TRY(device_.invalidate_mapped(b.allocation()));
  auto copied = [&](uint64_t n) {
    const size_t b = static_cast<size_t>(
        std::upper_bound(stamp_base_.begin(), stamp_base_.end(), n) - stamp_base_.begin() - 1);
    uint64_t tick = 0;
    std::memcpy(&tick, stamp_buffers_[b].mapped() + (n - stamp_base_[b]) * sizeof tick,
                sizeof tick);
    return to_us(tick);
  };
  t.events.reserve(kept_);
  for (Pending& e : pending_) {
    if (!e.replay) {
      t.events.push_back(std::move(e.event));
      continue;
    }
    const ReplayLayout& r = *e.replay;
    for (size_t i = 0; i < r.kernels.size(); ++i) {
      TimelineEvent& x = t.events.emplace_back();
      x.name = r.kernels[i];
      x.category = "launch";
      x.gpu = true;
      x.launch = e.event.launch + i;
      x.graph = r.graph;
      x.begin_us = copied(e.copied_stamp + r.launch_stamps[i].first);
      x.end_us = copied(e.copied_stamp + r.launch_stamps[i].second);
    }
  }
  for (TimelineEvent& e : host_) t.events.push_back(std::move(e));
  pending_.clear();
  host_.clear();
  return t;
}

}  // namespace vkad::runtime
