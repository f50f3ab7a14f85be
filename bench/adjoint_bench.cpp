// vkad-bench-adjoint: a reverse-mode kernel over N elements whose per-element loop runs L
// iterations of a nonlinear update (v <- 0.5 v + 0.25 sin(v) * w). Reports forward and adjoint
// device time and the adstack bytes the adjoint moves as a fraction of the copy bandwidth
// measured in the same run (a generated copy kernel over 2 N floats) on the same seeded random
// data; a figure above the copy is flagged (bench_util.h). y and the gradients are checked
// after timing against the recurrence and its reverse sweep in double (a wrong result exits 3).
//
//   vkad-bench-adjoint [--n ELEMENTS (default 2^24)] [--json FILE]
#include <cmath>
#include <cstdio>

#include "api/device_target.h"
#include "autodiff/reverse_mode.h"
#include "bench/bench_runtime.h"
#include "bench/bench_util.h"
#include "ir/builder.h"
#include "runtime/runtime.h"
#include "spirv/compiler.h"

using namespace vkad;
using namespace vkad::codegen;
using bench::now_us;

namespace {

Kernel recurrence() {
  KernelBuilder kb("recurrence");
  Scalar steps = kb.scalar("steps", DType::kI32);
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array w = kb.ndarray("w", DType::kF32, 1, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Local v = kb.local(x(i));
    Value wi = w(i);
    kb.for_range(kb.i32(0), steps,
                 [&](Value) { v.store(v.load() * 0.5 + sin(v.load()) * wi * 0.25); });
    y.store({i}, v.load());
  });
  return kb.finish();
}

Kernel copy_kernel() {
  KernelBuilder kb("copy");
  Array x = kb.ndarray("x", DType::kF32, 1, {.read_only = true});
  Array y = kb.ndarray("y", DType::kF32, 1);
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) { y.store({i}, x(i)); });
  return kb.finish();
}

// Milliseconds per launch: median over `reps` batches of `batch` launches (the first, extra
// batch warms up).
double time_ms(runtime::Runtime& rt, runtime::KernelHandle h, const std::vector<runtime::Arg>& a,
               int reps, int batch = 4) {
  std::vector<double> v;
  for (int r = 0; r <= reps; ++r) {
    double m = bench::batch_ms(rt, h, a, batch);
    if (r) v.push_back(m);
  }
  return bench::median(v);
}

// y after the forward: the recurrence in double for every 256th element, to f32 precision.
void check_forward(runtime::Runtime& rt, runtime::NdArrayHandle y, const std::vector<float>& x0,
                   const std::vector<float>& w0, int L) {
  std::vector<float> got = bench::download_or_fail<float>(rt, y, x0.size(), "y");
  for (size_t i = 0; i < got.size(); i += 256) {
    double v = x0[i];
    for (int k = 0; k < L; ++k) v = 0.5 * v + 0.25 * std::sin(v) * w0[i];
    if (!(std::fabs(got[i] - v) <= 1e-4 * (1 + std::fabs(v)))) {
      bench::check_failed("forward L = " + std::to_string(L) + ": y[" + std::to_string(i) +
                          "] = " + std::to_string(got[i]) + ", expected " + std::to_string(v));
    }
  }
}

// x_grad and w_grad after `launches` adjoint launches at each of L = 16, 64, 256 (they add):
// reverse mode by hand in double for every 256th element, to 1e-3 relative.
void check_gradients(runtime::Runtime& rt, runtime::NdArrayHandle xg, runtime::NdArrayHandle wg,
                     const std::vector<float>& x0, const std::vector<float>& w0,
                     const std::vector<float>& yg0, int launches) {
  std::vector<float> gx = bench::download_or_fail<float>(rt, xg, x0.size(), "x_grad"),
                     gw = bench::download_or_fail<float>(rt, wg, x0.size(), "w_grad");
  for (size_t i = 0; i < x0.size(); i += 256) {
    double want_x = 0, want_w = 0, scale = 0;
    for (int L : {16, 64, 256}) {
      std::vector<double> v(L + 1);
      v[0] = x0[i];
      for (int k = 0; k < L; ++k) v[k + 1] = 0.5 * v[k] + 0.25 * std::sin(v[k]) * w0[i];
      double a = yg0[i], aw = 0;
      for (int k = L - 1; k >= 0; --k) {
        aw += a * 0.25 * std::sin(v[k]);
        a *= 0.5 + 0.25 * std::cos(v[k]) * w0[i];
      }
      want_x += launches * a;
      want_w += launches * aw;
      scale += launches * std::fabs(yg0[i]);
    }
    auto near = [&](double got, double want) {
      return std::fabs(got - want) <= 1e-3 * (std::fabs(want) + 1e-3 * scale);
    };
    if (!near(gx[i], want_x) || !near(gw[i], want_w)) {
      bench::check_failed("adjoint: x_grad[" + std::to_string(i) + "] = " + std::to_string(gx[i]) +
                          " (expected " + std::to_string(want_x) + "), w_grad = " +
                          std::to_string(gw[i]) + " (expected " + std::to_string(want_w) + ")");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is printed, also into a pipe or file
  bench::Args args(argc, argv,
                   "usage: vkad-bench-adjoint [--n N] [--reps R] [--json F]\n"
                   "  forward and generated adjoint of the recurrence v <- 0.5v + 0.25 sin(v) w\n"
                   "  over L = 16, 64, 256 steps, against copy bandwidth\n"
                   "  --n N     elements (default 2^24)\n"
                   "  --reps R  repetitions, median reported (default 3)\n"
                   "  --json F  also write the results as JSON to F\n",
                   {"n", "reps", "json"});
  uint32_t n = static_cast<uint32_t>(args.get_int("n", 1 << 24));
  int reps = static_cast<int>(args.get_int("reps", 3));
  auto rt_r = runtime::Runtime::create();
  if (!rt_r.ok()) {
    std::fprintf(stderr, "%s\n", rt_r.status().to_string().c_str());
    return 1;
  }
  runtime::Runtime& rt = **rt_r;
  Target target = target_from_caps(rt.caps());
  Kernel fwd = recurrence();
  Kernel adj = make_adjoint(fwd, target).value();
  auto hf = rt.register_kernel(compile(fwd, target).value()).value();
  auto ha = rt.register_kernel(compile(adj, target).value()).value();
  auto hc = rt.register_kernel(compile(copy_kernel(), target).value()).value();
  // Seeded random inputs (bench_util.h); the gradients start at zero and accumulate.
  auto arr = [&](const char* name, const std::vector<float>& init) {
    auto h = rt.create_ndarray(runtime::DType::kF32, {n}, name).value();
    if (!rt.upload(h, init.data(), 4ull * n).ok())
      bench::check_failed("uploading " + std::string(name));
    return h;
  };
  const std::vector<float> x0 = bench::random_floats(n, 1),
                           w0 = bench::random_floats(n, 2, 0.5f, 1.5f),
                           yg0 = bench::random_floats(n, 3), zeros(n, 0.0f);
  auto x = arr("x", x0), w = arr("w", w0), y = arr("y", zeros), xg = arr("x_grad", zeros),
       wg = arr("w_grad", zeros), yg = arr("y_grad", yg0);
  // A GPU raises its clocks only under sustained load: ~300 ms of copies first, so the copy
  // (timed first) is not measured at idle clocks (H200: 512 GB/s cold).
  bench::warm_up(rt, hc, {runtime::Arg::ndarray(x), runtime::Arg::ndarray(y)}, 300);
  double copy_ms = time_ms(rt, hc, {runtime::Arg::ndarray(x), runtime::Arg::ndarray(y)}, reps, 20);
  double copy_gbs = 8.0 * n / (copy_ms * 1e6);
  if (bench::download_or_fail<float>(rt, y, n, "copy output") != x0)
    bench::check_failed("the copy's output differs from its input");
  std::printf("device: %s; %u elements; copy %.3f ms = %.1f GB/s\n", rt.caps().device_name.c_str(),
              n, copy_ms, copy_gbs);
  std::printf("%6s %12s %12s %14s %16s %10s\n", "L", "forward ms", "adjoint ms", "traffic MB",
              "adjoint GB/s", "vs copy");
  bench::JsonRecords json;
  // The adjoint launches per L (time_ms: reps + 1 batches of 4): x_grad and w_grad sum them.
  const int adjoint_launches = 4 * (reps + 1);
  for (int L : {16, 64, 256}) {
    std::vector<runtime::Arg> fa = {runtime::Arg::i32(L), runtime::Arg::ndarray(x),
                                    runtime::Arg::ndarray(w), runtime::Arg::ndarray(y)};
    std::vector<runtime::Arg> aa = fa;
    for (auto g : {xg, wg, yg}) aa.push_back(runtime::Arg::ndarray(g));
    double f = time_ms(rt, hf, fa, reps), a = time_ms(rt, ha, aa, reps);
    check_forward(rt, y, x0, w0, L);
    // Modelled traffic (what the adjoint would move if every push and pop reached memory; a
    // GPU's caches absorb part of it, so "vs copy" can pass 100%) per element and iteration: push
    // writes the primal (4 B; the stack has no adjoint block), the reverse sweep reads it back (4
    // B). Plus the arrays: 3 reads + 3 gradient writes of 4 B per element.
    double bytes = double(n) * (8.0 * L + 24.0);
    double gbs = bytes / (a * 1e6);
    bench::BandwidthNote note = bench::bandwidth_note(gbs, copy_gbs);
    std::printf("%6d %12.3f %12.3f %14.1f %16.1f  %s\n", L, f, a, bytes / 1e6, gbs,
                note.text.c_str());
    json.begin();
    json.field("L", L);
    json.field("forward_ms", f);
    json.field("adjoint_ms", a);
    json.field("modelled_traffic_bytes", bytes);
    json.field("fraction_of_copy_bandwidth", note.fraction_of_copy);
    json.field("above_copy", note.above_copy ? 1 : 0);
  }
  check_gradients(rt, xg, wg, x0, w0, yg0, adjoint_launches);
  std::printf("inputs: seeded random; y and the accumulated gradients checked after timing\n");
  std::printf("adstack heap: %llu bytes (rows capped to fit one binding)\n",
              (unsigned long long)rt.stats()->adstack_heap_bytes);
  if (args.has("json")) json.write(args.get("json", ""), rt.caps().device_name);
  return 0;
}
