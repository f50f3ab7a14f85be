// Launch overhead through the front door (vkad::Session), the C++ figure beside
// bench/python_launch.py (the same kernel and loop from Python):
//
//   vkad-bench-launch [--launches N] [--reps R] [--n ELEMENTS] [--device D] [--json out.json]
//                     [--kernel FILE (default: bench/launch_kernel.vkir, embedded at build time)]
//                     [--capture 1 [--arrays A]]
//
// Per rep: N launches of a tiny kernel (x[i] += 1 over ELEMENTS elements, each launch depending
// on the previous one) recorded back to back, then synchronize(). Reports the median over reps
// of µs per launch for recording alone (launch() returning) and for the whole batch including
// the wait. The kernel text is bench/launch_kernel.vkir, shared with the Python benchmark. The
// array starts as seeded random data; after timing it is checked exactly against the same f32
// additions made here (a wrong result exits 3).
// --capture 1: the N launches are captured into a graph instead (begin_capture ... end_capture,
// no graph passes, so end_capture does no rework) and replayed once; reports the
// median ns per captured launch (launch() returning) and the end_capture per launch. --arrays A
// (with --capture) launches a kernel of an i32, an f32 and A ndarray parameters instead (a
// DiffTaichi adjoint's width: its cost grows with the parameters), every array argument x.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "launch_kernel.h"
#include "vkad.h"

namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int die(const char* what, const vkad::Status& s) {
  std::fprintf(stderr, "vkad-bench-launch: %s: %s\n", what, s.to_string().c_str());
  return 1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// --capture: ns per captured launch (Session::launch between begin_capture and end_capture).
int capture_bench(vkad::Session& s, vkad::KernelHandle k, std::span<const vkad::Arg> args,
                  int launches, int reps, uint32_t n) {
  std::vector<double> record, end;
  vkad::Status st;
  for (int r = 0; r <= reps; ++r) {  // rep 0 warms up
    if (!(st = s.begin_capture("capture bench")).ok()) return die("begin_capture", st);
    double t0 = now_us();
    for (int i = 0; i < launches; ++i) {
      if (!(st = s.launch(k, args)).ok()) return die("launch", st);
    }
    double t1 = now_us();
    auto g = s.end_capture();
    if (!g.ok()) return die("end_capture", g.status());
    double t2 = now_us();
    if (r == reps && !(st = s.replay(*g)).ok()) return die("replay", st);
    if (!(st = s.release_graph(*g)).ok()) return die("release_graph", st);
    if (r > 0)
      record.push_back((t1 - t0) * 1e3 / launches), end.push_back((t2 - t1) * 1e3 / launches);
  }
  if (!(st = s.synchronize()).ok()) return die("synchronize", st);
  std::printf("device: %s\n", s.device_name().c_str());
  std::printf("C++ vkad::Session::launch captured, %d launches x %d reps, %u elements:\n", launches,
              reps, n);
  std::printf("  capture       %.0f ns/launch\n  end_capture   %.0f ns/launch\n", median(record),
              median(end));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is printed, also into a pipe or file
  vkad::bench::Args cli(
      argc, argv,
      "usage: vkad-bench-launch [--launches N] [--reps R] [--n ELEMENTS] [--device D] [--json F]\n"
      "                         [--kernel FILE] [--capture 1 [--arrays A]]\n"
      "  host cost of Session::launch: N dependent launches of a tiny kernel recorded back to\n"
      "  back, then synchronize; median over R reps of us per launch\n"
      "  --launches N  launches per rep (default 500)\n"
      "  --reps R      reps after one warm-up rep (default 15)\n"
      "  --n ELEMENTS  elements of the kernel's array (default 64)\n"
      "  --device D    device index or name substring (default: automatic)\n"
      "  --json F      also write the results as JSON to F\n"
      "  --kernel FILE the kernel text (default: bench/launch_kernel.vkir, embedded); another\n"
      "                kernel's output is not checked\n"
      "  --capture 1   capture the launches into a graph instead; ns per captured launch\n"
      "  --arrays A    with --capture: a kernel of an i32, an f32 and A ndarray parameters\n",
      {"launches", "reps", "n", "json", "device", "kernel", "capture", "arrays"});
  const int launches = static_cast<int>(cli.get_int("launches", 500));
  const int reps = static_cast<int>(cli.get_int("reps", 15));
  const bool capture = cli.get_int("capture", 0) != 0;
  const int arrays = static_cast<int>(cli.get_int("arrays", 0));
  const uint32_t n = static_cast<uint32_t>(cli.get_int("n", 64));
  // empty kernel: the embedded bench/launch_kernel.vkir
  const std::string json = cli.get("json", ""), device = cli.get("device", ""),
                    kernel = cli.get("kernel", "");
  std::stringstream text;
  if (arrays > 0) {
    // wide(t, a, x0 .. x{A-1}): x0[i] += a + x1[i] + ... (every argument is x).
    text << "kernel wide(t: i32, a: f32";
    for (int i = 0; i < arrays; ++i) text << ", x" << i << ": ndarray<f32, 1>";
    text << ") {\n  task main parallel %0 in [0, shape(x0, 0)) {\n    %1 = arg a : f32\n";
    int v = 1;
    for (int i = 0; i < arrays; ++i, v += 2) {
      text << "    %" << v + 1 << " = load x" << i << "[%0] : f32\n";
      text << "    %" << v + 2 << " = add %" << v << ", %" << v + 1 << " : f32\n";
    }
    text << "    store x0[%0], %" << v << "\n  }\n}\n";
  } else if (kernel.empty()) {
    text << kLaunchKernelText;
  } else {
    std::ifstream f(kernel);
    if (!f) {
      std::fprintf(stderr, "vkad-bench-launch: cannot read %s\n", kernel.c_str());
      return 1;
    }
    text << f.rdbuf();
  }
  vkad::SessionOptions options;
  options.device = device;
  if (capture) options.graph_passes = "none";
  auto session = vkad::Session::create(options);
  if (!session.ok()) return die("session", session.status());
  vkad::Session& s = **session;
  auto k = s.compile(text.str());
  if (!k.ok()) return die("compile", k.status());
  auto x = s.ndarray(vkad::DType::kF32, {n}, "x");
  if (!x.ok()) return die("ndarray", x.status());
  // Seeded random data, checked after timing (bench_util.h).
  const std::vector<float> x0 = vkad::bench::random_floats(n, 1);
  vkad::Status st = s.upload(*x, std::span<const float>(x0));
  if (!st.ok()) return die("upload", st);
  std::vector<vkad::Arg> args = {vkad::Arg::f32(1.0f), vkad::Arg::ndarray(*x)};
  if (arrays > 0) {
    if (!capture) {
      std::fprintf(stderr, "vkad-bench-launch: --arrays needs --capture 1\n");
      return 1;
    }
    args = {vkad::Arg::i32(0), vkad::Arg::f32(1.0f)};
    args.resize(2 + arrays, vkad::Arg::ndarray(*x));
  }
  // What x must hold after `count` launches (the embedded kernel: x += 1; --arrays: x = 1 + x
  // + ... + x, added in that order), exactly: the same f32 additions in the same order.
  auto check = [&](long count) {
    if (!kernel.empty()) return 0;  // a kernel of the user's: nothing to hold it to
    std::vector<float> got(n);
    vkad::Status d = s.download(*x, std::span<float>(got));
    if (!d.ok()) return die("download", d);
    for (uint32_t i = 0; i < n; ++i) {
      float want = x0[i];
      if (arrays == 0) {
        want = vkad::bench::repeated_add(want, 1.0f, count);
      } else {
        for (long c = 0; c < count; ++c) {
          float v = 1.0f;
          for (int j = 0; j < arrays; ++j) v += want;
          want = v;
        }
      }
      if (!(got[i] == want || (std::isnan(got[i]) && std::isnan(want)))) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "x[%u] = %.9g after %ld launches, expected %.9g", i, got[i],
                      count, want);
        vkad::bench::check_failed(buf);
      }
    }
    return 0;
  };
  std::vector<double> record, total;
  if (capture) {
    int rc = capture_bench(s, *k, args, launches, reps, n);
    return rc ? rc : check(launches);  // the last rep's graph was replayed once
  }
  for (int r = 0; r <= reps; ++r) {  // rep 0 warms up
    double t0 = now_us();
    for (int i = 0; i < launches; ++i) {
      if (!(st = s.launch(*k, args)).ok()) return die("launch", st);
    }
    double t1 = now_us();
    if (!(st = s.synchronize()).ok()) return die("synchronize", st);
    double t2 = now_us();
    if (r > 0) record.push_back((t1 - t0) / launches), total.push_back((t2 - t0) / launches);
  }
  if (int rc = check(static_cast<long>(launches) * (reps + 1))) return rc;
  std::printf("device: %s\n", s.device_name().c_str());
  std::printf("C++ vkad::Session::launch, %d launches x %d reps, %u elements:\n", launches, reps,
              n);
  std::printf("  record only   %.2f us/launch\n  with the wait %.2f us/launch\n", median(record),
              median(total));
  if (!json.empty()) {
    std::ofstream o(json);
    o << "{\"device\": \"" << s.device_name() << "\", \"record_us\": " << median(record)
      << ", \"total_us\": " << median(total) << "}\n";
  }
  return 0;
}
