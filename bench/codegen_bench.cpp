// vkad-bench-codegen: (1) compile time from IR to validated SPIR-V, without and with spirv-opt,
// for small / medium / large kernels; (2) compile time against loop nesting depth, up to
// kMaxNestingDepth, forward and adjoint, with the module's size and the validation's share
// (loops nested kOutlineLoopDepth deep go into functions of their own so that validation stays
// fast, spirv/spirv_outline.h); (3) device time of generated saxpy as a fraction of a
// hand-written copy kernel over the same bytes, measured in the same run on the same seeded
// random data (a saxpy above the copy is flagged, bench_util.h), every output checked after
// timing against its closed form (a wrong result exits 3); (4) the cost of f32 and f64
// transcendentals, outputs checked likewise.
//
//   vkad-bench-codegen [--reps R] [--n ELEMENTS] [--json FILE]   (--reps: compile-time repetitions)
#include <cmath>
#include <cstdio>
#include <cstring>

#include "abi/spirv_tools.h"
#include "api/device_target.h"
#include "autodiff/reverse_mode.h"
#include "bench/bench_runtime.h"
#include "bench/bench_util.h"
#include "ir/builder.h"
#include "ir/text.h"
#include "runtime/runtime.h"
#include "spirv/compiler.h"
#include "support/sample_kernels.h"

using namespace vkad;
using namespace vkad::codegen;
using bench::now_us;

namespace {

Kernel saxpy() {
  KernelBuilder kb("saxpy");
  Scalar a = kb.scalar("a", DType::kF32);
  Array x = kb.ndarray("x", DType::kF32, 1, {.read_only = true});
  Array y = kb.ndarray("y", DType::kF32, 1);
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) { y.store({i}, a * x(i) + y(i)); });
  return kb.finish();
}

// A chain of `n` nonlinear updates in a loop with a branch: grows with n.
Kernel chain(const std::string& name, int n) {
  KernelBuilder kb(name);
  Scalar steps = kb.scalar("steps", DType::kI32);
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Local v = kb.local(x(i));
    kb.for_range(kb.i32(0), steps, [&](Value) {
      Value a = v.load();
      for (int k = 0; k < n; ++k) {
        a = (k % 3 == 0)   ? sin(a) * 0.9 + a * 0.1
            : (k % 3 == 1) ? tanh(a * a) - a * 0.5
                           : max(a, kb.f32(-1)) + 0.01;
      }
      kb.if_(
          a > 0.0, [&] { v.store(a); }, [&] { v.store(-a * 0.5); });
    });
    y.store({i}, v.load());
  });
  return kb.finish();
}

// `depth` nested loops around a nonlinear update of a carried local: every level is reversed
// with its own checkpoint stack in the adjoint.
Kernel nest(uint32_t depth) {
  std::string t =
      "kernel nest(n: i32, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {\n"
      "  task t parallel %0 in [0, shape(x, 0)) {\n    %1 = const 0 : i32\n"
      "    %2 = arg n : i32\n    %v = alloca : f32\n    %x = load x[%0] : f32\n"
      "    store_local %v, %x\n";
  for (uint32_t i = 0; i < depth; ++i) t += "for %l" + std::to_string(i) + " in [%1, %2) {\n";
  t += "%a = load_local %v : f32\n%s = sin %a : f32\nstore_local %v, %s\n";
  for (uint32_t i = 0; i < depth; ++i) t += "}\n";
  t += "    %o = load_local %v : f32\n    store y[%0], %o\n  }\n}\n";
  return parse(t).value();
}

double time_compile(const Kernel& k, const Target& t, bool opt, int reps) {
  std::vector<double> v;
  CompileOptions o;
  o.optimize = opt;
  for (int r = 0; r < reps; ++r) {
    double a = now_us();
    auto c = compile(k, t, o);
    v.push_back(now_us() - a);
    if (!c.ok()) std::fprintf(stderr, "%s\n", c.status().to_string().c_str());
  }
  return bench::median(v) / 1000.0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is printed, also into a pipe or file
  bench::Args args(
      argc, argv,
      "usage: vkad-bench-codegen [--reps R] [--n N] [--max-depth D] [--json F]\n"
      "  compile time (IR -> validated SPIR-V, with and without spirv-opt) and\n"
      "  generated saxpy against the hand-written copy kernel (GB/s)\n"
      "  --reps R  repetitions, median reported (default 20)\n"
      "  --n N     bandwidth elements (default: 256 Mi on GPUs, 64 Mi on CPU devices, at most\n"
      "            what one binding holds)\n"
      "  --max-depth D  deepest loop nest of the depth sweep (default and at most\n"
      "            kMaxNestingDepth = 64)\n"
      "  --json F  also write the results as JSON to F\n",
      {"reps", "n", "max-depth", "json"});
  const uint32_t max_depth = static_cast<uint32_t>(args.get_int("max-depth", kMaxNestingDepth));
  int reps = static_cast<int>(args.get_int("reps", 20));
  bench::JsonRecords json;
  auto rt_r = runtime::Runtime::create();
  if (!rt_r.ok()) {
    std::fprintf(stderr, "%s\n", rt_r.status().to_string().c_str());
    return 1;
  }
  runtime::Runtime& rt = **rt_r;
  Target target = target_from_caps(rt.caps());
  std::printf("device: %s\n\ncompile time, IR -> validated SPIR-V (median of %d, ms)\n",
              rt.caps().device_name.c_str(), reps);
  std::printf("%-28s %8s %10s %12s\n", "kernel", "stmts", "no opt", "spirv-opt");
  Kernel medium = chain("medium", 12);
  Kernel large_fwd = chain("large", 60);
  Kernel large = make_adjoint(large_fwd, target).value();
  struct Case {
    const char* name;
    const Kernel* k;
  } cases[] = {{"small: saxpy", nullptr},
               {"medium: loop, 12 ops, if", &medium},
               {"large: adjoint of 60-op loop", &large}};
  Kernel small = saxpy();
  cases[0].k = &small;
  for (const Case& c : cases) {
    size_t stmts = 0;
    std::function<void(const Block&)> count = [&](const Block& b) {
      for (const Stmt& s : b.stmts) {
        ++stmts;
        for (const Block& x : s.blocks) count(x);
      }
    };
    for (const Task& t : c.k->tasks) count(t.body);
    double plain = time_compile(*c.k, target, false, reps),
           opt = time_compile(*c.k, target, true, reps);
    std::printf("%-28s %8zu %10.3f %12.3f\n", c.name, stmts, plain, opt);
    json.begin();
    json.field("bench", "compile");
    json.field("kernel", c.name);
    json.field("stmts", static_cast<double>(stmts));
    json.field("ms", plain);
    json.field("ms_opt", opt);
  }

  std::printf("\ncompile time against loop nesting depth (median of %d, ms; limit %u)\n", reps,
              kMaxNestingDepth);
  std::printf("%-8s %12s %14s %14s %14s %16s %9s\n", "depth", "forward", "adjoint", "adjoint stmts",
              "adjoint words", "adjoint validate", "validate");
  for (uint32_t depth : {1u, 4u, 8u, 16u, 32u, kMaxNestingDepth}) {
    if (depth > max_depth) break;
    Kernel fwd = nest(depth);
    Kernel adj = make_adjoint(fwd, target).value();
    double f = time_compile(fwd, target, false, reps), a = time_compile(adj, target, false, reps);
    size_t stmts = 0;
    std::function<void(const Block&)> count = [&](const Block& b) {
      for (const Stmt& s : b.stmts) {
        ++stmts;
        for (const Block& x : s.blocks) count(x);
      }
    };
    for (const Task& t : adj.tasks) count(t.body);
    // The validation gate alone, on the adjoint's modules.
    auto ck = compile(adj, target).value();
    size_t words = 0;
    for (const auto& t : ck.tasks) words += t.spirv.size();
    double v0 = now_us();
    for (const auto& t : ck.tasks) (void)validate_spirv(t.spirv);
    double val = (now_us() - v0) / 1000.0;
    std::printf("%-8u %12.3f %14.3f %14zu %14zu %16.3f %8.0f%%\n", depth, f, a, stmts, words, val,
                100 * val / a);
    json.begin();
    json.field("bench", "compile_vs_depth");
    json.field("depth", static_cast<double>(depth));
    json.field("ms", f);
    json.field("ms_adjoint", a);
    json.field("adjoint_stmts", static_cast<double>(stmts));
    json.field("ms_adjoint_validate", val);
    json.field("adjoint_words", static_cast<double>(words));
  }

  // Bandwidth: generated saxpy vs the raw copy over the same arrays. On GPUs 1 GiB per array
  // (far past any cache; the raw-Vulkan reference used 1 GiB buffers), on CPU devices
  // 256 MiB; never past one binding's range.
  uint64_t default_n = rt.caps().kind == rhi::DeviceKind::kCpu ? (64u << 20) : (256u << 20);
  uint32_t n = static_cast<uint32_t>(args.get_int(
      "n",
      static_cast<long>(std::min<uint64_t>(rt.caps().max_storage_buffer_range / 4, default_n))));
  n &= ~3u;  // whole uvec4s for the reference copy
  // Seeded random inputs (bench_util.h): the copy moves the same bits as saxpy's x.
  auto x = rt.create_ndarray(runtime::DType::kF32, {n}, "x").value();
  auto y = rt.create_ndarray(runtime::DType::kF32, {n}, "y").value();
  const std::vector<float> x0 = bench::random_floats(n, 1), y0 = bench::random_floats(n, 2);
  if (!rt.upload(x, x0.data(), 4ull * n).ok() || !rt.upload(y, y0.data(), 4ull * n).ok())
    bench::check_failed("uploading saxpy's inputs");
  runtime::CompiledKernel copy;
  copy.name = "copy";
  copy.params = {{"x", runtime::ParamKind::kNdArray, runtime::DType::kU32, 1, false},
                 {"y", runtime::ParamKind::kNdArray, runtime::DType::kU32, 1, true}};
  copy.tasks.push_back({"main",
                        assemble_spirv(testing::kCopyU32Spirv).value(),
                        128,
                        runtime::RangeBound::constant(0),
                        runtime::RangeBound::array_dim(0, 0),
                        false,
                        {}});
  // saxpy's a: a power of two, so a * x is exact and only the additions round.
  constexpr float kSaxpyA = 0.5f;
  auto xu = rt.create_ndarray(runtime::DType::kU32, {n}, "xu").value();
  auto yu = rt.create_ndarray(runtime::DType::kU32, {n}, "yu").value();
  if (!rt.upload(xu, x0.data(), 4ull * n).ok() || !rt.upload(yu, y0.data(), 4ull * n).ok())
    bench::check_failed("uploading the copy's inputs");
  struct Variant {
    const char* name;
    runtime::KernelHandle h;
    std::vector<runtime::Arg> args;
    double bytes;
    std::vector<double> ms;
    int launches = 0;  // saxpy accumulates into y: the check needs every launch counted
  };
  std::vector<Variant> variants;
  // The reference: the hand-written copy with 16-byte accesses; the scalar copy beside it.
  variants.push_back(
      {"copy, uvec4 (hand-written)",
       rt.register_kernel(testing::make_copy_u32x4_kernel()).value(),
       {runtime::Arg::u32(n / 4), runtime::Arg::ndarray(xu), runtime::Arg::ndarray(yu)},
       8.0 * n,
       {}});
  variants.push_back({"copy, u32 (hand-written)",
                      rt.register_kernel(copy).value(),
                      {runtime::Arg::ndarray(xu), runtime::Arg::ndarray(yu)},
                      8.0 * n,
                      {}});
  // Generated saxpy as the runtime compiles it, with spirv-opt, and without bounds checks (what
  // the checks cost).
  for (int opt = 0; opt < 3; ++opt) {
    CompileOptions o;
    o.optimize = opt == 1;
    o.bounds_checks = opt != 2;
    variants.push_back(
        {opt == 0   ? "saxpy (generated)"
         : opt == 1 ? "saxpy (generated, spirv-opt)"
                    : "saxpy (no bounds checks)",
         rt.register_kernel(compile(small, target, o).value()).value(),
         {runtime::Arg::f32(kSaxpyA), runtime::Arg::ndarray(x), runtime::Arg::ndarray(y)},
         12.0 * n,
         {}});
  }
  // Launches are timed in batches of kBatch between synchronizes, so the ~40 us submit/wait
  // round trip (measured by vkad-bench-dispatch) is amortised instead of counted as kernel time.
  // A GPU raises its clocks only under sustained load: the first variant measured in a cold
  // run read half the bandwidth of the last (H200: copy 1072 GB/s, spirv-opt saxpy 3302 GB/s,
  // same launch geometry). So every variant is first run for ~300 ms, and then the variants
  // are interleaved batch by batch, so all of them see the same clock state.
  constexpr int kBatch = 20;

  for (Variant& v : variants) v.launches += bench::warm_up(rt, v.h, v.args, 300);
  constexpr int kBandwidthReps = 9;
  for (int r = 0; r < kBandwidthReps; ++r) {
    for (Variant& v : variants) {
      v.ms.push_back(bench::batch_ms(rt, v.h, v.args, kBatch));
      v.launches += kBatch;
    }
  }
  // The outputs after timing. The copies: yu holds x's bits exactly. The three saxpy variants
  // all added a * x into y, K launches in all: y = y0 + K a x, computed here in the same f32
  // order for every 1024th element (exactly equal: one launch skipped or doubled shows), and
  // within the bound of K roundings of |y| (relative 2^-24 each) for the rest.
  {
    std::vector<uint32_t> got = bench::download_or_fail<uint32_t>(rt, yu, n, "copy output");
    if (std::memcmp(got.data(), x0.data(), 4ull * n) != 0)
      bench::check_failed("the hand-written copy's output differs from its input");
  }
  {
    double k = 0;
    for (size_t i = 2; i < variants.size(); ++i) k += variants[i].launches;
    std::vector<float> got = bench::download_or_fail<float>(rt, y, n, "saxpy output");
    bench::check_close(
        "saxpy y after " + std::to_string(static_cast<long>(k)) + " launches", got,
        [&](size_t i) {
          return i % 1024 == 0 ? bench::repeated_add(y0[i], kSaxpyA * x0[i], static_cast<long>(k))
                               : y0[i] + k * kSaxpyA * static_cast<double>(x0[i]);
        },
        [&](size_t i) {
          return i % 1024 == 0
                     ? 0.0
                     : (std::fabs(y0[i]) + k * kSaxpyA * std::fabs(x0[i])) * (k + 1) * 0x1p-23;
        });
  }
  std::printf(
      "\nbandwidth over %u elements (%.0f MiB per array), median of %d interleaved batches of %d "
      "launches\n",
      n, 4.0 * n / (1 << 20), kBandwidthReps, kBatch);
  std::printf("inputs: seeded random floats; outputs checked after timing\n");
  std::printf("%-30s %10s %10s  %s\n", "kernel", "ms", "GB/s", "vs copy (uvec4, same data)");
  double copy_gbs = 0;
  for (Variant& v : variants) {
    double m = bench::median(v.ms), gbs = v.bytes / (m * 1e6);
    if (copy_gbs == 0) copy_gbs = gbs;
    bench::BandwidthNote note = bench::bandwidth_note(gbs, copy_gbs);
    std::printf("%-30s %10.3f %10.2f  %s\n", v.name, m, gbs, note.text.c_str());
    json.begin();
    json.field("bench", "bandwidth");
    json.field("kernel", v.name);
    json.field("n", n);
    json.field("ms", m);
    json.field("gbs", gbs);
    json.field("copy_gbs", copy_gbs);
    json.field("fraction_of_copy", note.fraction_of_copy);
    json.field("above_copy", note.above_copy ? 1 : 0);
  }
  // Cost of the transcendentals: f32 (GLSL.std.450, with vkad's range reduction for sin) against
  // f64 (vkad's own, spirv/f64_math.h), y[i] = op(x[i]) (pow: x[i]^x2[i]), ms per launch over
  // the same element count; "add" is the memory-bound baseline (same loads and store).
  if (target.float64) {
    uint32_t m = rt.caps().kind == rhi::DeviceKind::kCpu ? (1u << 18) : (1u << 24);
    std::printf(
        "\ntranscendental cost over %u elements (ms per launch, median of 9 batches of 10)\n", m);
    std::printf("%-8s %10s %10s %10s\n", "op", "f32", "f64", "f64/f32");
    for (const char* fn : {"add", "sin", "exp", "log", "tanh", "pow"}) {
      double t[2] = {0, 0};
      for (int w = 0; w < 2; ++w) {
        const char* ty = w ? "f64" : "f32";
        std::string body = std::string(fn) == "add" ? std::string("    %r = add %a, %b : ") + ty
                           : std::string(fn) == "pow"
                               ? std::string("    %r = pow %a, %b : ") + ty
                               : std::string("    %r = ") + fn + " %a : " + ty;
        std::string text =
            std::string("kernel t(x: ndarray<") + ty + ", 1>, x2: ndarray<" + ty +
            ", 1>, y: ndarray<" + ty +
            ", 1>) {\n  task main parallel %i in [0, shape(x, 0)) {\n    %a = load x[%i] : " + ty +
            "\n    %b = load x2[%i] : " + ty + "\n" + body + "\n    store y[%i], %r\n  }\n}\n";
        auto k = parse(text);
        auto c = k.ok() ? compile(*k, target) : Result<runtime::CompiledKernel>(k.status());
        if (!c.ok()) {
          std::fprintf(stderr, "%s %s: %s\n", fn, ty, c.status().to_string().c_str());
          return 1;
        }
        auto h = rt.register_kernel(*c).value();
        runtime::DType dt = w ? runtime::DType::kF64 : runtime::DType::kF32;
        // Seeded random inputs in [0.5, 1.5) (inside every op's domain; pow's base positive),
        // the same values at both widths.
        std::vector<runtime::NdArrayHandle> arrs;
        std::vector<double> in[3];
        for (int j = 0; j < 3; ++j) {
          const char* nm[] = {"tx", "tx2", "ty"};
          auto a = rt.create_ndarray(dt, {m}, nm[j]).value();
          std::vector<float> v32 = bench::random_floats(m, 10 + j, 0.5f, 1.5f);
          in[j].assign(v32.begin(), v32.end());
          Status st = w ? rt.upload(a, in[j].data(), 8ull * m) : rt.upload(a, v32.data(), 4ull * m);
          if (!st.ok()) bench::check_failed(std::string(fn) + ": upload: " + st.to_string());
          arrs.push_back(a);
        }
        std::vector<runtime::Arg> a = {runtime::Arg::ndarray(arrs[0]),
                                       runtime::Arg::ndarray(arrs[1]),
                                       runtime::Arg::ndarray(arrs[2])};
        std::vector<double> ms;
        for (int r = 0; r < 10; ++r) {
          double m = bench::batch_ms(rt, h, a, 10);
          if (r) ms.push_back(m);  // the first batch warms up
        }
        t[w] = bench::median(ms);
        // y = op(x, x2) against the closed form in double, within what the built-ins promise
        // (Vulkan's GLSL.std.450 precision: sin to 2^-11 absolute, log to 2^-21 absolute near
        // 1, exp and pow to a few ulp; vkad's f64 routines much closer) and far below what a
        // wrong element is off by.
        auto want = [&](size_t i) {
          double a = in[0][i], b = in[1][i];
          std::string f = fn;
          return f == "add"    ? a + b
                 : f == "sin"  ? std::sin(a)
                 : f == "exp"  ? std::exp(a)
                 : f == "log"  ? std::log(a)
                 : f == "tanh" ? std::tanh(a)
                               : std::pow(a, b);
        };
        const double rel = w ? 1e-9 : 0x1p-14, abs = w ? 1e-12 : 0x1p-11;
        auto tol = [&](size_t i) { return rel * std::fabs(want(i)) + abs; };
        std::string what = std::string(fn) + " " + ty + " output";
        if (w)
          bench::check_close(what, bench::download_or_fail<double>(rt, arrs[2], m, fn), want, tol);
        else
          bench::check_close(what, bench::download_or_fail<float>(rt, arrs[2], m, fn), want, tol);
        for (auto x : arrs) (void)rt.free_ndarray(x);
      }
      std::printf("%-8s %10.3f %10.3f %9.1fx\n", fn, t[0], t[1], t[1] / t[0]);
      json.begin();
      json.field("bench", "transcendental_cost");
      json.field("op", fn);
      json.field("n", m);
      json.field("ms_f32", t[0]);
      json.field("ms_f64", t[1]);
    }
  }
  if (args.has("json")) json.write(args.get("json", ""), rt.caps().device_name);
  return 0;
}
