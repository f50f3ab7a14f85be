// Kernels that read and write one differentiable ndarray on disjoint rows (autodiff/
// disjoint_access.h), on the device with validation on: DiffTaichi-style programs of many
// launches (tests/support/step_program.h: x[f + 1] = x[f] + dt v[f], v[f + 1] = v[f] - dt k
// sin x[f], 20 steps, then a loss on the last row), backward by the adjoints in reverse launch
// order; every gradient against central differences of the forward program on the same device
// (f64), the final state and gradients against the CPU evaluator.
#include <gtest/gtest.h>

#include <map>

#include "gpu/kernel_harness.h"
#include "spirv/compiler.h"
#include "support/step_program.h"

namespace vkad::testing {
namespace {

// A RunKernel on the device: compiled once per kernel, launched with the named values.
class DeviceRunner {
 public:
  explicit DeviceRunner(KernelRunner& r) : r_(r) {}
  Status operator()(const codegen::Kernel& k, NamedValues& values) {
    auto it = compiled_.find(k.name);
    if (it == compiled_.end()) {
      VKAD_ASSIGN_OR_RETURN(runtime::CompiledKernel ck, codegen::compile(k, r_.target()));
      it = compiled_.emplace(k.name, std::move(ck)).first;
    }
    HostArgs args;
    for (const codegen::Param& p : k.params) {
      if (p.kind == codegen::ParamKind::kNdArray) {
        auto a = values.arrays.find(p.name);
        if (a == values.arrays.end())
          return make_error(ErrorCode::kInvalidArgument, "no array '" + p.name + "'");
        args.arrays.push_back(a->second);
        args.scalars.push_back(0);
      } else {
        auto s = values.scalars.find(p.name);
        if (s == values.scalars.end())
          return make_error(ErrorCode::kInvalidArgument, "no scalar '" + p.name + "'");
        args.arrays.emplace_back();
        args.scalars.push_back(s->second);
      }
    }
    VKAD_TRY(r_.run_compiled(it->second, args));
    for (size_t i = 0; i < k.params.size(); ++i) {
      if (k.params[i].kind == codegen::ParamKind::kNdArray)
        values.arrays[k.params[i].name] = std::move(args.arrays[i]);
    }
    return {};
  }

 private:
  KernelRunner& r_;
  std::map<std::string, runtime::CompiledKernel> compiled_;
};

class DisjointProgramDevice : public KernelTest,
                              public ::testing::WithParamInterface<std::string> {};

TEST_P(DisjointProgramDevice, GradientsMatchFiniteDifferences) {
  if (!runner_->target().float64) GTEST_SKIP() << "device has no f64";
  auto p = named_step_program(GetParam(), 4, runner_->target());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  DeviceRunner device(*runner_);
  RunKernel run = [&](const codegen::Kernel& k, NamedValues& v) { return device(k, v); };
  NamedValues init = named_step_program_values(*p, 7);

  ProgramGradCheck r = check_program_gradients(*p, init, run, 1e-5, 1e-6);
  EXPECT_EQ(r.failure, "");
  const int row = GetParam() == "planar" ? 8 : 4;
  EXPECT_EQ(r.checked, 2 * row + 1 + static_cast<int>(p->mid_rows_checked.size()) * row);

  // The device's state and gradients, against the CPU evaluator's.
  NamedValues dev = init, cpu = init;
  ASSERT_TRUE(run_forward_and_backward(*p, dev, run).ok());
  ASSERT_TRUE(run_forward_and_backward(*p, cpu, run_on_cpu).ok());
  for (const char* a : {"x", "v", "x_grad", "v_grad", "k_grad"}) {
    EXPECT_EQ(compare_arrays(dev.arrays.at(a), cpu.arrays.at(a), 1e-9), "") << a;
  }
}

INSTANTIATE_TEST_SUITE_P(Programs, DisjointProgramDevice, ::testing::ValuesIn(step_program_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace vkad::testing
