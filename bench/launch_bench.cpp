// Launch overhead through the front door (vkad::Session), the C++ figure beside
// bench/python_launch.py (the same kernel and loop from Python):
//
//   vkad-bench-launch [--launches N] [--reps R] [--n ELEMENTS] [--device D] [--json out.json]
//                     [--kernel FILE (default: bench/launch_kernel.vkir, embedded at build time)]
//
// Per rep: N launches of a tiny kernel (x[i] += 1 over ELEMENTS elements, each launch depending
// on the previous one) recorded back to back, then synchronize(). Reports the median over reps
// of µs per launch for recording alone (launch() returning) and for the whole batch including
// the wait. The kernel text is bench/launch_kernel.vkir, shared with the Python benchmark.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
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

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is printed, also into a pipe or file
  int launches = 500, reps = 15;
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
  }
  std::stringstream text;
  if (kernel.empty()) {
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
  auto session = vkad::Session::create(options);
  if (!session.ok()) return die("session", session.status());
  vkad::Session& s = **session;
  auto k = s.compile(text.str());
  if (!k.ok()) return die("compile", k.status());
  auto x = s.ndarray(vkad::DType::kF32, {n}, "x");
  if (!x.ok()) return die("ndarray", x.status());
  vkad::Status st = s.zero(*x);
  if (!st.ok()) return die("zero", st);
  const vkad::Arg args[] = {vkad::Arg::f32(1.0f), vkad::Arg::ndarray(*x)};
  std::vector<double> record, total;
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
