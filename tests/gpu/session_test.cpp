// api/session.h, the front door, on a real device with validation on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "api/device_target.h"
#include "ir/builder.h"
#include "rhi/vk_check.h"
#include "runtime/runtime.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

using codegen::Array;
using codegen::KernelBuilder;
using codegen::Value;

class SessionTest : public ValidatedSessionTest {};

// loss = sum_i w[i] * sin(a * x[i]) * y[i] with x and y differentiated, w not: the map must pair
// x with x_grad and y with y_grad whatever lies between them.
codegen::Kernel weighted_sin() {
  KernelBuilder kb("weighted_sin");
  codegen::Scalar a = kb.scalar("a", DType::kF32);
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array w = kb.ndarray("w", DType::kF32, 1);
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  Array out = kb.ndarray("out", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0),
                  [&](Value i) { out.store({i}, w(i) * sin(Value(a) * x(i)) * y(i)); });
  return kb.finish();
}

// Session::prepare makes the args and readback rings' first chunks with the pipelines (a
// first capture that runs otherwise makes them inside the program's first iteration), so the
// first launch and readback after it make no ring chunk; a later prepare makes none either.
TEST_F(SessionTest, PrepareMakesTheRingsFirstChunksSoTheFirstRunMakesNone) {
  auto k = s_->compile(weighted_sin());
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  const uint32_t n = 64;
  std::vector<NdArrayHandle> h;
  for (const char* name : {"x", "w", "y", "out"}) {
    auto a = s_->ndarray(DType::kF32, {n}, name);
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(s_->fill(*a, 0.5).ok());
    h.push_back(*a);
  }
  ASSERT_TRUE(s_->synchronize().ok());
  auto chunks = [&] { return s_->runtime().stats()->ring_chunks_created; };
  ASSERT_EQ(chunks(), 0u) << "fills and a synchronize take no ring slot";
  const std::vector<Arg> args = {Arg::f32(2.0f), Arg::ndarray(h[0]), Arg::ndarray(h[1]),
                                 Arg::ndarray(h[2]), Arg::ndarray(h[3])};
  ASSERT_TRUE(s_->prepare(*k, args).ok());
  EXPECT_EQ(chunks(), 2u) << "one chunk each for the args and readback rings";
  EXPECT_GT(s_->stats()->args_ring_bytes, 0u);
  EXPECT_GT(s_->stats()->readback_ring_bytes, 0u);
  ASSERT_TRUE(s_->prepare(*k, args).ok());
  ASSERT_TRUE(s_->launch(*k, args).ok());
  std::vector<float> out(n);
  ASSERT_TRUE(s_->download(h[3], std::span<float>(out)).ok());
  EXPECT_FLOAT_EQ(out[0], 0.5f * std::sin(1.0f) * 0.5f);
  EXPECT_EQ(chunks(), 2u) << "the launch's args and the readback took the prepared chunks";
}

TEST_F(SessionTest, DifferentiateMapsEachGradParamToItsGradientAndRuns) {
  auto d = s_->differentiate(weighted_sin());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->forward_params, 5u);
  ASSERT_EQ(d->gradients.size(), 3u);
  EXPECT_EQ(d->gradients[0].param, 1u);
  EXPECT_EQ(d->gradients[0].grad_param, 5u);
  EXPECT_EQ(d->gradients[0].name, "x_grad");
  EXPECT_EQ(d->gradients[1].param, 3u);
  EXPECT_EQ(d->gradients[1].grad_param, 6u);
  EXPECT_EQ(d->gradients[1].name, "y_grad");
  EXPECT_EQ(d->gradients[2].param, 4u);
  EXPECT_EQ(d->gradients[2].name, "out_grad");

  const uint32_t n = 1000;
  const float a = 1.7f;
  std::vector<float> x(n), w(n), y(n);
  for (uint32_t i = 0; i < n; ++i) {
    x[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
    w[i] = 1.0f + 0.001f * static_cast<float>(i);
    y[i] = 0.5f - 0.002f * static_cast<float>(i % 13);
  }
  auto mk = [&](const char* name) {
    auto h = s_->ndarray(DType::kF32, {n}, name);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    return *h;
  };
  NdArrayHandle hx = mk("x"), hw = mk("w"), hy = mk("y"), ho = mk("out");
  NdArrayHandle gx = mk("x_grad"), gy = mk("y_grad"), go = mk("out_grad");
  ASSERT_TRUE(s_->upload(hx, std::span<const float>(x)).ok());
  ASSERT_TRUE(s_->upload(hw, std::span<const float>(w)).ok());
  ASSERT_TRUE(s_->upload(hy, std::span<const float>(y)).ok());
  // Garbage first, so the zero / fill below is what the gradients start from.
  std::vector<float> junk(n, 123.0f);
  ASSERT_TRUE(s_->upload(gx, std::span<const float>(junk)).ok());
  ASSERT_TRUE(s_->upload(gy, std::span<const float>(junk)).ok());
  ASSERT_TRUE(s_->zero(gx).ok());
  ASSERT_TRUE(s_->zero(gy).ok());
  ASSERT_TRUE(s_->fill(go, 1.0).ok());
  const Arg fargs[] = {Arg::f32(a), Arg::ndarray(hx), Arg::ndarray(hw), Arg::ndarray(hy),
                       Arg::ndarray(ho)};
  const NdArrayHandle grads[] = {gx, gy, go};
  auto aargs = d->adjoint_args(fargs, grads);
  ASSERT_TRUE(aargs.ok()) << aargs.status().to_string();
  ASSERT_TRUE(s_->launch(d->forward, fargs).ok());
  ASSERT_TRUE(s_->launch(d->adjoint, *aargs).ok());
  std::vector<float> dx(n), dy(n);
  ASSERT_TRUE(s_->download(gx, std::span<float>(dx)).ok());
  ASSERT_TRUE(s_->download(gy, std::span<float>(dy)).ok());
  for (uint32_t i = 0; i < n; ++i) {
    // Closed forms; Vulkan's sin/cos carry an absolute error of 2^-11 on [-pi, pi].
    const double ex = w[i] * a * std::cos(a * x[i]) * y[i], ey = w[i] * std::sin(a * x[i]);
    ASSERT_NEAR(dx[i], ex, 2e-3 * (1 + std::fabs(w[i] * a * y[i]))) << i;
    ASSERT_NEAR(dy[i], ey, 2e-3 * (1 + std::fabs(w[i]))) << i;
  }
}

// fill converts as documented for every dtype; the 8-byte pattern that is not two equal halves
// takes the staged path, 0 and repeated halves the device fill.
TEST_F(SessionTest, FillAndZeroEveryDtype) {
  struct Case {
    DType t;
    double v;
  };
  std::vector<Case> cases = {{DType::kF32, -2.25}, {DType::kI32, -7.9}, {DType::kU32, 4e9},
                             {DType::kBool, 1},    {DType::kBool, 0},   {DType::kF32, 0}};
  if (s_->target().float64) {
    cases.push_back({DType::kF64, 0.1});  // halves differ: staged
    cases.push_back({DType::kF64, 0});
  }
  if (s_->runtime().caps().shader_int64) {
    cases.push_back({DType::kI64, -3.0e12});
    cases.push_back({DType::kI64, -1});  // all ones: halves equal
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(runtime::dtype_name(c.t)) + " " + std::to_string(c.v));
    auto h = s_->ndarray(c.t, {7, 3}, "filled");
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    const uint32_t eb = runtime::dtype_bytes(c.t);
    std::vector<unsigned char> junk(21 * eb, 0xA5), got(21 * eb);
    ASSERT_TRUE(s_->upload(*h, junk.data(), junk.size()).ok());
    ASSERT_TRUE(s_->fill(*h, c.v).ok());
    ASSERT_TRUE(s_->download(*h, got.data(), got.size()).ok());
    for (uint32_t e = 0; e < 21; ++e) {
      const unsigned char* p = got.data() + e * eb;
      switch (c.t) {
        case DType::kF32: {
          float f;
          std::memcpy(&f, p, 4);
          ASSERT_EQ(f, static_cast<float>(c.v));
          break;
        }
        case DType::kF64: {
          double f;
          std::memcpy(&f, p, 8);
          ASSERT_EQ(f, c.v);
          break;
        }
        case DType::kI32: {
          int32_t i;
          std::memcpy(&i, p, 4);
          ASSERT_EQ(i, static_cast<int32_t>(c.v));
          break;
        }
        case DType::kU32: {
          uint32_t u;
          std::memcpy(&u, p, 4);
          ASSERT_EQ(u, static_cast<uint32_t>(c.v));
          break;
        }
        case DType::kI64: {
          int64_t i;
          std::memcpy(&i, p, 8);
          ASSERT_EQ(i, static_cast<int64_t>(c.v));
          break;
        }
        case DType::kBool: {
          uint32_t u;
          std::memcpy(&u, p, 4);
          ASSERT_EQ(u, c.v == 1 ? 1u : 0u);
          break;
        }
      }
    }
    ASSERT_TRUE(s_->free(*h).ok());
  }
}

// fill refuses a value its dtype cannot hold (launch's rule for scalars), names the array and
// the value, records nothing and leaves the array as it was; the edges that fit are stored.
TEST_F(SessionTest, FillRefusesValuesTheDtypeCannotHold) {
  struct Case {
    DType t;
    double v;
  };
  const Case refused[] = {
      {DType::kI32, 1e20},        {DType::kI32, 2147483648.0}, {DType::kI32, -2147483649.0},
      {DType::kU32, -1},          {DType::kU32, 4294967296.0}, {DType::kF32, 1e300},
      {DType::kF32, -1e39},       {DType::kBool, 0.5},         {DType::kBool, 2},
      {DType::kU32, std::nan("")}};
  for (const Case& c : refused) {
    SCOPED_TRACE(std::string(runtime::dtype_name(c.t)) + " " + std::to_string(c.v));
    auto h = s_->ndarray(c.t, {5}, "kept");
    ASSERT_TRUE(h.ok());
    const std::vector<uint32_t> before = {1, 2, 3, 0, 1};
    ASSERT_TRUE(s_->upload(*h, before.data(), 20).ok());
    Status st = s_->fill(*h, c.v);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.message().find("fill 'kept': value "), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(std::string("does not fit ") + runtime::dtype_name(c.t)),
              std::string::npos)
        << st.message();
    std::vector<uint32_t> after(5);
    ASSERT_TRUE(s_->download(*h, after.data(), 20).ok());
    EXPECT_EQ(after, before) << "a refused fill changes nothing";
    ASSERT_TRUE(s_->free(*h).ok());
  }
  // The edges that fit: truncation toward zero lands inside the range.
  struct Edge {
    DType t;
    double v;
    uint32_t want;
  };
  float inf = std::numeric_limits<float>::infinity();
  uint32_t inf_bits;
  std::memcpy(&inf_bits, &inf, 4);
  const Edge fit[] = {{DType::kI32, 2147483647.9, 0x7FFFFFFFu},
                      {DType::kI32, -2147483648.9, 0x80000000u},
                      {DType::kU32, 4294967295.5, 0xFFFFFFFFu},
                      {DType::kU32, -0.5, 0u},
                      {DType::kF32, std::numeric_limits<double>::infinity(), inf_bits}};
  for (const Edge& e : fit) {
    SCOPED_TRACE(std::string(runtime::dtype_name(e.t)) + " " + std::to_string(e.v));
    auto h = s_->ndarray(e.t, {3}, "edge");
    ASSERT_TRUE(h.ok());
    Status st = s_->fill(*h, e.v);
    ASSERT_TRUE(st.ok()) << st.to_string();
    std::vector<uint32_t> got(3);
    ASSERT_TRUE(s_->download(*h, got.data(), 12).ok());
    EXPECT_EQ(got[2], e.want);
    ASSERT_TRUE(s_->free(*h).ok());
  }
}

// VKAD_COMBINE_RUNS=0: the session's target has no ballot and relative shuffles, so atomic adds
// do not combine runs (spirv_emitter.cpp); otherwise the target has them where the device does
// (target_from_caps: on GPUs, not on CPU devices such as lavapipe).
TEST(SessionCombineRuns, TheSwitchTurnsTheTargetsShufflesOff) {
  for (const char* value : {"0", "1"}) {
    ASSERT_EQ(setenv("VKAD_COMBINE_RUNS", value, 1), 0);
    SessionOptions o;
    o.validation = true;
    auto s = Session::create(o);
    unsetenv("VKAD_COMBINE_RUNS");
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    const bool device_has = codegen::target_from_caps((*s)->runtime().caps()).subgroup_shuffle;
    EXPECT_EQ((*s)->target().subgroup_shuffle, std::string(value) == "1" && device_has) << value;
  }
}

// A validated session keeping `spare` empty memory blocks (the SessionMemory tests).
Result<std::unique_ptr<Session>> session_with_spare_blocks(uint32_t spare) {
  SessionOptions o;
  o.validation = true;
  o.spare_memory_blocks = spare;
  return Session::create(o);
}

// SessionOptions::spare_memory_blocks: with 0, freeing the last array of a block gives the block
// back (device memory held returns to what it was); with the default 1 the empty block is kept.
TEST(SessionMemory, SpareBlocksOptionDecidesWhetherFreedMemoryIsKept) {
  for (uint32_t spare : {0u, 1u}) {
    SCOPED_TRACE("spare_memory_blocks " + std::to_string(spare));
    auto r = session_with_spare_blocks(spare);
    if (!r.ok() && r.status().code() == ErrorCode::kNoDevice)
      GTEST_SKIP() << "SKIPPED: no Vulkan device";
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    Session& s = **r;
    ASSERT_TRUE(s.synchronize().ok());
    const uint64_t held_before = s.stats()->memory_block_bytes;
    auto h = s.ndarray(DType::kF32, {1024}, "tmp");
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(s.zero(*h).ok());
    ASSERT_TRUE(s.synchronize().ok());
    EXPECT_GT(s.stats()->memory_block_bytes, held_before);
    ASSERT_TRUE(s.free(*h).ok());
    ASSERT_TRUE(s.synchronize().ok());
    if (spare == 0) {
      EXPECT_EQ(s.stats()->memory_block_bytes, held_before) << "every empty block given back";
    } else {
      EXPECT_GT(s.stats()->memory_block_bytes, held_before) << "one empty block kept";
    }
    EXPECT_EQ(s.runtime().device().validation_message_count(), 0u);
  }
}

// The memory peaks (SessionStats::memory_peak_*, issue 57): an array made and freed leaves the
// current figures where they were and the peaks at least its bytes above them (a block of its
// own, given back at its free whatever spare_memory_blocks says); reset_memory_peaks starts
// them again from what is held now, and the next array raises them again.
TEST(SessionMemory, PeaksKeepTheMostHeldAfterAFreeUntilReset) {
  constexpr uint32_t kElems = 9u << 20;  // 36 MiB: past half a block, a block of its own
  constexpr uint64_t kBytes = uint64_t{kElems} * 4;
  for (uint32_t spare : {0u, 1u}) {
    SCOPED_TRACE("spare_memory_blocks " + std::to_string(spare));
    auto r = session_with_spare_blocks(spare);
    if (!r.ok() && r.status().code() == ErrorCode::kNoDevice)
      GTEST_SKIP() << "SKIPPED: no Vulkan device";
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    Session& s = **r;
    ASSERT_TRUE(s.synchronize().ok());
    const SessionStats before = *s.stats();
    EXPECT_GE(before.memory_peak_block_bytes, before.memory_block_bytes);
    EXPECT_GE(before.memory_peak_used_bytes, before.memory_used_bytes);
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE(round == 0 ? "since creation" : "after reset_memory_peaks");
      const SessionStats start = *s.stats();
      auto h = s.ndarray(DType::kF32, {kElems}, "big");
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      ASSERT_TRUE(s.zero(*h).ok());
      ASSERT_TRUE(s.synchronize().ok());
      ASSERT_TRUE(s.free(*h).ok());
      ASSERT_TRUE(s.synchronize().ok());
      const SessionStats after = *s.stats();
      EXPECT_LT(after.memory_used_bytes, start.memory_used_bytes + kBytes);
      EXPECT_GE(after.memory_peak_used_bytes, start.memory_used_bytes + kBytes);
      EXPECT_GE(after.memory_peak_block_bytes, start.memory_block_bytes + kBytes);
      EXPECT_LT(after.memory_block_bytes, start.memory_block_bytes + kBytes);
      ASSERT_TRUE(s.reset_memory_peaks().ok());
      const SessionStats reset = *s.stats();
      EXPECT_EQ(reset.memory_peak_used_bytes, reset.memory_used_bytes);
      EXPECT_EQ(reset.memory_peak_block_bytes, reset.memory_block_bytes);
    }
    EXPECT_EQ(s.runtime().device().validation_message_count(), 0u);
  }
}

// A fill is ordered with launches: launch, fill, launch again sees the fill in between.
TEST_F(SessionTest, FillIsOrderedWithLaunches) {
  KernelBuilder kb("add_one");
  Array x = kb.ndarray("x", DType::kF32, 1);
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) { x.store({i}, x(i) + 1.0); });
  auto k = s_->compile(kb.finish());
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  auto h = s_->ndarray(DType::kF32, {4096}, "x");
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(s_->fill(*h, 5).ok());
  ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(*h)}).ok());  // 6
  ASSERT_TRUE(s_->fill(*h, 10).ok());                    // 10
  ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(*h)}).ok());  // 11
  ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(*h)}).ok());  // 12
  std::vector<float> out(4096);
  ASSERT_TRUE(s_->download(*h, std::span<float>(out)).ok());
  for (float v : out) ASSERT_EQ(v, 12.0f);
  EXPECT_EQ(s_->stats()->launches, 3u);
}

// A kernel compiled again (same text) is answered from the session's compile cache: no second
// emission or validation, and the second handle runs like the first (issue 27: validated once).
TEST_F(SessionTest, CompilingAKernelAgainReusesItsValidatedModule) {
  KernelBuilder kb("twice");
  Array x = kb.ndarray("x", DType::kF32, 1);
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) { x.store({i}, x(i) * 3.0); });
  codegen::Kernel k = kb.finish();
  const SessionStats before = *s_->stats();
  auto a = s_->compile(k);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  const SessionStats mid = *s_->stats();
  EXPECT_EQ(mid.kernels_compiled, before.kernels_compiled + 1);
  auto b = s_->compile(std::string_view(codegen::print(k)));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const SessionStats after = *s_->stats();
  EXPECT_EQ(after.kernels_compiled, mid.kernels_compiled);
  EXPECT_EQ(after.compile_cache_hits, mid.compile_cache_hits + 1);
  EXPECT_NE(a->id, b->id);  // two registrations, one module
  auto h = s_->ndarray(DType::kF32, {5}, "x");
  ASSERT_TRUE(h.ok());
  const std::vector<float> in = {1, 2, 3, 4, 5};
  ASSERT_TRUE(s_->upload(*h, std::span<const float>(in)).ok());
  ASSERT_TRUE(s_->launch(*a, {Arg::ndarray(*h)}).ok());
  ASSERT_TRUE(s_->launch(*b, {Arg::ndarray(*h)}).ok());
  std::vector<float> out(5);
  ASSERT_TRUE(s_->download(*h, std::span<float>(out)).ok());
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(out[i], in[i] * 9.0f);
  // A differentiated kernel seen again hits for both its forward and its adjoint.
  auto d1 = s_->differentiate(weighted_sin());
  ASSERT_TRUE(d1.ok());
  const SessionStats d_mid = *s_->stats();
  auto d2 = s_->differentiate(weighted_sin());
  ASSERT_TRUE(d2.ok());
  EXPECT_EQ(s_->stats()->kernels_compiled, d_mid.kernels_compiled);
  EXPECT_EQ(s_->stats()->compile_cache_hits, d_mid.compile_cache_hits + 2);
}

TEST_F(SessionTest, CompileFromTextAndErrorsNameWhatIsWrong) {
  auto bad = s_->compile(std::string_view("kernel k(\n  ndarray<f32, 1> x\n) {\n  oops\n}\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("line"), std::string::npos) << bad.status().message();

  KernelBuilder kb("no_grad");
  Array x = kb.ndarray("x", DType::kF32, 1);
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) { x.store({i}, x(i) * 2.0); });
  codegen::Kernel k = kb.finish();
  auto d = s_->differentiate(k);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("'no_grad'"), std::string::npos) << d.status().message();
  EXPECT_NE(d.status().message().find("grad"), std::string::npos);

  // The text form round-trips through compile(text).
  auto ok = s_->compile(std::string_view(codegen::print(k)));
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();

  auto dd = s_->differentiate(weighted_sin());
  ASSERT_TRUE(dd.ok());
  const Arg one[] = {Arg::f32(1)};
  auto aa = dd->adjoint_args(one, {});
  ASSERT_FALSE(aa.ok());
  EXPECT_NE(aa.status().message().find("5 parameters"), std::string::npos) << aa.status().message();
  const Arg five[] = {Arg::f32(1), Arg::f32(1), Arg::f32(1), Arg::f32(1), Arg::f32(1)};
  aa = dd->adjoint_args(five, {});
  ASSERT_FALSE(aa.ok());
  EXPECT_NE(aa.status().message().find("x_grad, y_grad, out_grad"), std::string::npos)
      << aa.status().message();

  auto h = s_->ndarray(DType::kI32, {3}, "ints");
  ASSERT_TRUE(h.ok());
  Status st = s_->fill(*h, std::nan(""));
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'ints'"), std::string::npos) << st.message();
  ASSERT_TRUE(s_->free(*h).ok());
  EXPECT_EQ(s_->zero(*h).code(), ErrorCode::kNotFound);
  EXPECT_EQ(s_->dtype(*h).status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace vkad::testing

namespace vkad::testing {
namespace {

rhi::ExternalDevice external_from(rhi::Device& d) {
  rhi::ExternalDevice e;
  e.instance = d.instance();
  e.physical_device = d.physical_device();
  e.device = d.handle();
  e.queue_family = d.queue_family();
  const rhi::Capabilities& c = d.caps();
  e.enabled.timeline_semaphore = c.timeline_semaphore;
  e.enabled.shader_int64 = c.shader_int64;
  e.enabled.shader_float64 = c.shader_float64;
  e.enabled.atomic_float32_add = c.atomic_float32_add;
  e.enabled.atomic_float64_add = c.atomic_float64_add;
  e.enabled.buffer_int64_atomics = c.atomic_int64;
  e.enabled.push_descriptor = c.push_descriptor;
  return e;
}

// An embedder's VkDevice (here one an rhi::Device created, standing in for a DSL's own) shared
// by a Session: kernels run on it, the session's destruction leaves it alive and usable, and the
// features the embedder did not state are not used.
// out[i] = x[n - 1 - i] * 2 over x's extent: a gather whose index the extent decides, so a
// pipeline specialized for the wrong shape would read the wrong element.
codegen::Kernel reverse_twice() {
  KernelBuilder kb("reverse_twice");
  Array x = kb.ndarray("x", DType::kF32, 1);
  Array out = kb.ndarray("out", DType::kF32, 1);
  kb.parallel_for("main", 0, x.dim(0),
                  [&](Value i) { out.store({i}, x(Value(x.dim(0)) - 1 - i) * 2.0); });
  return kb.finish();
}

// Launches reverse_twice at each extent in `sizes` twice, waiting after each launch for the
// pipelines made in the background, and checks every result.
void launch_sizes(Session& s, KernelHandle k, std::span<const uint32_t> sizes) {
  for (uint32_t n : sizes) {
    auto x = s.ndarray(DType::kF32, {n}, "x");
    auto out = s.ndarray(DType::kF32, {n}, "out");
    ASSERT_TRUE(x.ok() && out.ok());
    std::vector<float> in(n);
    for (uint32_t i = 0; i < n; ++i) in[i] = 0.5f * static_cast<float>(i) + 1.0f;
    ASSERT_TRUE(s.upload(*x, std::span<const float>(in)).ok());
    for (int rep = 0; rep < 2; ++rep) {
      ASSERT_TRUE(s.launch(k, {Arg::ndarray(*x), Arg::ndarray(*out)}).ok());
      s.runtime().finish_pipelines();
    }
    std::vector<float> got(n);
    ASSERT_TRUE(s.download(*out, std::span<float>(got)).ok());
    for (uint32_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], in[n - 1 - i] * 2.0f) << "extent " << n << ", element " << i;
    }
    ASSERT_TRUE(s.free(*x).ok());
    ASSERT_TRUE(s.free(*out).ok());
  }
}

bool shapes_forced_off() {
  const char* shapes = std::getenv("VKAD_SPECIALIZE_SHAPES");
  const char* spec = std::getenv("VKAD_ADSTACK_SPECIALIZE");
  return (shapes != nullptr && std::string(shapes) == "0") ||
         (spec != nullptr && std::string(spec) == "off");
}

// reverse_twice compiled, x = 1, 2, ..., n uploaded, and `out` of the same extent.
struct Reverse {
  KernelHandle k;
  NdArrayHandle x, out;
  std::vector<float> in;
  std::vector<Arg> args() const { return {Arg::ndarray(x), Arg::ndarray(out)}; }
};
void make_reverse(Session& s, uint32_t n, Reverse* r) {
  auto k = s.compile(reverse_twice());
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  auto x = s.ndarray(DType::kF32, {n}, "x");
  auto out = s.ndarray(DType::kF32, {n}, "out");
  ASSERT_TRUE(x.ok() && out.ok());
  r->k = *k;
  r->x = *x;
  r->out = *out;
  r->in.resize(n);
  for (uint32_t i = 0; i < n; ++i) r->in[i] = 1.0f + static_cast<float>(i);
  ASSERT_TRUE(s.upload(r->x, std::span<const float>(r->in)).ok());
}
// `out` holds x reversed, doubled.
void expect_reversed(Session& s, const Reverse& r) {
  const size_t n = r.in.size();
  std::vector<float> got(n);
  ASSERT_TRUE(s.download(r.out, std::span<float>(got)).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], r.in[n - 1 - i] * 2.0f) << i;
}

// A session specializes its kernels to the shapes they are launched with (SessionOptions'
// default_compile_options): the generic pipeline at compile, then one per shape set, made on a
// thread while the shape's first launch runs the generic one; past the variant cap the generic
// one runs -- with the right results throughout.
TEST_F(SessionTest, KernelsRunSpecializedToEachShapeUpToTheCap) {
  if (shapes_forced_off()) GTEST_SKIP() << "shape specialization turned off in the environment";
  runtime::RuntimeStats before = *s_->runtime().stats();
  auto k = s_->compile(reverse_twice());
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  runtime::RuntimeStats at = *s_->runtime().stats();
  EXPECT_EQ(at.pipelines_created, before.pipelines_created + 1);  // the generic one
  const uint32_t cap = runtime::RuntimeOptions{}.adstack_specialize_max_variants;
  std::vector<uint32_t> sizes;
  for (uint32_t v = 0; v < cap; ++v) sizes.push_back(5 + 37 * v);
  launch_sizes(*s_, *k, sizes);
  if (HasFatalFailure()) return;
  runtime::RuntimeStats full = *s_->runtime().stats();
  EXPECT_EQ(full.pipelines_created - at.pipelines_created, cap);
  EXPECT_EQ(full.adstack_specialized_pipelines - at.adstack_specialized_pipelines, cap);
  EXPECT_EQ(full.pipelines_pending, 0u);
  // Each shape's first launch ran generic while its pipeline was made, the second specialized.
  EXPECT_EQ(full.adstack_specialize_pending - at.adstack_specialize_pending, cap);
  EXPECT_EQ(full.adstack_specialized_dispatches - at.adstack_specialized_dispatches, cap);
  EXPECT_EQ(full.adstack_specialize_misses, at.adstack_specialize_misses);
  // One more shape: past the cap, the generic pipeline runs it and nothing is made.
  const uint32_t more[] = {1000};
  launch_sizes(*s_, *k, more);
  if (HasFatalFailure()) return;
  runtime::RuntimeStats past = *s_->runtime().stats();
  EXPECT_EQ(past.pipelines_created, full.pipelines_created);
  EXPECT_EQ(past.adstack_specialize_misses - full.adstack_specialize_misses, 2u);
  EXPECT_EQ(past.adstack_specialized_dispatches, full.adstack_specialized_dispatches);
}

// A kernel's generic pipeline is made on a thread from its registration
// (RuntimeOptions::background_pipelines): compile returns before the driver is done. Where the
// driver refuses it there (out of memory), the first launch makes it again; refused again, the
// launch reports it, naming the pipeline, and runs nothing; failed creations are not counted as
// made, and the next launch makes it and computes the right result.
TEST_F(SessionTest, AGenericPipelineThatFailsOnItsThreadFailsTheFirstLaunchAndIsMadeAgain) {
  const char* env = std::getenv("VKAD_BACKGROUND_PIPELINES");
  if (env != nullptr && std::string(env) == "0") GTEST_SKIP() << "turned off in the environment";
  runtime::RuntimeStats at = *s_->runtime().stats();
  // Two refusals: the thread's and the first launch's.
  rhi::FaultInjection::arm("vkCreateComputePipelines", VK_ERROR_OUT_OF_DEVICE_MEMORY, 0, 2);
  auto k = s_->compile(reverse_twice());
  ASSERT_TRUE(k.ok()) << k.status().to_string();  // validated; the driver's part on a thread
  s_->runtime().finish_pipelines();
  EXPECT_EQ(s_->runtime().stats()->pipelines_created, at.pipelines_created)
      << "a failed creation is no pipeline";
  constexpr uint32_t kN = 37;
  auto x = s_->ndarray(DType::kF32, {kN}, "x");
  auto out = s_->ndarray(DType::kF32, {kN}, "out");
  ASSERT_TRUE(x.ok() && out.ok());
  std::vector<float> in(kN);
  for (uint32_t i = 0; i < kN; ++i) in[i] = 1.0f + static_cast<float>(i);
  ASSERT_TRUE(s_->upload(*x, std::span<const float>(in)).ok());
  Status first = s_->launch(*k, {Arg::ndarray(*x), Arg::ndarray(*out)});
  rhi::FaultInjection::disarm_all();
  ASSERT_FALSE(first.ok()) << "the launch ran without its pipeline";
  EXPECT_NE(first.message().find("reverse_twice.main"), std::string::npos) << first.to_string();
  EXPECT_NE(first.message().find("VK_ERROR_OUT_OF_DEVICE_MEMORY"), std::string::npos)
      << first.to_string();
  ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(*x), Arg::ndarray(*out)}).ok());
  std::vector<float> got(kN);
  ASSERT_TRUE(s_->download(*out, std::span<float>(got)).ok());
  for (uint32_t i = 0; i < kN; ++i) ASSERT_EQ(got[i], in[kN - 1 - i] * 2.0f) << "element " << i;
  EXPECT_GT(s_->runtime().stats()->pipelines_created, at.pipelines_created);
}

// Prepares in a batch (Runtime::begin_prepare_batch, what a step loop's rework uses): each
// returns with its pipelines started on threads, the batch's end waits for them all, and the
// launches after it run specialized with the right results, nothing left to make; a launch
// inside the batch is refused and leaves the runtime usable.
TEST_F(SessionTest, PreparesInABatchMakeTheirPipelinesSideBySide) {
  if (shapes_forced_off()) GTEST_SKIP() << "shape specialization turned off in the environment";
  Reverse a, b;
  make_reverse(*s_, 41, &a);
  make_reverse(*s_, 53, &b);
  if (HasFatalFailure()) return;
  s_->runtime().finish_pipelines();
  runtime::RuntimeStats at = *s_->runtime().stats();
  s_->runtime().begin_prepare_batch();
  ASSERT_TRUE(s_->prepare(a.k, a.args()).ok());
  ASSERT_TRUE(s_->prepare(b.k, b.args()).ok());
  Status inside = s_->launch(a.k, a.args());
  EXPECT_EQ(inside.code(), ErrorCode::kFailedPrecondition) << inside.to_string();
  s_->runtime().end_prepare_batch();
  runtime::RuntimeStats prepared = *s_->runtime().stats();
  EXPECT_EQ(prepared.pipelines_created, at.pipelines_created + 2);  // one per shape
  EXPECT_EQ(prepared.pipelines_pending, 0u);
  ASSERT_TRUE(s_->launch(a.k, a.args()).ok());
  ASSERT_TRUE(s_->launch(b.k, b.args()).ok());
  runtime::RuntimeStats launched = *s_->runtime().stats();
  EXPECT_EQ(launched.adstack_specialized_dispatches, at.adstack_specialized_dispatches + 2);
  EXPECT_EQ(launched.pipelines_created, prepared.pipelines_created);
  expect_reversed(*s_, a);
  expect_reversed(*s_, b);
}

// prepare() makes a shape's pipeline at once: the first launch already runs it.
TEST_F(SessionTest, PrepareMakesAShapesPipelineBeforeItsFirstLaunch) {
  if (shapes_forced_off()) GTEST_SKIP() << "shape specialization turned off in the environment";
  Reverse r;
  make_reverse(*s_, 77, &r);
  if (HasFatalFailure()) return;
  runtime::RuntimeStats at = *s_->runtime().stats();
  ASSERT_TRUE(s_->prepare(r.k, r.args()).ok());
  runtime::RuntimeStats prepared = *s_->runtime().stats();
  EXPECT_EQ(prepared.pipelines_created, at.pipelines_created + 1);
  EXPECT_EQ(prepared.pipelines_pending, 0u);
  ASSERT_TRUE(s_->launch(r.k, r.args()).ok());
  runtime::RuntimeStats launched = *s_->runtime().stats();
  EXPECT_EQ(launched.adstack_specialized_dispatches, at.adstack_specialized_dispatches + 1);
  EXPECT_EQ(launched.adstack_specialize_pending, at.adstack_specialize_pending);
  expect_reversed(*s_, r);
}

// A shape's pipeline whose creation fails on its thread (the driver out of memory) leaves the
// kernel running its generic pipeline: launches go on with the right results, the failed
// creation is not counted as made, and the session stays usable.
TEST_F(SessionTest, AShapesPipelineThatFailsOnItsThreadLeavesTheGenericOne) {
  if (shapes_forced_off()) GTEST_SKIP() << "shape specialization turned off in the environment";
  auto k = s_->compile(reverse_twice());
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  // Its generic pipeline, made on a thread from compile, made before the fault is armed.
  s_->runtime().finish_pipelines();
  runtime::RuntimeStats at = *s_->runtime().stats();
  rhi::FaultInjection::arm("vkCreateComputePipelines", VK_ERROR_OUT_OF_DEVICE_MEMORY);
  const uint32_t sizes[] = {300};
  launch_sizes(*s_, *k, sizes);  // the first launch asks for it, the second finds it failed
  rhi::FaultInjection::disarm_all();
  if (HasFatalFailure()) return;
  runtime::RuntimeStats after = *s_->runtime().stats();
  EXPECT_EQ(after.pipelines_created, at.pipelines_created) << "a failed creation is no pipeline";
  EXPECT_EQ(after.adstack_specialized_pipelines, at.adstack_specialized_pipelines);
  EXPECT_EQ(after.adstack_specialize_pending - at.adstack_specialize_pending, 1u);
  EXPECT_EQ(after.adstack_specialize_misses - at.adstack_specialize_misses, 1u);
  EXPECT_EQ(after.adstack_specialized_dispatches, at.adstack_specialized_dispatches);
  // Another shape is specialized as usual.
  const uint32_t other[] = {301};
  launch_sizes(*s_, *k, other);
  EXPECT_EQ(s_->runtime().stats()->adstack_specialized_dispatches,
            at.adstack_specialized_dispatches + 1);
}

// Saving the driver's pipeline cache merges into the VkPipelineCache a pipeline being made on
// a thread reads: the save waits for such pipelines first (and saves them too).
TEST_F(SessionTest, SavingThePipelineCacheWaitsForThePipelinesBeingMade) {
  if (shapes_forced_off()) GTEST_SKIP() << "shape specialization turned off in the environment";
  Reverse r;
  make_reverse(*s_, 123, &r);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(s_->launch(r.k, r.args()).ok());
  EXPECT_EQ(s_->runtime().stats()->pipelines_pending, 1u);  // asked for, not taken in yet
  ASSERT_TRUE(s_->runtime().save_pipeline_cache().ok());
  EXPECT_EQ(s_->runtime().stats()->pipelines_pending, 0u);
  ASSERT_TRUE(s_->launch(r.k, r.args()).ok());
  expect_reversed(*s_, r);
}

// A graph captured while a launch's shape pipeline was still being made would keep the generic
// pipeline in that launch's plan for good: a replay that finds the pipeline made plans the
// launch again, so it runs specialized from then on.
TEST_F(SessionTest, AGraphCapturedWhileAShapesPipelineWasMadeReplaysItSpecialized) {
  if (shapes_forced_off()) GTEST_SKIP() << "shape specialization turned off in the environment";
  Reverse r;
  make_reverse(*s_, 211, &r);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(s_->begin_capture("one").ok());
  ASSERT_TRUE(s_->launch(r.k, r.args()).ok());  // asks for it
  auto g = s_->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  s_->runtime().finish_pipelines();  // made; the graph's plan still names the generic one
  const runtime::RuntimeStats at = *s_->runtime().stats();
  for (int rep = 0; rep < 2; ++rep) ASSERT_TRUE(s_->replay(*g).ok());
  const runtime::RuntimeStats after = *s_->runtime().stats();
  EXPECT_EQ(after.adstack_specialized_dispatches - at.adstack_specialized_dispatches, 2u);
  EXPECT_EQ(after.adstack_specialize_pending, at.adstack_specialize_pending);
  expect_reversed(*s_, r);
}

// compile.specialize_shapes = false: the generic pipeline, made at compile, runs every shape.
TEST(SessionShapes, TurnedOffTheGenericPipelineRunsEveryShape) {
  bool skipped = false;
  auto s =
      validated_session(&skipped, [](SessionOptions& o) { o.compile.specialize_shapes = false; });
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_TRUE(s);
  runtime::RuntimeStats before = *s->runtime().stats();
  auto k = s->compile(reverse_twice());
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  EXPECT_EQ(s->runtime().stats()->pipelines_created, before.pipelines_created + 1);
  const uint32_t sizes[] = {5, 42, 1000};
  launch_sizes(*s, *k, sizes);
  if (HasFatalFailure()) return;
  runtime::RuntimeStats after = *s->runtime().stats();
  EXPECT_EQ(after.pipelines_created, before.pipelines_created + 1);
  EXPECT_EQ(after.adstack_specialized_dispatches, before.adstack_specialized_dispatches);
  expect_no_validation_messages(*s);
}

TEST(SessionImport, RunsOnAnImportedDeviceAndLeavesItAlive) {
  rhi::DeviceOptions own;
  own.enable_validation = true;
  auto host = rhi::Device::create(own);
  if (!host.ok() && host.status().code() == ErrorCode::kNoDevice)
    GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  rhi::Device& embedder = **host;
  for (int round = 0; round < 2; ++round) {
    runtime::RuntimeOptions ro;
    ro.device.external = external_from(embedder);
    if (round == 1) {  // features not stated are not used, even where the device has them
      ro.device.external->enabled.shader_float64 = false;
      ro.device.external->enabled.push_descriptor = false;
    }
    auto s = Session::create(ro, {});
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_TRUE((*s)->runtime().device().imported());
    if (round == 1) {
      EXPECT_FALSE((*s)->target().float64);
      EXPECT_FALSE((*s)->runtime().caps().push_descriptor);
    }
    KernelBuilder kb("twice");
    Array x = kb.ndarray("x", DType::kF32, 1);
    kb.parallel_for("main", 0, x.dim(0), [&](Value i) { x.store({i}, x(i) * 2.0); });
    auto k = (*s)->compile(kb.finish());
    ASSERT_TRUE(k.ok()) << k.status().to_string();
    auto h = (*s)->ndarray(DType::kF32, {1000}, "x");
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE((*s)->fill(*h, 1.5).ok());
    ASSERT_TRUE((*s)->launch(*k, {Arg::ndarray(*h)}).ok());
    std::vector<float> out(1000);
    ASSERT_TRUE((*s)->download(*h, std::span<float>(out)).ok());
    for (float v : out) ASSERT_EQ(v, 3.0f);
  }  // each session destroyed here: the device must survive it
  auto buf = embedder.create_buffer({4096, rhi::MemoryUsage::kDeviceLocal, "after"});
  EXPECT_TRUE(buf.ok()) << buf.status().to_string();
  EXPECT_EQ(embedder.validation_message_count(), 0u) << [&] {
    std::string all;
    for (const auto& m : embedder.validation_messages()) all += m + "\n";
    return all;
  }();
}

TEST(SessionImport, BadExternalDevicesAreRejectedByName) {
  rhi::DeviceOptions own;
  own.enable_validation = true;
  auto host = rhi::Device::create(own);
  if (!host.ok() && host.status().code() == ErrorCode::kNoDevice)
    GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_TRUE(host.ok());
  runtime::RuntimeOptions ro;
  ro.device.external = external_from(**host);
  ro.device.external->device = VK_NULL_HANDLE;
  auto s = Session::create(ro, {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("must all be set"), std::string::npos);
  ro.device.external = external_from(**host);
  ro.device.external->queue_family = 99;
  s = Session::create(ro, {});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("queue family 99"), std::string::npos)
      << s.status().message();
  ro.device.external = external_from(**host);
  ro.device.external->first_queue = 50;
  s = Session::create(ro, {});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("queues 50..51"), std::string::npos) << s.status().message();
  // A range whose end wraps in 32 bits (1 + 0xFFFFFFFF) is refused, not taken as queues 1..0.
  ro.device.external = external_from(**host);
  ro.device.external->first_queue = 1;
  ro.device.external->queue_count = 0xFFFFFFFFu;
  s = Session::create(ro, {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("queues 1..4294967296"), std::string::npos)
      << s.status().message();
}

}  // namespace
}  // namespace vkad::testing
