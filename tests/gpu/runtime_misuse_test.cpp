// Misuse of the Runtime API, as a hostile or careless caller does it: every case is an error
// value that names what is wrong and where (never a crash, never silent success).
#include <cstring>
#include <limits>

#include "abi/spirv_tools.h"
#include "api/device_target.h"
#include "autodiff/reverse_mode.h"
#include "gpu/gpu_test.h"
#include "ir/text.h"
#include "rhi/vk_check.h"
#include "runtime/counted_launch.h"
#include "runtime/graphs.h"
#include "runtime/runtime.h"
#include "spirv/compiler.h"

namespace vkad::testing {
namespace {

using runtime::Arg;
using runtime::DType;
using runtime::Runtime;

std::unique_ptr<Runtime> make_runtime(bool* skipped, runtime::RuntimeOptions o = {}) {
  o.device.enable_validation = true;
  o.max_list_age_us = 1e12;
  auto r = Runtime::create(o);
  if (!r.ok() && r.status().code() == ErrorCode::kNoDevice) {
    *skipped = true;
    return nullptr;
  }
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

#define EXPECT_ERROR(expr, want, needle)                                     \
  do {                                                                       \
    Status s_ = (expr);                                                      \
    EXPECT_EQ(s_.code(), want) << s_.to_string();                            \
    EXPECT_NE(s_.message().find(needle), std::string::npos) << s_.message(); \
  } while (0)

class RuntimeMisuse : public ::testing::Test {
 protected:
  void SetUp() override { rt_ = make_runtime(&skipped_); }
  void TearDown() override {
    for (Runtime* rt : {rt_.get(), other_.get()}) {
      if (!rt) continue;
      std::string all;
      for (const auto& m : rt->device().validation_messages()) all += m + "\n";
      EXPECT_EQ(rt->device().validation_message_count(), 0u) << all;
    }
  }
  runtime::NdArrayHandle array(Runtime& rt, std::vector<float> v, const std::string& name) {
    auto h = rt.create_ndarray(DType::kF32, {static_cast<uint32_t>(v.size())}, name);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    EXPECT_TRUE(rt.upload(*h, v.data(), 4 * v.size()).ok());
    return *h;
  }
  std::vector<float> read(Runtime& rt, runtime::NdArrayHandle h, size_t n) {
    std::vector<float> out(n);
    Status s = rt.download(h, out.data(), 4 * n);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return out;
  }
  bool skipped_ = false;
  std::unique_ptr<Runtime> rt_, other_;
};

#define SKIP_IF_NO_DEVICE() \
  if (skipped_) GTEST_SKIP() << "SKIPPED: no Vulkan device"

TEST_F(RuntimeMisuse, NullPointersAndWrongSizesInUploadAndDownload) {
  SKIP_IF_NO_DEVICE();
  auto h = array(*rt_, std::vector<float>(16, 1.0f), "buf");
  EXPECT_ERROR(rt_->upload(h, nullptr, 64), ErrorCode::kInvalidArgument,
               "upload to 'buf': the data pointer is null");
  EXPECT_ERROR(rt_->download(h, nullptr, 64), ErrorCode::kInvalidArgument,
               "download from 'buf': the output pointer is null");
  float one = 0;
  EXPECT_ERROR(rt_->upload(h, &one, 0), ErrorCode::kInvalidArgument,
               "0 bytes given, the array holds 64");
  EXPECT_ERROR(rt_->download(h, &one, 0), ErrorCode::kInvalidArgument,
               "0 bytes requested, the array holds 64");
  EXPECT_EQ(rt_->stats()->ctx_bytes_recording, 64u) << "only the first upload was recorded";
  EXPECT_EQ(read(*rt_, h, 16)[3], 1.0f);
}

TEST_F(RuntimeMisuse, HandlesOfAnotherRuntimeAreRejectedNamingTheHandle) {
  SKIP_IF_NO_DEVICE();
  other_ = make_runtime(&skipped_);
  ASSERT_TRUE(other_);
  // Both runtimes hold objects created in the same order, so plain counters would coincide.
  auto ax = array(*rt_, std::vector<float>(32, 1.0f), "a.x");
  auto ay = array(*rt_, std::vector<float>(32, 10.0f), "a.y");
  auto ka = rt_->register_kernel(make_axpy_kernel("axpy_add"));
  auto bx = array(*other_, std::vector<float>(32, 2.0f), "b.x");
  auto by = array(*other_, std::vector<float>(32, 20.0f), "b.y");
  auto kb = other_->register_kernel(make_axpy_kernel("axpy_sub", "OpFSub"));
  ASSERT_TRUE(ka.ok() && kb.ok());
  ASSERT_NE(ka->id, kb->id);
  ASSERT_NE(ax.id, bx.id);

  Arg own[] = {Arg::f32(1.0f), Arg::ndarray(ax), Arg::ndarray(ay)};
  Arg foreign_arrays[] = {Arg::f32(1.0f), Arg::ndarray(bx), Arg::ndarray(by)};
  std::string kb_name = "kernel handle " + runtime::handle_string(kb->id);
  EXPECT_ERROR(rt_->launch(*kb, own), ErrorCode::kInvalidArgument, kb_name + " belongs to runtime");
  EXPECT_ERROR(
      rt_->launch(*ka, foreign_arrays), ErrorCode::kInvalidArgument,
      "argument 1 ('x'): ndarray handle " + runtime::handle_string(bx.id) + " belongs to runtime");
  float buf[32] = {};
  EXPECT_ERROR(rt_->upload(by, buf, sizeof buf), ErrorCode::kInvalidArgument,
               "upload: ndarray handle");
  EXPECT_ERROR(rt_->download(by, buf, sizeof buf), ErrorCode::kInvalidArgument,
               "belongs to runtime");
  EXPECT_ERROR(rt_->free_ndarray(by), ErrorCode::kInvalidArgument, "free_ndarray: ndarray handle");
  EXPECT_ERROR(rt_->shape(by).status(), ErrorCode::kInvalidArgument, "shape: ndarray handle");
  EXPECT_ERROR(rt_->extent(by, 0).status(), ErrorCode::kInvalidArgument, "extent: ndarray handle");
  EXPECT_ERROR(rt_->unregister_kernel(*kb), ErrorCode::kInvalidArgument, "belongs to runtime");
  // A kernel handle is not an ndarray handle.
  EXPECT_ERROR(rt_->free_ndarray({ka->id}), ErrorCode::kNotFound, "was freed or never existed");

  // Nothing of the other runtime was touched: its arrays and kernel still work as before.
  EXPECT_EQ(read(*other_, by, 32)[0], 20.0f);
  Arg b_args[] = {Arg::f32(1.0f), Arg::ndarray(bx), Arg::ndarray(by)};
  ASSERT_TRUE(other_->launch(*kb, b_args).ok());
  EXPECT_EQ(read(*other_, by, 32)[0], 2.0f - 20.0f);
  ASSERT_TRUE(rt_->launch(*ka, own).ok());
  EXPECT_EQ(read(*rt_, ay, 32)[0], 11.0f);
}

TEST_F(RuntimeMisuse, FreedAndMadeUpHandlesAreNotFound) {
  SKIP_IF_NO_DEVICE();
  auto h = array(*rt_, std::vector<float>(8, 1.0f), "gone");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE(rt_->free_ndarray(h).ok());
  ASSERT_TRUE(rt_->unregister_kernel(*k).ok());
  std::string hn = "ndarray handle " + runtime::handle_string(h.id) + " was freed or never existed";
  EXPECT_ERROR(rt_->free_ndarray(h), ErrorCode::kNotFound, hn);
  EXPECT_ERROR(rt_->shape(h).status(), ErrorCode::kNotFound, hn);
  EXPECT_ERROR(rt_->extent(h, 0).status(), ErrorCode::kNotFound, hn);
  EXPECT_ERROR(rt_->unregister_kernel(*k), ErrorCode::kNotFound, "was freed or never existed");
  EXPECT_ERROR(rt_->free_ndarray({12345}), ErrorCode::kNotFound, "ndarray handle 0:12345");
  // A new array never reuses the freed handle.
  auto again = rt_->create_ndarray(DType::kF32, {8});
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->id, h.id);
}

// extent() reads one axis without the shape's copy (the tape's per-launch checks); past the
// rank it names the axis and the array.
TEST_F(RuntimeMisuse, ExtentIsEachAxisOfTheShapeAndRefusesAnAxisPastTheRank) {
  SKIP_IF_NO_DEVICE();
  auto h = rt_->create_ndarray(DType::kF32, {3, 5, 7}, "box");
  ASSERT_TRUE(h.ok());
  auto shape = rt_->shape(*h);
  ASSERT_TRUE(shape.ok());
  for (uint32_t axis = 0; axis < 3; ++axis) {
    auto e = rt_->extent(*h, axis);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_EQ(*e, (*shape)[axis]);
  }
  EXPECT_ERROR(rt_->extent(*h, 3).status(), ErrorCode::kInvalidArgument,
               "extent: axis 3 of 'box', which has 3 axes");
}

TEST_F(RuntimeMisuse, OnlyAReservedKernelHandleIsRegisteredUnderAndOnlyOnce) {
  SKIP_IF_NO_DEVICE();
  auto r = rt_->reserve_kernel_handle();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // Named nothing until registered; then the kernel is launched through it.
  EXPECT_ERROR(rt_->unregister_kernel(*r), ErrorCode::kNotFound, "was freed or never existed");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"), false, *r);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  EXPECT_EQ(k->id, r->id);
  auto x = array(*rt_, std::vector<float>(8, 2.0f), "x");
  auto y = array(*rt_, std::vector<float>(8, 1.0f), "y");
  const Arg args[] = {Arg::f32(3.0f), Arg::ndarray(x), Arg::ndarray(y)};
  ASSERT_TRUE(rt_->launch(*k, args).ok());
  std::vector<float> out(8);
  ASSERT_TRUE(rt_->download(y, out.data(), 32).ok());
  EXPECT_EQ(out[5], 7.0f);
  // Used up: a second registration under it, or under a handle never reserved, is refused.
  EXPECT_ERROR(rt_->register_kernel(make_axpy_kernel("again"), false, *r).status(),
               ErrorCode::kInvalidArgument, "is not a handle reserve_kernel_handle() gave");
  EXPECT_ERROR(rt_->register_kernel(make_axpy_kernel("made_up"), false, runtime::KernelHandle{x.id})
                   .status(),
               ErrorCode::kInvalidArgument, "is not a handle reserve_kernel_handle() gave");
}

TEST_F(RuntimeMisuse, ShapesWhoseSizeOverflowsAreRejected) {
  SKIP_IF_NO_DEVICE();
  // 2^32-1 squared times 2^32-1 ... wraps 64 bits; so does 2^64 + 30 elements.
  const uint32_t m = std::numeric_limits<uint32_t>::max();
  EXPECT_ERROR(
      rt_->create_ndarray(DType::kF32, {m, m, m}, "huge").status(), ErrorCode::kInvalidArgument,
      "ndarray 'huge': shape (4294967295, 4294967295, 4294967295) of f32 overflows 64 bits");
  // 2^31 * 2^31 * 4 * 4 bytes = 2^66 bytes: the element count fits, the bytes do not.
  EXPECT_ERROR(rt_->create_ndarray(DType::kF32, {1u << 31, 1u << 31, 4}, "wide").status(),
               ErrorCode::kInvalidArgument, "overflows 64 bits");
  EXPECT_EQ(rt_->stats()->ndarrays, 0u);
}

TEST_F(RuntimeMisuse, RankAndDtypeOutOfRangeAreRejected) {
  SKIP_IF_NO_DEVICE();
  EXPECT_ERROR(rt_->create_ndarray(DType::kF32, {1, 1, 1, 1, 1, 1, 1, 1, 1}, "r9").status(),
               ErrorCode::kInvalidArgument, "ndarray 'r9': rank 9");
  EXPECT_ERROR(rt_->create_ndarray(static_cast<DType>(42), {4}, "bad").status(),
               ErrorCode::kInvalidArgument, "ndarray 'bad': dtype value 42 is not a DType");
  EXPECT_TRUE(rt_->create_ndarray(DType::kF32, {1, 1, 1, 1, 1, 1, 1, 2}, "r8").ok());
}

// A count of counted loops no adjoint can take is refused before it sizes anything: 2^26 + 1
// wrapped counted * kTripSlots to 64 words in 32 bits, and the host loop read past its buffer.
TEST_F(RuntimeMisuse, LaunchCountedWithAnImpossibleCountIsRefused) {
  SKIP_IF_NO_DEVICE();
  const Arg none[] = {Arg::f32(1.0f)};
  for (uint32_t counted : {(1u << 26) + 1, 0xFFFFFFFFu, runtime::kMaxKernelParams}) {
    EXPECT_ERROR(runtime::launch_counted(*rt_, {}, {}, counted, 1, none),
                 ErrorCode::kInvalidArgument,
                 "launch_counted: " + std::to_string(counted) + " counted loops");
  }
  EXPECT_EQ(rt_->stats()->launches, 0u);
}

// "while v^2 > 0.01: v = 0.9 sin v" in f32 (every device has it), without max_trip: one counted
// loop.
const char* kCountedHalve = R"(kernel shrink(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f32
    %x = load x[%i] : f32
    store_local %v, %x
    %g = const 0.9 : f32
    %eps = const 0.01 : f32
    while %k (%c) {
      %a = load_local %v : f32
      %a2 = mul %a, %a : f32
      %c = gt %a2, %eps : bool
    } do {
      %b = load_local %v : f32
      %s = sin %b : f32
      %h = mul %s, %g : f32
      store_local %v, %h
    }
    %o = load_local %v : f32
    store y[%i], %o
  }
})";

// launch_forward_counted and launch_counted_adjoint refuse each misuse with an error that names
// it, and the trips array never outlives a failed call: the adjoint side frees it on every path
// (a wrong count, a dead adjoint launch, another array in its place), the forward side leaves
// nothing behind. RuntimeStats::ndarrays counts the live arrays.
TEST_F(RuntimeMisuse, ForwardCountedPairStatesEachMisuseAndFreesTheTrips) {
  SKIP_IF_NO_DEVICE();
  auto k = codegen::parse(kCountedHalve);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  const codegen::Target target = codegen::target_from_caps(rt_->caps());
  auto ca = codegen::make_adjoint_counted(*k, target);
  ASSERT_TRUE(ca.ok()) << ca.status().to_string();
  ASSERT_EQ(ca->counted, 1u);
  auto compiled = [&](const codegen::Kernel& kernel) {
    auto c = codegen::compile(kernel, target);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    auto h = rt_->register_kernel(*c);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    return *h;
  };
  const runtime::KernelHandle hf = compiled(ca->counting_forward), ha = compiled(ca->adjoint),
                              plain = compiled(*k);
  const std::vector<float> xs = {0.3f, -0.9f, 2.5f, 1.1f, -4.0f, 0.05f, 0.7f, 3.3f};
  auto x = array(*rt_, xs, "x"), y = array(*rt_, std::vector<float>(8, 0.0f), "y"),
       xg = array(*rt_, std::vector<float>(8, 0.0f), "x_grad"),
       yg = array(*rt_, std::vector<float>(8, 1.0f), "y_grad");
  const Arg fargs[] = {Arg::ndarray(x), Arg::ndarray(y)};
  const Arg aargs[] = {Arg::ndarray(x), Arg::ndarray(y), Arg::ndarray(xg), Arg::ndarray(yg)};
  const uint64_t live = rt_->stats()->ndarrays;
  auto arrays_back_to_live = [&] { return rt_->stats()->ndarrays == live; };

  // The forward side: nothing launched, nothing left, `trips` unchanged.
  runtime::NdArrayHandle trips{};
  EXPECT_ERROR(runtime::launch_forward_counted(*rt_, hf, 1, fargs, nullptr),
               ErrorCode::kInvalidArgument, "launch_forward_counted: `trips` is null");
  EXPECT_ERROR(runtime::launch_forward_counted(*rt_, hf, (1u << 26) + 1, fargs, &trips),
               ErrorCode::kInvalidArgument, "launch_forward_counted: 67108865 counted loops");
  // The plain forward in place of the counting one: one parameter short for the trips array.
  EXPECT_ERROR(runtime::launch_forward_counted(*rt_, plain, 1, fargs, &trips),
               ErrorCode::kInvalidArgument,
               "launch of 'shrink': 3 arguments given, the kernel takes 2");
  EXPECT_ERROR(runtime::launch_forward_counted(*rt_, runtime::KernelHandle{}, 1, fargs, &trips),
               ErrorCode::kNotFound, "launch: kernel handle");
  // Inside a graph capture: refused with nothing captured (a replay would reuse the per-call
  // trips array after launch_counted_adjoint freed it).
  ASSERT_TRUE(rt_->graphs().begin_capture("step").ok());
  EXPECT_ERROR(runtime::launch_forward_counted(*rt_, hf, 1, fargs, &trips),
               ErrorCode::kFailedPrecondition, "graph 'step' is being captured");
  auto graph = rt_->graphs().end_capture();
  ASSERT_TRUE(graph.ok());
  EXPECT_TRUE(rt_->graphs().replay(*graph).ok());  // an empty graph: launches no kernel
  EXPECT_TRUE(rt_->graphs().release_graph(*graph).ok());
  EXPECT_EQ(trips.id, 0u);
  EXPECT_TRUE(arrays_back_to_live());
  EXPECT_EQ(rt_->stats()->launches, 0u);

  // The adjoint side, each after a forward that worked.
  auto forward = [&] {
    runtime::NdArrayHandle t{};
    Status st = runtime::launch_forward_counted(*rt_, hf, 1, fargs, &t);
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_NE(t.id, 0u);
    return t;
  };
  EXPECT_ERROR(runtime::launch_counted_adjoint(*rt_, ha, 2, forward(), aargs),
               ErrorCode::kInvalidArgument,
               "launch_counted_adjoint: trips: an i32 array of shape (64), a trips array for 1 "
               "counted loop; 2 "
               "counted loops need an i32 array of 128 elements");
  EXPECT_TRUE(arrays_back_to_live());
  EXPECT_ERROR(runtime::launch_counted_adjoint(*rt_, ha, 0, forward(), aargs),
               ErrorCode::kInvalidArgument, "0 counted loops take the null handle {}");
  EXPECT_TRUE(arrays_back_to_live());
  EXPECT_ERROR(runtime::launch_counted_adjoint(*rt_, ha, 0xFFFFFFFFu, forward(), aargs),
               ErrorCode::kInvalidArgument, "launch_counted_adjoint: 4294967295 counted loops");
  EXPECT_TRUE(arrays_back_to_live());
  // The forward's arguments in place of the adjoint's: the launch refuses them.
  EXPECT_ERROR(runtime::launch_counted_adjoint(*rt_, ha, 1, forward(), fargs),
               ErrorCode::kInvalidArgument, "arguments given, the kernel takes 5");
  EXPECT_TRUE(arrays_back_to_live());
  EXPECT_ERROR(runtime::launch_counted_adjoint(*rt_, runtime::KernelHandle{}, 1, forward(), aargs),
               ErrorCode::kNotFound, "launch: kernel handle");
  EXPECT_TRUE(arrays_back_to_live());
  // Dead, null and foreign trips handles: the runtime's words, after this call's name.
  runtime::NdArrayHandle dead = forward();
  ASSERT_TRUE(rt_->free_ndarray(dead).ok());
  EXPECT_ERROR(runtime::launch_counted_adjoint(*rt_, ha, 1, dead, aargs), ErrorCode::kNotFound,
               "launch_counted_adjoint: trips: ndarray handle " + runtime::handle_string(dead.id) +
                   " was freed or never existed");
  EXPECT_ERROR(runtime::launch_counted_adjoint(*rt_, ha, 1, {}, aargs), ErrorCode::kNotFound,
               "launch_counted_adjoint: trips: ndarray handle");
  other_ = make_runtime(&skipped_);
  ASSERT_NE(other_, nullptr);
  auto foreign = other_->create_ndarray(DType::kI32, {runtime::kTripSlots}, "trips");
  ASSERT_TRUE(foreign.ok());
  EXPECT_ERROR(runtime::launch_counted_adjoint(*rt_, ha, 1, *foreign, aargs),
               ErrorCode::kInvalidArgument,
               "launch_counted_adjoint: trips: ndarray handle " +
                   runtime::handle_string(foreign->id) + " belongs to runtime");
  EXPECT_EQ(other_->stats()->ndarrays, 1u);  // not this runtime's to free
  EXPECT_TRUE(arrays_back_to_live());
  // Another of the caller's arrays given as trips: refused, and consumed as trips is.
  auto scratch = array(*rt_, std::vector<float>(64, 0.0f), "scratch");
  EXPECT_ERROR(runtime::launch_counted_adjoint(*rt_, ha, 1, scratch, aargs),
               ErrorCode::kInvalidArgument,
               "launch_counted_adjoint: trips: an f32 array of shape (64); 1 counted loop needs an "
               "i32 array of 64 "
               "elements");
  EXPECT_TRUE(arrays_back_to_live());
  EXPECT_TRUE(rt_->synchronize().ok());
  const uint64_t launches = rt_->stats()->launches;

  // And the pair as meant: the adjoint from the forward's counts, trips freed; the gradient is
  // launch_counted's.
  Status st = runtime::launch_counted_adjoint(*rt_, ha, 1, forward(), aargs);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(arrays_back_to_live());
  EXPECT_EQ(rt_->stats()->launches, launches + 2);
  const std::vector<float> from_forward = read(*rt_, xg, 8);
  auto hc = compiled(ca->counter);
  ASSERT_TRUE(rt_->fill(xg, 0.0).ok());
  st = runtime::launch_counted(*rt_, hc, ha, 1, 2, aargs);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(read(*rt_, xg, 8), from_forward);
  EXPECT_NE(from_forward, std::vector<float>(8, 0.0f));
  // With nothing counted the forward given is launched as is, no array made, and the adjoint
  // (here given its trips_ argument by hand) too.
  st = runtime::launch_forward_counted(*rt_, plain, 0, fargs, &trips);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(trips.id, 0u);
  EXPECT_TRUE(arrays_back_to_live());
  const Arg by_hand[] = {Arg::ndarray(x), Arg::ndarray(y), Arg::ndarray(xg), Arg::ndarray(yg),
                         Arg::i32(64)};
  st = runtime::launch_counted_adjoint(*rt_, ha, 0, {}, by_hand);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(rt_->synchronize().ok());
}

TEST_F(RuntimeMisuse, ZeroMaxGroupsIsRejected) {
  SKIP_IF_NO_DEVICE();
  runtime::RuntimeOptions o;
  o.max_groups = 0;
  auto r = Runtime::create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("max_groups is 0"), std::string::npos)
      << r.status().message();
  o.max_groups = std::numeric_limits<uint32_t>::max();
  r = Runtime::create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("maxComputeWorkGroupCount"), std::string::npos)
      << r.status().message();
}

TEST_F(RuntimeMisuse, BadForeignModulesAreRejectedBeforeTheDriver) {
  SKIP_IF_NO_DEVICE();
  auto expect_rejected = [&](runtime::CompiledKernel k, const std::string& needle) {
    auto r = rt_->register_kernel(k);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << r.status().to_string();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  const runtime::CompiledKernel good = make_axpy_kernel("axpy");
  std::string where = "register_kernel: kernel 'axpy' task '" + good.tasks[0].name + "': ";

  runtime::CompiledKernel truncated = good;
  truncated.tasks[0].spirv.resize(truncated.tasks[0].spirv.size() / 2);
  expect_rejected(truncated, where + "SPIR-V module does not validate");

  runtime::CompiledKernel headless = good;
  headless.tasks[0].spirv.resize(3);
  expect_rejected(headless, where + "SPIR-V module of 3 words has no SPIR-V header");

  // The module binds x and y at 1 and 2; a kernel declaring one ndarray has bindings 0..1.
  runtime::CompiledKernel fewer = good;
  fewer.params.pop_back();
  expect_rejected(fewer, "(set 0, binding 2): the kernel declares 2 bindings");

  runtime::CompiledKernel wrong_size = good;
  wrong_size.tasks[0].local_size = 32;
  expect_rejected(wrong_size, "LocalSize 64 1 1, the task declares local_size 32");

  runtime::CompiledKernel zero = good;
  zero.tasks[0].local_size = 0;
  expect_rejected(zero, "local_size 0 is outside 1..");

  // Push constants larger than the ABI's 8 bytes, binding in set 1, a uniform buffer.
  std::string scale_add = kScaleAddSpirv;  // 12-byte push constants, bindings 0 and 1
  auto words = codegen::assemble_spirv(scale_add);
  ASSERT_TRUE(words.ok()) << words.status().to_string();
  runtime::CompiledKernel big_pc;
  big_pc.name = "scale_add";
  big_pc.params = {{"x", runtime::ParamKind::kNdArray, DType::kU32, 1, false}};
  big_pc.tasks.push_back({"main", *words, 64});
  expect_rejected(big_pc, "push-constant block %");
  expect_rejected(big_pc, "is 12 bytes, the kernel ABI passes 8");

  auto set1 = good;
  auto set1_words =
      codegen::assemble_spirv(codegen::disassemble_spirv(good.tasks[0].spirv));  // round trip works
  ASSERT_TRUE(set1_words.ok());
  std::string text = codegen::disassemble_spirv(good.tasks[0].spirv);
  size_t at = text.find("DescriptorSet 0", text.find("Binding 1") - 40);
  ASSERT_NE(at, std::string::npos);
  std::string moved = text;
  moved.replace(text.find("DescriptorSet 0"), 15, "DescriptorSet 1");
  set1_words = codegen::assemble_spirv(moved);
  ASSERT_TRUE(set1_words.ok()) << set1_words.status().to_string();
  set1.tasks[0].spirv = *set1_words;
  expect_rejected(set1, "the kernel ABI uses descriptor set 0 only");

  EXPECT_EQ(rt_->stats()->pipelines_cached, 0u);
  EXPECT_TRUE(rt_->register_kernel(good).ok());
}

TEST_F(RuntimeMisuse, ScalarArgumentsThatDoNotFitTheirTypeAreRejected) {
  SKIP_IF_NO_DEVICE();
  auto hx = array(*rt_, std::vector<float>(8, 1.0f), "x");
  auto hy = array(*rt_, std::vector<float>(8, 1.0f), "y");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  Arg args[] = {Arg::f64(1e300), Arg::ndarray(hx), Arg::ndarray(hy)};
  args[0].dtype = DType::kF32;  // an f32 argument holding a double past f32's range
  EXPECT_ERROR(rt_->launch(*k, args), ErrorCode::kInvalidArgument,
               "launch of 'axpy', argument 0 ('a'): value");
  EXPECT_ERROR(rt_->launch(*k, args), ErrorCode::kInvalidArgument, "value 1e+300 does not fit f32");
  EXPECT_EQ(rt_->stats()->launches, 0u);
}

TEST_F(RuntimeMisuse, ForeignAdstackCapacitiesMustReferToIntegerParameters) {
  SKIP_IF_NO_DEVICE();
  runtime::CompiledKernel k = make_axpy_kernel("axpy");
  k.tasks[0].adstacks.push_back({"%s", adstack::Heap::kF32, adstack::SizeExpr::scalar(99)});
  EXPECT_ERROR(rt_->register_kernel(k).status(), ErrorCode::kInvalidArgument,
               "adstack %s has an unknown heap or a capacity that refers to a missing");
  k.tasks[0].adstacks[0].capacity = adstack::SizeExpr::scalar(0);  // 'a' is f32
  EXPECT_ERROR(rt_->register_kernel(k).status(), ErrorCode::kInvalidArgument, "adstack %s");
}

TEST_F(RuntimeMisuse, EveryCallReportsADeviceLoss) {
  SKIP_IF_NO_DEVICE();
  auto hx = array(*rt_, std::vector<float>(64, 1.0f), "x");
  auto hy = array(*rt_, std::vector<float>(64, 1.0f), "y");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  Arg args[] = {Arg::f32(1.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  ASSERT_TRUE(rt_->launch(*k, args).ok());
  rhi::FaultInjection::arm("vkQueueSubmit", VK_ERROR_DEVICE_LOST);
  EXPECT_EQ(rt_->flush().status().code(), ErrorCode::kDeviceLost);
  rhi::FaultInjection::disarm_all();
  std::vector<float> out(64);
  EXPECT_EQ(rt_->set_retirement_depth(1).code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(rt_->unregister_kernel(*k).code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(rt_->free_ndarray(hx).code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(rt_->shape(hx).status().code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(rt_->register_kernel(make_axpy_kernel("other")).status().code(),
            ErrorCode::kDeviceLost);
  EXPECT_EQ(rt_->create_ndarray(DType::kF32, {4}).status().code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(rt_->upload(hy, out.data(), 256).code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(rt_->download(hy, out.data(), 256).code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(rt_->launch(*k, args).code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(rt_->flush().status().code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(rt_->synchronize().code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(rt_->stats()->ndarrays, 2u) << "calls after the loss change nothing";
}

}  // namespace
}  // namespace vkad::testing
