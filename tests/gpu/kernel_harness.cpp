#include "gpu/kernel_harness.h"

#include <cmath>
#include <cstring>

#include "api/device_target.h"

namespace vkad::testing {

using codegen::HostArg;
using codegen::HostArray;
using runtime::DType;

std::vector<HostArg> HostArgs::view() {
  std::vector<HostArg> v;
  for (size_t i = 0; i < arrays.size(); ++i) {
    if (!arrays[i].shape.empty())
      v.push_back(HostArg::of(arrays[i]));
    else
      v.push_back(HostArg::of(scalars[i]));
  }
  return v;
}

HostArgs make_args(const codegen::Kernel& k, const std::vector<ArgSpec>& specs, uint32_t seed) {
  HostArgs a;
  std::mt19937 rng(seed);
  EXPECT_EQ(specs.size(), k.params.size()) << "kernel " << k.name;
  for (size_t i = 0; i < k.params.size() && i < specs.size(); ++i) {
    const codegen::Param& p = k.params[i];
    const ArgSpec& s = specs[i];
    if (p.kind == runtime::ParamKind::kScalar) {
      a.arrays.emplace_back();
      a.scalars.push_back(codegen::round_to(p.dtype, s.scalar));
      continue;
    }
    HostArray arr(p.dtype, s.shape);
    std::uniform_real_distribution<double> u(s.lo, s.hi);
    for (double& x : arr.data) {
      double r = u(rng);
      x = codegen::round_to(p.dtype, codegen::is_float(p.dtype) ? r : std::round(r));
    }
    a.arrays.push_back(std::move(arr));
    a.scalars.push_back(0);
  }
  return a;
}

std::unique_ptr<KernelRunner> KernelRunner::create(runtime::RuntimeOptions o, bool* skipped) {
  o.device.enable_validation = true;
  auto r = runtime::Runtime::create(o);
  if (!r.ok()) {
    if (skipped) *skipped = r.status().code() == ErrorCode::kNoDevice;
    if (r.status().code() != ErrorCode::kNoDevice) ADD_FAILURE() << r.status().to_string();
    return nullptr;
  }
  auto k = std::make_unique<KernelRunner>();
  k->rt_ = std::move(r).value();
  return k;
}

codegen::Target KernelRunner::target() const {
  codegen::Target t = codegen::target_from_caps(rt_->caps());
  if (layout_) t.adstack_layout = *layout_;
  return t;
}

namespace {

std::vector<std::byte> to_bytes(const HostArray& a) {
  uint32_t eb = runtime::dtype_bytes(a.dtype);
  std::vector<std::byte> out(a.size() * eb);
  for (size_t i = 0; i < a.size(); ++i) {
    std::byte* at = out.data() + i * eb;
    double v = a.data[i];
    switch (a.dtype) {
      case DType::kF32: {
        float f = static_cast<float>(v);
        std::memcpy(at, &f, 4);
        break;
      }
      case DType::kF64: std::memcpy(at, &v, 8); break;
      case DType::kI32: {
        int32_t x = static_cast<int32_t>(v);
        std::memcpy(at, &x, 4);
        break;
      }
      case DType::kI64: {
        int64_t x = static_cast<int64_t>(v);
        std::memcpy(at, &x, 8);
        break;
      }
      default: {
        uint32_t x = static_cast<uint32_t>(v);
        std::memcpy(at, &x, 4);
        break;
      }
    }
  }
  return out;
}

void from_bytes(HostArray& a, const std::vector<std::byte>& in) {
  uint32_t eb = runtime::dtype_bytes(a.dtype);
  for (size_t i = 0; i < a.size(); ++i) {
    const std::byte* at = in.data() + i * eb;
    switch (a.dtype) {
      case DType::kF32: {
        float f;
        std::memcpy(&f, at, 4);
        a.data[i] = f;
        break;
      }
      case DType::kF64: std::memcpy(&a.data[i], at, 8); break;
      case DType::kI32: {
        int32_t x;
        std::memcpy(&x, at, 4);
        a.data[i] = x;
        break;
      }
      case DType::kI64: {
        int64_t x;
        std::memcpy(&x, at, 8);
        a.data[i] = static_cast<double>(x);
        break;
      }
      default: {
        uint32_t x;
        std::memcpy(&x, at, 4);
        a.data[i] = x;
        break;
      }
    }
  }
}

runtime::Arg scalar_arg(DType t, double v) {
  switch (t) {
    case DType::kF32: return runtime::Arg::f32(static_cast<float>(v));
    case DType::kF64: return runtime::Arg::f64(v);
    case DType::kI32: return runtime::Arg::i32(static_cast<int32_t>(v));
    case DType::kU32: return runtime::Arg::u32(static_cast<uint32_t>(v));
    case DType::kI64: return runtime::Arg::i64(static_cast<int64_t>(v));
    case DType::kBool: return runtime::Arg::boolean(v != 0);
  }
  return {};
}

}  // namespace

Status KernelRunner::run(const codegen::Kernel& k, HostArgs& args,
                         const codegen::CompileOptions& o) {
  VKAD_ASSIGN_OR_RETURN(runtime::CompiledKernel ck, codegen::compile(k, target(), o));
  return run_compiled(ck, args);
}

Status KernelRunner::run_compiled(const runtime::CompiledKernel& ck, HostArgs& args) {
  VKAD_ASSIGN_OR_RETURN(runtime::KernelHandle h, rt_->register_kernel(ck));
  std::vector<runtime::Arg> launch_args;
  std::vector<runtime::NdArrayHandle> handles;
  Status st;
  for (size_t i = 0; i < ck.params.size() && st.ok(); ++i) {
    const auto& p = ck.params[i];
    if (p.kind == runtime::ParamKind::kScalar) {
      launch_args.push_back(scalar_arg(p.dtype, args.scalars[i]));
      continue;
    }
    HostArray& a = args.arrays[i];
    auto nd = rt_->create_ndarray(p.dtype, a.shape, p.name);
    if (!nd.ok()) {
      st = nd.status();
      break;
    }
    handles.push_back(*nd);
    std::vector<std::byte> bytes = to_bytes(a);
    if (!bytes.empty()) st = rt_->upload(*nd, bytes.data(), bytes.size());
    launch_args.push_back(runtime::Arg::ndarray(*nd));
  }
  if (st.ok()) st = rt_->launch(h, launch_args);
  Status sync = rt_->synchronize();
  if (st.ok()) st = sync;
  size_t hi = 0;
  for (size_t i = 0; i < ck.params.size(); ++i) {
    if (ck.params[i].kind != runtime::ParamKind::kNdArray || hi >= handles.size()) continue;
    HostArray& a = args.arrays[i];
    std::vector<std::byte> bytes(a.size() * runtime::dtype_bytes(a.dtype));
    Status d = bytes.empty() ? Status{} : rt_->download(handles[hi], bytes.data(), bytes.size());
    if (d.ok())
      from_bytes(a, bytes);
    else if (st.ok())
      st = d;
    (void)rt_->free_ndarray(handles[hi]);
    ++hi;
  }
  (void)rt_->unregister_kernel(h);
  return st;
}

Status KernelRunner::upload_params(const runtime::CompiledKernel& k, size_t n, HostArgs& args,
                                   std::vector<runtime::Arg>* launch_args, ArrayHandles* handles) {
  for (size_t i = 0; i < n; ++i) {
    const auto& p = k.params[i];
    if (p.kind == runtime::ParamKind::kScalar) {
      launch_args->push_back(scalar_arg(p.dtype, args.scalars[i]));
      continue;
    }
    HostArray& a = args.arrays[i];
    VKAD_ASSIGN_OR_RETURN(runtime::NdArrayHandle nd, rt_->create_ndarray(p.dtype, a.shape, p.name));
    handles->push_back({i, nd});
    std::vector<std::byte> bytes = to_bytes(a);
    if (!bytes.empty()) VKAD_TRY(rt_->upload(nd, bytes.data(), bytes.size()));
    launch_args->push_back(runtime::Arg::ndarray(nd));
  }
  return {};
}

Status KernelRunner::download_params(const ArrayHandles& handles, HostArgs& args, Status st) {
  for (auto [i, h] : handles) {
    HostArray& a = args.arrays[i];
    std::vector<std::byte> bytes(a.size() * runtime::dtype_bytes(a.dtype));
    Status d = bytes.empty() ? Status{} : rt_->download(h, bytes.data(), bytes.size());
    if (d.ok())
      from_bytes(a, bytes);
    else if (st.ok())
      st = d;
    (void)rt_->free_ndarray(h);
  }
  return st;
}

Status KernelRunner::run_counted(const runtime::CompiledKernel& counter,
                                 const runtime::CompiledKernel& adjoint, uint32_t counted,
                                 size_t forward_params, HostArgs& args) {
  VKAD_ASSIGN_OR_RETURN(runtime::KernelHandle ch, rt_->register_kernel(counter));
  auto ah = rt_->register_kernel(adjoint);
  if (!ah.ok()) {
    (void)rt_->unregister_kernel(ch);
    return ah.status();
  }
  std::vector<runtime::Arg> launch_args;
  ArrayHandles handles;
  // The adjoint's parameters without its trailing trips_ scalars.
  Status st = upload_params(adjoint, adjoint.params.size() - counted, args, &launch_args, &handles);
  if (st.ok()) st = runtime::launch_counted(*rt_, ch, *ah, counted, forward_params, launch_args);
  Status sync = rt_->synchronize();
  if (st.ok()) st = sync;
  st = download_params(handles, args, st);
  (void)rt_->unregister_kernel(ch);
  (void)rt_->unregister_kernel(*ah);
  return st;
}

Status KernelRunner::run_forward_counted(const runtime::CompiledKernel& counting_forward,
                                         const runtime::CompiledKernel& adjoint, uint32_t counted,
                                         size_t forward_params, HostArgs& args,
                                         std::vector<int32_t>* trips) {
  VKAD_ASSIGN_OR_RETURN(runtime::KernelHandle fh, rt_->register_kernel(counting_forward));
  auto ah = rt_->register_kernel(adjoint);
  if (!ah.ok()) {
    (void)rt_->unregister_kernel(fh);
    return ah.status();
  }
  std::vector<runtime::Arg> launch_args;
  ArrayHandles handles;
  Status st = upload_params(adjoint, adjoint.params.size() - counted, args, &launch_args, &handles);
  runtime::NdArrayHandle th;
  if (st.ok()) {
    st = runtime::launch_forward_counted(*rt_, fh, counted,
                                         std::span(launch_args).first(forward_params), &th);
  }
  if (st.ok() && trips) {
    // The words as the forward left them; reading them is only a download (a test's look, not
    // part of the protocol).
    trips->assign(static_cast<size_t>(counted) * runtime::kTripSlots, 0);
    st = rt_->download(th, trips->data(), 4 * trips->size());
  }
  if (st.ok())
    st = runtime::launch_counted_adjoint(*rt_, *ah, counted, th, launch_args);
  else if (th.id)
    (void)rt_->free_ndarray(th);
  Status sync = rt_->synchronize();
  if (st.ok()) st = sync;
  st = download_params(handles, args, st);
  (void)rt_->unregister_kernel(fh);
  (void)rt_->unregister_kernel(*ah);
  return st;
}

size_t KernelRunner::validation_messages() const {
  return rt_->device().validation_message_count();
}

std::string KernelRunner::validation_log() const {
  std::string all;
  for (const auto& m : rt_->device().validation_messages()) all += m + "\n";
  return all;
}

namespace {

// `ok(i)` decides element i; the description lists the first few elements that fail.
template <typename Ok>
std::string describe_mismatches(const HostArray& got, const HostArray& want, Ok ok) {
  if (got.size() != want.size()) return "size differs";
  std::string out;
  int shown = 0;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (ok(i)) continue;
    ++bad;
    if (shown++ < 5) {
      out += "  [" + std::to_string(i) + "] device " + std::to_string(got.data[i]) + ", cpu " +
             std::to_string(want.data[i]);
      if (!want.error.empty()) out += " +- " + std::to_string(want.error[i]);
      out += "\n";
    }
  }
  if (bad)
    out = std::to_string(bad) + " of " + std::to_string(got.size()) + " elements differ:\n" + out;
  return out;
}

}  // namespace

std::string compare_arrays(const HostArray& got, const HostArray& want) {
  return describe_mismatches(got, want, [&](size_t i) {
    double g = got.data[i], w = want.data[i];
    double bound = want.error.empty() ? 0 : want.error[i];
    if (std::isinf(bound)) return true;  // Vulkan leaves this element unconstrained
    if (std::isnan(w) || std::isnan(g)) return std::isnan(w) && std::isnan(g);
    return g == w || std::fabs(g - w) <= bound;
  });
}

std::string compare_arrays_exact(const HostArray& got, const HostArray& want) {
  return describe_mismatches(got, want, [&](size_t i) {
    double g = got.data[i], w = want.data[i];
    if (std::isnan(w) || std::isnan(g)) return std::isnan(w) && std::isnan(g);
    return g == w && std::signbit(g) == std::signbit(w);
  });
}

std::string compare_arrays(const HostArray& got, const HostArray& want, double tol) {
  return describe_mismatches(got, want, [&](size_t i) {
    double g = got.data[i], w = want.data[i];
    if (!codegen::is_float(want.dtype)) return g == w;
    if (std::isnan(w) || std::isnan(g)) return std::isnan(w) && std::isnan(g);
    return g == w || std::fabs(g - w) <= tol * std::max(1.0, std::fabs(w));
  });
}

void KernelTest::SetUp() {
  bool skipped = false;
  runner_ = KernelRunner::create(options(), &skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device (install mesa-vulkan-drivers for lavapipe)";
  ASSERT_TRUE(runner_);
}

void KernelTest::TearDown() {
  if (!runner_) return;
  EXPECT_EQ(runner_->validation_messages(), 0u) << runner_->validation_log();
}

}  // namespace vkad::testing
