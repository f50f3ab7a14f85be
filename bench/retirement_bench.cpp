// Retirement policies side by side, in one run on one device.
//
//   vkad-bench-retirement [--device D] [--flushes F] [--bytes B] [--json out.json]
//                         [--svg out.svg]
//
// Workload: each flush holds one launch of axpy plus an upload of B bytes (default 16 KiB) as
// its per-flush ctx buffers. Three loads: "keeps up" (axpy over 1024 elements, flushes back to
// back: on a fast GPU the host still outruns the device's per-submission latency), "paced" (the
// same, plus U us of simulated host work per flush, as a DSL's Python layer spends; host time
// per flush >= GPU time per flush, so per-entry polling should never force a wait) and "behind"
// (axpy over 2^22 elements on a GPU, 2^18 on a CPU device). Policies: hold until synchronize,
// full drain when full, per-entry polling (vkad), at depths 1, 3 and 8. Reports host time
// blocked, forced waits, high-water bytes held, and flushes per second; the SVG plots bytes held
// over the run. "floor" is the same loop with no retirement work (hold until synchronize): the
// cost of retirement is ours / floor.
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_runtime.h"
#include "bench/bench_util.h"
#include "runtime/runtime.h"
#include "support/sample_kernels.h"

using namespace vkad;
using namespace vkad::bench;

namespace {

struct RunResult {
  std::string load, policy;
  size_t depth;
  int flushes;
  double seconds, blocked_ms;
  uint64_t forced_waits, high_water_bytes;
  std::vector<uint64_t> bytes_trace;
  // Host µs per flush by phase: the benchmark's own clocks around upload / launch / flush, and
  // the runtime's flush profile (RuntimeOptions::profile_flush) inside them.
  double upload_us = 0, launch_us = 0, flush_us = 0;
  runtime::FlushProfile profile;
};

const char* policy_name(runtime::RetirementPolicy p) {
  switch (p) {
    case runtime::RetirementPolicy::kPerEntryPolling: return "per-entry polling (vkad)";
    case runtime::RetirementPolicy::kHoldUntilSync: return "hold until synchronize";
    case runtime::RetirementPolicy::kFullDrainWhenFull: return "full drain when full";
  }
  return "?";
}

RunResult run(const std::string& device, runtime::RetirementPolicy policy, size_t depth, uint32_t n,
              int flushes, uint64_t bytes, double host_us, const std::string& load) {
  runtime::RuntimeOptions o;
  o.device.device = device;
  o.retirement_depth = depth;
  o.retirement_policy = policy;
  o.max_list_age_us = 1e12;
  // The breakdown's clocks: ten steady_clock reads per flush (a few hundred ns), the same in
  // every policy, so the ratios between policies stand.
  o.profile_flush = true;
  auto rt_r = runtime::Runtime::create(o);
  if (!rt_r.ok()) {
    std::fprintf(stderr, "%s\n", rt_r.status().to_string().c_str());
    std::exit(1);
  }
  runtime::Runtime& rt = **rt_r;
  auto x = rt.create_ndarray(runtime::DType::kF32, {n}, "x");
  auto y = rt.create_ndarray(runtime::DType::kF32, {n}, "y");
  uint32_t scratch_n = static_cast<uint32_t>(bytes / 4);
  auto scratch = rt.create_ndarray(runtime::DType::kF32, {scratch_n}, "scratch");
  auto k = rt.register_kernel(testing::make_axpy_kernel("axpy"));
  // Seeded random data (bench_util.h); x positive (the axpy kernel flags x < 0 as an error).
  const std::vector<float> x0 = random_floats(n, 1, 0.5f, 1.5f), y0 = random_floats(n, 2),
                           host = random_floats(scratch_n, 3);
  if (!rt.upload(*x, x0.data(), n * 4).ok() || !rt.upload(*y, y0.data(), n * 4).ok() ||
      !rt.synchronize().ok())
    check_failed("uploading axpy's inputs");
  constexpr float kA = 0.5f;  // a power of two: a * x is exact, only the additions round
  runtime::Arg args[] = {runtime::Arg::f32(kA), runtime::Arg::ndarray(*x),
                         runtime::Arg::ndarray(*y)};
  auto base = rt.stats()->retirement;
  const runtime::FlushProfile base_profile = rt.stats()->flush_profile;
  RunResult r{load, policy_name(policy), depth, flushes, 0, 0, 0, 0, {}};
  int sample_every = std::max(1, flushes / 400);
  double t0 = now_us();
  for (int i = 0; i < flushes; ++i) {
    if (host_us > 0) {
      // Simulated host work: a busy loop, as an interpreter would keep the core busy.
      for (double until = now_us() + host_us; now_us() < until;) {
      }
    }
    double a = now_us();
    Status s = rt.upload(*scratch, host.data(), scratch_n * 4);
    double b = now_us();
    if (s.ok()) s = rt.launch(*k, args);
    double c = now_us();
    if (s.ok()) s = rt.flush().status();
    double d = now_us();
    r.upload_us += b - a;
    r.launch_us += c - b;
    r.flush_us += d - c;
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.to_string().c_str());
      std::exit(1);
    }
    if (i % sample_every == 0) r.bytes_trace.push_back(rt.stats()->retirement.bytes);
  }
  // The loop's profile, before the final synchronize (whose drain is in the wall time only).
  {
    const runtime::FlushProfile p = rt.stats()->flush_profile;
    r.profile.flushes = p.flushes - base_profile.flushes;
    r.profile.begin_us = p.begin_us - base_profile.begin_us;
    r.profile.submit_us = p.submit_us - base_profile.submit_us;
    r.profile.poll_us = p.poll_us - base_profile.poll_us;
    r.profile.release_us = p.release_us - base_profile.release_us;
    r.profile.recycle_us = p.recycle_us - base_profile.recycle_us;
  }
  (void)rt.synchronize();
  r.seconds = (now_us() - t0) / 1e6;
  auto c = rt.stats()->retirement;
  r.blocked_ms = (c.forced_wait_us - base.forced_wait_us) / 1000;
  r.forced_waits = c.forced_waits - base.forced_waits;
  r.high_water_bytes = c.high_water_bytes;
  // The outputs after timing: y is y0 plus `flushes` additions of a * x, computed here in the
  // same f32 order for every 16th element (exactly equal: one launch skipped or doubled shows),
  // and within the bound of one rounding of |y| per addition for the rest; the scratch array
  // holds the last upload.
  const double f = flushes;
  check_close(
      load + " / " + r.policy + ": axpy's y", download_or_fail<float>(rt, *y, n, "y"),
      [&](size_t i) {
        return i % 16 == 0 ? repeated_add(y0[i], kA * x0[i], flushes) : y0[i] + f * kA * x0[i];
      },
      [&](size_t i) {
        return i % 16 == 0 ? 0.0 : (std::fabs(y0[i]) + f * kA * x0[i]) * (f + 1) * 0x1p-23;
      });
  if (download_or_fail<float>(rt, *scratch, scratch_n, "scratch") != host)
    check_failed(load + " / " + r.policy + ": the uploaded scratch array differs from the upload");
  return r;
}

void write_svg(const std::string& path, const std::vector<RunResult>& runs) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return;
  const int W = 900, H = 420, L = 70, B = 40;
  uint64_t max_bytes = 1;
  for (const auto& r : runs) {
    for (uint64_t b : r.bytes_trace) max_bytes = std::max(max_bytes, b);
  }
  std::fprintf(f,
               "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' "
               "font-family='sans-serif' font-size='11'>\n<rect width='100%%' height='100%%' "
               "fill='white'/>\n",
               W, H + 140);
  std::fprintf(f,
               "<text x='%d' y='16' font-size='13'>bytes held for retirement over the run "
               "(load: keeps up, depth 3 and hold-until-sync); max %.1f MiB</text>\n",
               L, max_bytes / 1048576.0);
  std::fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='black'/>\n", L, H - B, W - 10,
               H - B);
  std::fprintf(f, "<line x1='%d' y1='30' x2='%d' y2='%d' stroke='black'/>\n", L, L, H - B);
  const char* colors[] = {"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
  int ci = 0, legend_y = H + 10;
  for (const auto& r : runs) {
    if (r.bytes_trace.size() < 2) continue;
    const char* col = colors[ci++ % 6];
    std::fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1.5' points='", col);
    for (size_t i = 0; i < r.bytes_trace.size(); ++i) {
      double px = L + (W - 10 - L) * static_cast<double>(i) / (r.bytes_trace.size() - 1);
      double py = (H - B) - (H - B - 30) * static_cast<double>(r.bytes_trace[i]) / max_bytes;
      std::fprintf(f, "%.1f,%.1f ", px, py);
    }
    std::fprintf(f, "'/>\n<text x='%d' y='%d' fill='%s'>%s, depth %zu: peak %.2f MiB</text>\n", L,
                 legend_y, col, r.policy.c_str(), r.depth, r.high_water_bytes / 1048576.0);
    legend_y += 16;
  }
  std::fprintf(f, "<text x='%d' y='%d'>flush index →</text></svg>\n", W / 2, H - 10);
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is printed, also into a pipe or file
  Args args(argc, argv,
            "usage: vkad-bench-retirement [--device D] [--flushes F] [--bytes B] [--host-us U]\n"
            "                             [--json F] [--svg F]\n"
            "  retirement policies (per-entry polling at depths 1/3/8, hold-until-sync,\n"
            "  full drain) under a back-to-back load and a paced load\n"
            "  --device D   device index or name substring (default: automatic)\n"
            "  --flushes F  flushes per run (default 20000)\n"
            "  --bytes B    ctx-buffer bytes per flush (default 16384)\n"
            "  --host-us U  simulated host work per flush in the paced load (default 30)\n"
            "  --depths L   retirement depths of the per-entry and full-drain runs, comma-\n"
            "               separated (default 1,3,8)\n"
            "  --json F     write the results as JSON to F\n"
            "  --svg F      plot bytes held over time to F\n",
            {"device", "flushes", "bytes", "host-us", "depths", "json", "svg"});
  std::string device = args.get("device", "");
  int flushes = static_cast<int>(args.get_int("flushes", 20000));
  uint64_t bytes = static_cast<uint64_t>(args.get_int("bytes", 16384));
  double host_us = static_cast<double>(args.get_int("host-us", 30));
  std::vector<size_t> depths;
  for (std::string rest = args.get("depths", "1,3,8"); !rest.empty();) {
    const size_t comma = rest.find(',');
    depths.push_back(static_cast<size_t>(std::stoul(rest.substr(0, comma))));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  std::string device_name;
  bool cpu = false;
  {
    rhi::DeviceOptions o;
    o.device = device;
    auto d = rhi::Device::create(o);
    if (!d.ok()) {
      std::fprintf(stderr, "%s\n", d.status().to_string().c_str());
      return 1;
    }
    device_name = (*d)->caps().device_name;
    cpu = (*d)->caps().kind == rhi::DeviceKind::kCpu;
  }
  std::printf("device: %s; per flush: one axpy launch + %llu bytes of ctx buffers\n",
              device_name.c_str(), (unsigned long long)bytes);
  struct Load {
    const char* name;
    uint32_t n;
    int flushes;
    double host_us;
  };
  Load loads[] = {
      {"keeps up", 1024, flushes, 0},
      {"paced", 1024, flushes, host_us},
      {"behind", cpu ? (1u << 18) : (1u << 22), std::max(50, flushes / (cpu ? 40 : 10)), 0}};
  std::vector<RunResult> results, plotted;
  JsonRecords json;
  std::printf("paced load: %.0f us of host work per flush\n", host_us);
  std::printf("%-9s %-26s %5s %8s %10s %12s %14s %12s\n", "load", "policy", "depth", "flushes",
              "blocked ms", "forced waits", "peak held KiB", "flushes/s");
  for (const Load& load : loads) {
    double floor_rate = 0;
    for (auto policy :
         {runtime::RetirementPolicy::kHoldUntilSync, runtime::RetirementPolicy::kFullDrainWhenFull,
          runtime::RetirementPolicy::kPerEntryPolling}) {
      for (size_t i = 0; i < depths.size(); ++i) {
        // Hold-until-synchronize has no depth: run once.
        if (policy == runtime::RetirementPolicy::kHoldUntilSync && i > 0) continue;
        const size_t depth = depths[i];
        // The paced load asks one question (does per-entry polling force waits when the host
        // is the slower side?); the baselines there add run time, not information.
        if (load.host_us > 0 && policy != runtime::RetirementPolicy::kPerEntryPolling) continue;
        RunResult r =
            run(device, policy, depth, load.n, load.flushes, bytes, load.host_us, load.name);
        double rate = r.flushes / r.seconds;
        if (policy == runtime::RetirementPolicy::kHoldUntilSync) floor_rate = rate;
        std::printf(
            "%-9s %-26s %5s %8d %10.1f %12llu %14.1f %12.0f", r.load.c_str(), r.policy.c_str(),
            policy == runtime::RetirementPolicy::kHoldUntilSync ? "-"
                                                                : std::to_string(depth).c_str(),
            r.flushes, r.blocked_ms, (unsigned long long)r.forced_waits,
            r.high_water_bytes / 1024.0, rate);
        if (policy == runtime::RetirementPolicy::kPerEntryPolling && floor_rate > 0) {
          std::printf("   (floor/ours time %.3fx)", floor_rate / rate);
        }
        std::printf("\n");
        json.begin();
        json.field("load", r.load);
        json.field("host_us_per_flush", load.host_us);
        json.field("policy", r.policy);
        json.field("depth", static_cast<double>(depth));
        json.field("flushes", r.flushes);
        json.field("blocked_ms", r.blocked_ms);
        json.field("forced_waits", static_cast<double>(r.forced_waits));
        json.field("high_water_bytes", static_cast<double>(r.high_water_bytes));
        json.field("flushes_per_s", rate);
        if (load.n == 1024 && depth == 3) plotted.push_back(r);
        results.push_back(std::move(r));
      }
    }
  }
  // Where each run's host time per flush went. upload and launch are the benchmark's own clocks
  // around those calls, less the list opening inside the upload ("begin": the stream recycles
  // its pools and begins a command buffer); submit (end + vkQueueSubmit and its semaphore
  // signal), poll (the retirement queue's push: semaphore polls and forced waits), release
  // (retired payloads: error words read, ring chunks pooled, buffers to the deleter) and
  // recycle (the stream's pools and the deferred deleter after the submit) are the runtime's
  // flush profile; "other" is the rest of flush(). The last column is the run's wall time per
  // flush, the final synchronize included (hold-until-synchronize releases everything there).
  std::printf("\nhost us per flush by phase\n%-9s %-26s %5s %7s %7s %7s %7s %7s %7s %7s %7s %7s\n",
              "load", "policy", "depth", "begin", "upload", "launch", "submit", "poll", "release",
              "recycle", "other", "wall");
  for (const RunResult& r : results) {
    const runtime::FlushProfile& p = r.profile;
    const double f = r.flushes;
    const double flush_other = r.flush_us - p.submit_us - p.poll_us - p.release_us - p.recycle_us;
    const bool hold = r.policy == policy_name(runtime::RetirementPolicy::kHoldUntilSync);
    std::printf("%-9s %-26s %5s %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f\n",
                r.load.c_str(), r.policy.c_str(), hold ? "-" : std::to_string(r.depth).c_str(),
                p.begin_us / f, (r.upload_us - p.begin_us) / f, r.launch_us / f, p.submit_us / f,
                p.poll_us / f, p.release_us / f, p.recycle_us / f, flush_other / f,
                r.seconds * 1e6 / f);
    json.begin();
    json.field("breakdown_load", r.load);
    json.field("policy", r.policy);
    json.field("depth", static_cast<double>(r.depth));
    json.field("begin_us", p.begin_us / f);
    json.field("upload_us", (r.upload_us - p.begin_us) / f);
    json.field("launch_us", r.launch_us / f);
    json.field("submit_us", p.submit_us / f);
    json.field("poll_us", p.poll_us / f);
    json.field("release_us", p.release_us / f);
    json.field("recycle_us", p.recycle_us / f);
    json.field("flush_other_us", flush_other / f);
    json.field("wall_us", r.seconds * 1e6 / f);
  }
  std::printf("outputs checked after every run (axpy's y, the uploaded scratch array)\n");
  if (args.has("json")) json.write(args.get("json", ""), device_name);
  if (args.has("svg")) write_svg(args.get("svg", ""), plotted);
  return 0;
}
