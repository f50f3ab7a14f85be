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
// the wait. The kernel text is bench/launch_kernel.vkir, shared with the Python benchmark.
// --capture 1: the N launches are captured into a graph instead (begin_capture ... end_capture,
// graph fusion and scheduling off, so end_capture does no rework) and replayed once; reports the
// median ns per captured launch (launch() returning) and the end_capture per launch. --arrays A
// (with --capture) launches a kernel of an i32, an f32 and A ndarray parameters instead (a
// DiffTaichi adjoint's width: its cost grows with the parameters), every array argument x.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

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
  int launches = 500, reps = 15;
  bool capture = false;
  int arrays = 0;
  uint32_t n = 64;
  std::string json, device, kernel;  // empty: the embedded bench/launch_kernel.vkir
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--launches")
      launches = std::atoi(argv[i + 1]);
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (a == "--n")
      n = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    else if (a == "--json")
      json = argv[i + 1];
    else if (a == "--device")
      device = argv[i + 1];
    else if (a == "--kernel")
      kernel = argv[i + 1];
    else if (a == "--capture")
      capture = std::atoi(argv[i + 1]) != 0;
    else if (a == "--arrays")
      arrays = std::atoi(argv[i + 1]);
  }
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
  if (capture) options.fuse_graph_launches = options.schedule_graph_launches = false;
  auto session = vkad::Session::create(options);
  if (!session.ok()) return die("session", session.status());
  vkad::Session& s = **session;
  auto k = s.compile(text.str());
  if (!k.ok()) return die("compile", k.status());
  auto x = s.ndarray(vkad::DType::kF32, {n}, "x");
  if (!x.ok()) return die("ndarray", x.status());
  vkad::Status st = s.zero(*x);
  if (!st.ok()) return die("zero", st);
  std::vector<vkad::Arg> args = {vkad::Arg::f32(1.0f), vkad::Arg::ndarray(*x)};
  if (arrays > 0) {
    if (!capture) {
      std::fprintf(stderr, "vkad-bench-launch: --arrays needs --capture 1\n");
      return 1;
    }
    args = {vkad::Arg::i32(0), vkad::Arg::f32(1.0f)};
    args.resize(2 + arrays, vkad::Arg::ndarray(*x));
  }
  std::vector<double> record, total;
  if (capture) return capture_bench(s, *k, args, launches, reps, n);
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
  std::vector<float> host(n);
  if (!(st = s.download(*x, std::span<float>(host))).ok()) return die("download", st);
  if (host[0] != static_cast<float>(launches * (reps + 1))) {
    std::fprintf(stderr, "vkad-bench-launch: x[0] = %g, expected %d\n", host[0],
                 launches * (reps + 1));
    return 1;
  }
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
