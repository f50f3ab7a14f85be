// vkad-bench-counted: what exact adstack sizing without max_trip costs. A reverse-mode kernel
// whose per-element while loop runs a data-dependent number of trips ("while v^2 > eps:
// acc += v sin(v) w; v *= 0.5", x spread so trips range 1..T), differentiated twice: with a
// stated max_trip (the bound a user would guess) and counted (codegen::make_adjoint_counted).
// Reports the forward, the counting kernel alone (as target_from_caps lowers it, and with the
// other lowering of its atomic_max: combined per subgroup or per thread), the counting forward
// (the forward recording the counts itself: make_adjoint_counted's counting_forward) and what
// counting costs that way (counting forward - forward, timed interleaved with the forward so that
// drift on a shared machine hits both alike), the adjoint (each sized its way), launch_counted end
// to end (counter, blocking readback, adjoint) after a forward and the forward-counted pair
// (launch_forward_counted, launch_counted_adjoint) in its place, and the heap bytes.
//
//   vkad-bench-counted [--n ELEMENTS (default 2^22)] [--max-trip M (default 64)] [--reps R] [--json
//   F]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <tuple>

#include "api/device_target.h"
#include "autodiff/reverse_mode.h"
#include "bench/bench_runtime.h"
#include "bench/bench_util.h"
#include "ir/builder.h"
#include "runtime/counted_launch.h"
#include "runtime/runtime.h"
#include "spirv/compiler.h"

using namespace vkad;
using namespace vkad::codegen;
using bench::now_us;

namespace {

Kernel halving(int64_t max_trip) {
  KernelBuilder kb("halving");
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array w = kb.ndarray("w", DType::kF32, 1, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Local v = kb.local(x(i));
    Local acc = kb.local(DType::kF32);
    Value wi = w(i);
    auto cond = [&] { return v.load() * v.load() > 1e-4; };
    auto body = [&] {
      acc.store(acc.load() + v.load() * sin(v.load()) * wi);
      v.store(v.load() * 0.5);
    };
    if (max_trip > 0)
      kb.while_(cond, SizeExpr::constant(max_trip), body);
    else
      kb.while_(cond, body);
    y.store({i}, acc.load() + v.load());
  });
  return kb.finish();
}

double time_ms(const std::function<double()>& one, int reps) {
  std::vector<double> v;
  for (int r = 0; r <= reps; ++r) {
    double m = one();
    if (r) v.push_back(m);
  }
  return bench::median(v);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is printed, also into a pipe or file
  bench::Args args(argc, argv,
                   "usage: vkad-bench-counted [--n N] [--max-trip M] [--reps R] [--json F]\n"
                   "  cost of counting a while loop's trips for exact adstack sizing, against\n"
                   "  the adjoint itself and a stated max_trip\n"
                   "  --n N         elements (default 2^22)\n"
                   "  --max-trip M  the stated bound compared against (default 64)\n"
                   "  --reps R      repetitions, median reported (default 5)\n"
                   "  --json F      also write the results as JSON to F\n",
                   {"n", "max-trip", "reps", "json"});
  uint32_t n = static_cast<uint32_t>(args.get_int("n", 1 << 22));
  int64_t max_trip = args.get_int("max-trip", 64);
  int reps = static_cast<int>(args.get_int("reps", 5));
  auto rt_r = runtime::Runtime::create();
  if (!rt_r.ok()) {
    std::fprintf(stderr, "%s\n", rt_r.status().to_string().c_str());
    return 1;
  }
  runtime::Runtime& rt = **rt_r;
  Target target = target_from_caps(rt.caps());
  Kernel fwd = halving(0);
  Kernel stated = make_adjoint(halving(max_trip), target).value();
  CountedAdjoint ca = make_adjoint_counted(fwd, target).value();
  auto hf = rt.register_kernel(compile(fwd, target).value()).value();
  auto hs = rt.register_kernel(compile(stated, target).value()).value();
  auto ha = rt.register_kernel(compile(ca.adjoint, target).value()).value();
  auto hc = rt.register_kernel(compile(ca.counter, target).value()).value();
  auto hcf = rt.register_kernel(compile(ca.counting_forward, target).value()).value();
  // The other lowering of the counting kernel's atomic_max, timed beside the one target_from_caps
  // chose (issue 27): per thread (every thread its own atomic_max, neighbours spread over the
  // words: all there was before) where the target combines them over subgroups, combined where
  // the device has subgroup arithmetic but the target leaves it off (CPU devices). Same counts.
  Target other = target;
  other.subgroup_arithmetic = !target.subgroup_arithmetic && rt.caps().subgroup_arithmetic;
  CountedAdjoint ca_other = make_adjoint_counted(fwd, other).value();
  auto hc_other = rt.register_kernel(compile(ca_other.counter, other).value()).value();
  // Seeded random inputs (bench_util.h): x log-uniform over [0.02, 1000] (trip counts spread
  // over the range), w uniform over [0.5, 1.5].
  std::vector<float> x0 = bench::random_floats(n, 1, std::log(0.02f), std::log(1000.0f));
  for (float& v : x0) v = std::exp(v);
  const std::vector<float> w0 = bench::random_floats(n, 2, 0.5f, 1.5f);
  auto arr = [&](const char* name, const std::vector<float>& init) {
    auto h = rt.create_ndarray(runtime::DType::kF32, {n}, name).value();
    if (!rt.upload(h, init.data(), 4ull * n).ok())
      bench::check_failed("uploading " + std::string(name));
    return h;
  };
  const std::vector<float> zeros(n, 0.0f), ones(n, 1.0f);
  auto x = arr("x", x0), w = arr("w", w0), y = arr("y", zeros);
  auto xg = arr("x_grad", zeros), wg = arr("w_grad", zeros), yg = arr("y_grad", ones);
  const uint32_t words = ca.counted * runtime::kTripSlots;
  auto trips = rt.create_ndarray(runtime::DType::kI32, {words}, "trips").value();
  using runtime::Arg;
  std::vector<Arg> fa = {Arg::ndarray(x), Arg::ndarray(w), Arg::ndarray(y)};
  std::vector<Arg> aa = fa;
  for (auto g : {xg, wg, yg}) aa.push_back(Arg::ndarray(g));
  std::vector<Arg> ca_args = fa;
  ca_args.push_back(Arg::ndarray(trips));
  bench::warm_up(rt, hf, fa, 300);
  // The counts, for the counted adjoint launched on its own.
  std::vector<int32_t> zero(words, 0), slots(words, 0), counts(ca.counted, 0);
  (void)rt.upload(trips, zero.data(), 4ull * words);
  (void)rt.launch(hc, ca_args);
  (void)rt.download(trips, slots.data(), 4ull * words);
  for (uint32_t w = 0; w < words; ++w) {
    counts[w / runtime::kTripSlots] = std::max(counts[w / runtime::kTripSlots], slots[w]);
  }
  // The other counter must find the same counts (they are exact maxima).
  std::vector<int32_t> slots_pt(words, 0), counts_pt(ca.counted, 0);
  (void)rt.upload(trips, zero.data(), 4ull * words);
  (void)rt.launch(hc_other, ca_args);
  (void)rt.download(trips, slots_pt.data(), 4ull * words);
  for (uint32_t w = 0; w < words; ++w) {
    counts_pt[w / runtime::kTripSlots] = std::max(counts_pt[w / runtime::kTripSlots], slots_pt[w]);
  }
  if (counts_pt != counts) {
    std::fprintf(stderr, "counting kernels disagree: %d vs %d\n", counts.empty() ? 0 : counts[0],
                 counts_pt.empty() ? 0 : counts_pt[0]);
    return 1;
  }
  // The counting forward must leave the counter's words, word for word (same slots, same
  // lowering of atomic_max), and write what the forward writes.
  std::vector<float> y_fwd(n), y_cf(n);
  (void)rt.launch(hf, fa);
  (void)rt.download(y, y_fwd.data(), 4ull * n);
  std::vector<int32_t> slots_cf(words, 0);
  (void)rt.upload(trips, zero.data(), 4ull * words);
  (void)rt.upload(y, std::vector<float>(n, 0.0f).data(), 4ull * n);
  (void)rt.launch(hcf, ca_args);
  (void)rt.download(trips, slots_cf.data(), 4ull * words);
  (void)rt.download(y, y_cf.data(), 4ull * n);
  if (slots_cf != slots || std::memcmp(y_fwd.data(), y_cf.data(), 4ull * n) != 0) {
    std::fprintf(stderr, "the counting forward disagrees with the %s\n",
                 slots_cf != slots ? "counter's words" : "forward's output");
    return 1;
  }
  std::vector<Arg> counted_args = aa;
  for (int32_t t : counts) counted_args.push_back(Arg::i32(t));

  // The forward and the counting forward interleaved, rep by rep (the batch launches into the
  // same trips array without zeroing it again: the atomics cost the same whatever the words hold).
  // The counting cost is the median of the per-rep differences, not the difference of two
  // medians: each pair ran back to back, so a clock or load change between reps cancels, where
  // two medians of ~0.1 ms batches taken apart swung the cost from 8% to 33% of the adjoint on
  // one H200 (issue 49). At least 21 pairs, whatever --reps says: a pair costs under a
  // millisecond.
  bench::warm_up(rt, hcf, ca_args, 100);
  std::vector<double> fs, cfs, costs;
  const int pairs = std::max(reps, 21);
  for (int r = 0; r <= pairs; ++r) {
    double fr = bench::batch_ms(rt, hf, fa, 4), cfr = bench::batch_ms(rt, hcf, ca_args, 4);
    if (r) fs.push_back(fr), cfs.push_back(cfr), costs.push_back(cfr - fr);
  }
  const double f = bench::median(fs), cf = bench::median(cfs);
  const double cost = bench::median(costs), cost_lo = bench::quantile(costs, 0.25),
               cost_hi = bench::quantile(costs, 0.75);
  double c = time_ms([&] { return bench::batch_ms(rt, hc, ca_args, 4); }, reps);
  double c_other = time_ms([&] { return bench::batch_ms(rt, hc_other, ca_args, 4); }, reps);
  double s = time_ms([&] { return bench::batch_ms(rt, hs, aa, 4); }, reps);
  uint64_t heap_stated = rt.stats()->adstack_heap_bytes;
  double a = time_ms([&] { return bench::batch_ms(rt, ha, counted_args, 4); }, reps);
  double e2e = time_ms(
      [&] {
        (void)rt.synchronize();
        double t0 = now_us();
        Status st = runtime::launch_counted(rt, hc, ha, ca.counted, fa.size(), aa);
        if (!st.ok()) std::fprintf(stderr, "%s\n", st.to_string().c_str());
        (void)rt.synchronize();
        return (now_us() - t0) / 1000;
      },
      reps);
  // One training step's gradient, end to end: the forward then launch_counted (the counter's
  // second pass), against the forward-counted pair in its place.
  double step_counter = time_ms(
      [&] {
        (void)rt.synchronize();
        double t0 = now_us();
        (void)rt.launch(hf, fa);
        Status st = runtime::launch_counted(rt, hc, ha, ca.counted, fa.size(), aa);
        if (!st.ok()) std::fprintf(stderr, "%s\n", st.to_string().c_str());
        (void)rt.synchronize();
        return (now_us() - t0) / 1000;
      },
      reps);
  double step_pair = time_ms(
      [&] {
        (void)rt.synchronize();
        double t0 = now_us();
        runtime::NdArrayHandle t;
        Status st = runtime::launch_forward_counted(rt, hcf, ca.counted, fa, &t);
        if (st.ok()) st = runtime::launch_counted_adjoint(rt, ha, ca.counted, t, aa);
        if (!st.ok()) std::fprintf(stderr, "%s\n", st.to_string().c_str());
        (void)rt.synchronize();
        return (now_us() - t0) / 1000;
      },
      reps);
  double adj_alone = time_ms(
      [&] {
        (void)rt.synchronize();
        double t0 = now_us();
        (void)rt.launch(ha, counted_args);
        (void)rt.synchronize();
        return (now_us() - t0) / 1000;
      },
      reps);
  // The outputs after timing. y (the last launch that wrote it was a counting forward) against
  // the loop in double; then each adjoint once more from zeroed gradients (the timed launches
  // accumulated into them), stated and counted alike, against the loop's derivative in double
  // (y_grad = 1), every 64th element.
  {
    std::vector<float> got = bench::download_or_fail<float>(rt, y, n, "y");
    const std::vector<Arg>&stated_args = aa, &with_counts = counted_args;
    for (auto [h, hargs, what] :
         {std::tuple{hs, &stated_args, "stated"}, std::tuple{ha, &with_counts, "counted"}}) {
      if (!rt.upload(xg, zeros.data(), 4ull * n).ok() ||
          !rt.upload(wg, zeros.data(), 4ull * n).ok() || !rt.launch(h, *hargs).ok())
        bench::check_failed(std::string("the ") + what + " adjoint's check launch");
      std::vector<float> gx = bench::download_or_fail<float>(rt, xg, n, "x_grad"),
                         gw = bench::download_or_fail<float>(rt, wg, n, "w_grad");
      for (uint32_t i = 0; i < n; i += 64) {
        double v = x0[i], acc = 0, dx = 0, dw = 0, scale = 1;  // scale = dv/dx = 0.5^k
        while (v * v > 1e-4) {
          acc += v * std::sin(v) * w0[i];
          dx += scale * (std::sin(v) + v * std::cos(v)) * w0[i];
          dw += v * std::sin(v);
          v *= 0.5;
          scale *= 0.5;
        }
        dx += scale;
        auto near = [](double a, double b, double mag) {
          return std::fabs(a - b) <= 1e-3 * (std::fabs(b) + mag);
        };
        if (!near(got[i], acc + v, 1.0) || !near(gx[i], dx, 1.0) || !near(gw[i], dw, 1.0)) {
          char buf[256];
          std::snprintf(buf, sizeof buf,
                        "%s adjoint, element %u (x = %g): y %g (want %g), x_grad %g (want %g), "
                        "w_grad %g (want %g)",
                        what, i, x0[i], got[i], acc + v, gx[i], dx, gw[i], dw);
          bench::check_failed(buf);
        }
      }
    }
  }
  std::printf("device: %s; %u elements; counted trips %d (stated max_trip %lld)\n",
              rt.caps().device_name.c_str(), n, counts.empty() ? 0 : counts[0],
              static_cast<long long>(max_trip));
  std::printf("forward                      %9.3f ms\n", f);
  auto lowering = [](const Target& t) {
    return t.subgroup_arithmetic ? "atomic_max combined per subgroup" : "one atomic_max per thread";
  };
  std::printf("counting kernel              %9.3f ms  (%.1f%% of the counted adjoint; %s)\n", c,
              100 * c / a, lowering(target));
  if (other.subgroup_arithmetic != target.subgroup_arithmetic) {
    std::printf("  the other lowering         %9.3f ms  (%.1f%% of the counted adjoint; %s)\n",
                c_other, 100 * c_other / a, lowering(other));
  } else {
    std::printf("  (no other lowering: the device has no subgroup arithmetic)\n");
  }
  std::printf(
      "counting forward             %9.3f ms  (counting cost: %+.3f ms over the forward, %.1f%% of "
      "the counted adjoint;\n"
      "                                           median of %zu paired reps, quartiles %+.3f .. "
      "%+.3f ms = %.1f .. %.1f%%)\n",
      cf, cost, 100 * cost / a, costs.size(), cost_lo, cost_hi, 100 * cost_lo / a,
      100 * cost_hi / a);
  std::printf("adjoint, stated max_trip     %9.3f ms  (heap %.1f MB)\n", s, heap_stated / 1e6);
  std::printf("adjoint, counted capacity    %9.3f ms\n", a);
  std::printf("launch_counted, one launch   %9.3f ms  (adjoint alone, one launch: %.3f ms)\n", e2e,
              adj_alone);
  std::printf("forward + launch_counted     %9.3f ms  (one launch each)\n", step_counter);
  std::printf(
      "forward-counted pair         %9.3f ms  (launch_forward_counted + launch_counted_adjoint)\n",
      step_pair);
  std::printf("inputs: seeded random; y and both adjoints' gradients checked after timing\n");
  bench::JsonRecords json;
  json.begin();
  json.field("n", n);
  json.field("counted_trips", counts.empty() ? 0 : counts[0]);
  json.field("forward_ms", f);
  json.field("counter_ms", c);
  json.field("counter_pct_of_adjoint", 100 * c / a);
  json.field("counter_subgroup_combined", target.subgroup_arithmetic ? 1 : 0);
  json.field("counter_other_lowering_ms", c_other);
  json.field("counting_forward_ms", cf);
  json.field("counting_cost_ms", cost);
  json.field("counting_cost_pct_of_adjoint", 100 * cost / a);
  json.field("counting_cost_p25_ms", cost_lo);
  json.field("counting_cost_p75_ms", cost_hi);
  json.field("counting_cost_pairs", static_cast<uint64_t>(costs.size()));
  json.field("adjoint_stated_ms", s);
  json.field("adjoint_counted_ms", a);
  json.field("launch_counted_ms", e2e);
  json.field("adjoint_single_launch_ms", adj_alone);
  json.field("forward_then_launch_counted_ms", step_counter);
  json.field("forward_counted_pair_ms", step_pair);
  if (args.has("json")) json.write(args.get("json", ""), rt.caps().device_name);
  return 0;
}
