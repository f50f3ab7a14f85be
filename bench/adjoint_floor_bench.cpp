// vkad-bench-adjoint-floor: the generated adjoint held against the floor, in one process on one
// device. Two kernels, L steps per element, y = the last value, gradients of L = sum(y_grad * y):
// the sin loop x <- sin(x) * 0.9 + 0.1 (dL/dx0), and the recurrence of vkad-bench-adjoint,
// v <- 0.5 v + 0.25 sin(v) w with v0 = x (dL/dx and dL/dw: two differentiated inputs). Measured
// per kernel and L:
//   - vkad forward and vkad's generated adjoint (adstack layout from the device, or --layout);
//   - a hand-written slot-major heap tape in SPIR-V (../shared/DEVICE.md): the forward replay
//     stores x_k at heap[k*T + t] (T dispatched threads, t this thread), the reverse sweep walks
//     k downwards multiplying 0.9 cos(x_k) into a register and stores x_grad (each thread owns
//     its elements); the recurrence's tape likewise, with dL/dw summed in a second register;
//   - a hand-written private tape: the same SPIR-V with the tape in a Function-storage array of
//     L floats per thread (one module per L), the floor of vkad's private adstack tier;
//   - vkad's adjoint once per adstack storage tier (runtime.h AdstackTier): the private tier
//     (private arrays up to kMaxPrivateTierBytes) and the heap tier;
//   - a hand-written grid-stride copy kernel with 16-byte accesses, for GB/s;
//   - --kernels training: the training example's kernel (examples/diffsim), forward and
//     adjoint per tier, timed over batches of --train-batch launches between syncs, for issue
//     13's "adjoint <= 4x forward per iteration".
// The hand tape's gradient is checked against vkad's (f32 tolerance) before anything is timed,
// so the ratio compares equal work. Times are wall-clock per launch over a batch of launches
// recorded back to back and waited for once (median of --reps batches), which spreads the
// submit-and-wait round trip over the batch.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <spirv/unified1/spirv.hpp>
#include <string>

#include "abi/spirv_tools.h"
#include "api/device_target.h"
#include "autodiff/reverse_mode.h"
#include "bench/bench_runtime.h"
#include "bench/bench_util.h"
#include "diffsim/diffsim.h"
#include "ir/builder.h"
#include "runtime/runtime.h"
#include "runtime/spirv_interface.h"
#include "spirv/compiler.h"
#include "support/sample_kernels.h"

using namespace vkad;
using namespace vkad::codegen;
using bench::now_us;

namespace {

constexpr uint32_t kTapeLocalSize = 64;

Kernel sin_loop() {
  KernelBuilder kb("sin_loop");
  Scalar steps = kb.scalar("steps", DType::kI32);
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Local v = kb.local(x(i));
    kb.for_range(kb.i32(0), steps, [&](Value) { v.store(sin(v.load()) * 0.9 + 0.1); });
    y.store({i}, v.load());
  });
  return kb.finish();
}

// The recurrence of bench/adjoint_bench.cpp, the same statements.
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

// The hand-written heap tape. Parameters: steps (i32), T (u32, dispatched threads), x, heap
// (L*T floats), x_grad, y_grad. One task over [0, T): thread t grid-strides over the elements
// i = t, t + T, ... < shape(x, 0) itself. Args-buffer words are pasted in by tape_kernel().
const char* kHeapTapeSpirv = R"(
OpCapability Shader
%glsl = OpExtInstImport "GLSL.std.450"
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %main "main" %gid %args %x %heap %xg %yg
OpExecutionMode %main LocalSize 64 1 1
OpDecorate %gid BuiltIn GlobalInvocationId
OpDecorate %rtu ArrayStride 4
OpMemberDecorate %bufu 0 Offset 0
OpDecorate %bufu Block
OpDecorate %rtf ArrayStride 4
OpMemberDecorate %buff 0 Offset 0
OpDecorate %buff Block
OpDecorate %args DescriptorSet 0
OpDecorate %args Binding 0
OpDecorate %x DescriptorSet 0
OpDecorate %x Binding 1
OpDecorate %heap DescriptorSet 0
OpDecorate %heap Binding 2
OpDecorate %xg DescriptorSet 0
OpDecorate %xg Binding 3
OpDecorate %yg DescriptorSet 0
OpDecorate %yg Binding 4
%void = OpTypeVoid
%fn = OpTypeFunction %void
%u32 = OpTypeInt 32 0
%f32 = OpTypeFloat 32
%bool = OpTypeBool
%v3 = OpTypeVector %u32 3
%pin = OpTypePointer Input %v3
%gid = OpVariable %pin Input
%rtu = OpTypeRuntimeArray %u32
%bufu = OpTypeStruct %rtu
%pbufu = OpTypePointer StorageBuffer %bufu
%args = OpVariable %pbufu StorageBuffer
%rtf = OpTypeRuntimeArray %f32
%buff = OpTypeStruct %rtf
%pbuff = OpTypePointer StorageBuffer %buff
%x = OpVariable %pbuff StorageBuffer
%heap = OpVariable %pbuff StorageBuffer
%xg = OpVariable %pbuff StorageBuffer
%yg = OpVariable %pbuff StorageBuffer
%pu = OpTypePointer StorageBuffer %u32
%pf = OpTypePointer StorageBuffer %f32
%c0 = OpConstant %u32 0
%c1 = OpConstant %u32 1
%wsteps = OpConstant %u32 STEPS_WORD
%wthreads = OpConstant %u32 THREADS_WORD
%wn = OpConstant %u32 N_WORD
%f09 = OpConstant %f32 0.9
%f01 = OpConstant %f32 0.1
%main = OpFunction %void None %fn
%entry = OpLabel
%g3 = OpLoad %v3 %gid
%t = OpCompositeExtract %u32 %g3 0
%psteps = OpAccessChain %pu %args %c0 %wsteps
%L = OpLoad %u32 %psteps
%pthreads = OpAccessChain %pu %args %c0 %wthreads
%T = OpLoad %u32 %pthreads
%pn = OpAccessChain %pu %args %c0 %wn
%N = OpLoad %u32 %pn
OpBranch %ohead
%ohead = OpLabel
%i = OpPhi %u32 %t %entry %inext %ocont
OpLoopMerge %oexit %ocont None
OpBranch %ocheck
%ocheck = OpLabel
%iok = OpULessThan %bool %i %N
OpBranchConditional %iok %obody %oexit
%obody = OpLabel
%px = OpAccessChain %pf %x %c0 %i
%x0 = OpLoad %f32 %px
OpBranch %fhead
%fhead = OpLabel
%k = OpPhi %u32 %c0 %obody %knext %fcont
%v = OpPhi %f32 %x0 %obody %vnext %fcont
%at = OpPhi %u32 %t %obody %atnext %fcont
OpLoopMerge %fexit %fcont None
OpBranch %fcheck
%fcheck = OpLabel
%kok = OpULessThan %bool %k %L
OpBranchConditional %kok %fbody %fexit
%fbody = OpLabel
%ph = OpAccessChain %pf %heap %c0 %at
OpStore %ph %v
%s = OpExtInst %f32 %glsl Sin %v
%sm = OpFMul %f32 %s %f09
%vnext = OpFAdd %f32 %sm %f01
OpBranch %fcont
%fcont = OpLabel
%knext = OpIAdd %u32 %k %c1
%atnext = OpIAdd %u32 %at %T
OpBranch %fhead
%fexit = OpLabel
%pyg = OpAccessChain %pf %yg %c0 %i
%g0 = OpLoad %f32 %pyg
OpBranch %rhead
%rhead = OpLabel
%r = OpPhi %u32 %L %fexit %rnext %rcont
%g = OpPhi %f32 %g0 %fexit %gnext %rcont
%ra = OpPhi %u32 %at %fexit %ranext %rcont
OpLoopMerge %rexit %rcont None
OpBranch %rcheck
%rcheck = OpLabel
%rok = OpUGreaterThan %bool %r %c0
OpBranchConditional %rok %rbody %rexit
%rbody = OpLabel
%ranext = OpISub %u32 %ra %T
%ph2 = OpAccessChain %pf %heap %c0 %ranext
%xk = OpLoad %f32 %ph2
%c = OpExtInst %f32 %glsl Cos %xk
%cm = OpFMul %f32 %c %f09
%gnext = OpFMul %f32 %g %cm
OpBranch %rcont
%rcont = OpLabel
%rnext = OpISub %u32 %r %c1
OpBranch %rhead
%rexit = OpLabel
%pxg = OpAccessChain %pf %xg %c0 %i
OpStore %pxg %g
OpBranch %ocont
%ocont = OpLabel
%inext = OpIAdd %u32 %i %T
OpBranch %ohead
%oexit = OpLabel
OpReturn
OpFunctionEnd
)";

// The recurrence's hand-written heap tape, the same scheme. Parameters: steps (i32), T (u32),
// x, w, heap (L*T floats), x_grad, w_grad, y_grad. Forward: v_{k+1} = 0.5 v_k + 0.25 w sin(v_k),
// v_k stored at heap[k*T + t]. Reverse, g = dL/dv_{k+1}: gw += g * 0.25 sin(v_k),
// g *= 0.5 + 0.25 w cos(v_k); then x_grad[i] = g, w_grad[i] = gw.
const char* kRecurrenceTapeSpirv = R"(
OpCapability Shader
%glsl = OpExtInstImport "GLSL.std.450"
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %main "main" %gid %args %x %w %heap %xg %wg %yg
OpExecutionMode %main LocalSize 64 1 1
OpDecorate %gid BuiltIn GlobalInvocationId
OpDecorate %rtu ArrayStride 4
OpMemberDecorate %bufu 0 Offset 0
OpDecorate %bufu Block
OpDecorate %rtf ArrayStride 4
OpMemberDecorate %buff 0 Offset 0
OpDecorate %buff Block
OpDecorate %args DescriptorSet 0
OpDecorate %args Binding 0
OpDecorate %x DescriptorSet 0
OpDecorate %x Binding 1
OpDecorate %w DescriptorSet 0
OpDecorate %w Binding 2
OpDecorate %heap DescriptorSet 0
OpDecorate %heap Binding 3
OpDecorate %xg DescriptorSet 0
OpDecorate %xg Binding 4
OpDecorate %wg DescriptorSet 0
OpDecorate %wg Binding 5
OpDecorate %yg DescriptorSet 0
OpDecorate %yg Binding 6
%void = OpTypeVoid
%fn = OpTypeFunction %void
%u32 = OpTypeInt 32 0
%f32 = OpTypeFloat 32
%bool = OpTypeBool
%v3 = OpTypeVector %u32 3
%pin = OpTypePointer Input %v3
%gid = OpVariable %pin Input
%rtu = OpTypeRuntimeArray %u32
%bufu = OpTypeStruct %rtu
%pbufu = OpTypePointer StorageBuffer %bufu
%args = OpVariable %pbufu StorageBuffer
%rtf = OpTypeRuntimeArray %f32
%buff = OpTypeStruct %rtf
%pbuff = OpTypePointer StorageBuffer %buff
%x = OpVariable %pbuff StorageBuffer
%w = OpVariable %pbuff StorageBuffer
%heap = OpVariable %pbuff StorageBuffer
%xg = OpVariable %pbuff StorageBuffer
%wg = OpVariable %pbuff StorageBuffer
%yg = OpVariable %pbuff StorageBuffer
%pu = OpTypePointer StorageBuffer %u32
%pf = OpTypePointer StorageBuffer %f32
%c0 = OpConstant %u32 0
%c1 = OpConstant %u32 1
%wsteps = OpConstant %u32 STEPS_WORD
%wthreads = OpConstant %u32 THREADS_WORD
%wn = OpConstant %u32 N_WORD
%f0 = OpConstant %f32 0
%f05 = OpConstant %f32 0.5
%f025 = OpConstant %f32 0.25
%main = OpFunction %void None %fn
%entry = OpLabel
%g3 = OpLoad %v3 %gid
%t = OpCompositeExtract %u32 %g3 0
%psteps = OpAccessChain %pu %args %c0 %wsteps
%L = OpLoad %u32 %psteps
%pthreads = OpAccessChain %pu %args %c0 %wthreads
%T = OpLoad %u32 %pthreads
%pn = OpAccessChain %pu %args %c0 %wn
%N = OpLoad %u32 %pn
OpBranch %ohead
%ohead = OpLabel
%i = OpPhi %u32 %t %entry %inext %ocont
OpLoopMerge %oexit %ocont None
OpBranch %ocheck
%ocheck = OpLabel
%iok = OpULessThan %bool %i %N
OpBranchConditional %iok %obody %oexit
%obody = OpLabel
%px = OpAccessChain %pf %x %c0 %i
%x0 = OpLoad %f32 %px
%pw = OpAccessChain %pf %w %c0 %i
%wi = OpLoad %f32 %pw
%wq = OpFMul %f32 %wi %f025
OpBranch %fhead
%fhead = OpLabel
%k = OpPhi %u32 %c0 %obody %knext %fcont
%v = OpPhi %f32 %x0 %obody %vnext %fcont
%at = OpPhi %u32 %t %obody %atnext %fcont
OpLoopMerge %fexit %fcont None
OpBranch %fcheck
%fcheck = OpLabel
%kok = OpULessThan %bool %k %L
OpBranchConditional %kok %fbody %fexit
%fbody = OpLabel
%ph = OpAccessChain %pf %heap %c0 %at
OpStore %ph %v
%s = OpExtInst %f32 %glsl Sin %v
%h = OpFMul %f32 %v %f05
%sw = OpFMul %f32 %s %wq
%vnext = OpFAdd %f32 %h %sw
OpBranch %fcont
%fcont = OpLabel
%knext = OpIAdd %u32 %k %c1
%atnext = OpIAdd %u32 %at %T
OpBranch %fhead
%fexit = OpLabel
%pyg = OpAccessChain %pf %yg %c0 %i
%g0 = OpLoad %f32 %pyg
OpBranch %rhead
%rhead = OpLabel
%r = OpPhi %u32 %L %fexit %rnext %rcont
%g = OpPhi %f32 %g0 %fexit %gnext %rcont
%gw = OpPhi %f32 %f0 %fexit %gwnext %rcont
%ra = OpPhi %u32 %at %fexit %ranext %rcont
OpLoopMerge %rexit %rcont None
OpBranch %rcheck
%rcheck = OpLabel
%rok = OpUGreaterThan %bool %r %c0
OpBranchConditional %rok %rbody %rexit
%rbody = OpLabel
%ranext = OpISub %u32 %ra %T
%ph2 = OpAccessChain %pf %heap %c0 %ranext
%vk = OpLoad %f32 %ph2
%s2 = OpExtInst %f32 %glsl Sin %vk
%c = OpExtInst %f32 %glsl Cos %vk
%ds = OpFMul %f32 %s2 %f025
%gwi = OpFMul %f32 %g %ds
%gwnext = OpFAdd %f32 %gw %gwi
%cw = OpFMul %f32 %c %wq
%dv = OpFAdd %f32 %cw %f05
%gnext = OpFMul %f32 %g %dv
OpBranch %rcont
%rcont = OpLabel
%rnext = OpISub %u32 %r %c1
OpBranch %rhead
%rexit = OpLabel
%pxg = OpAccessChain %pf %xg %c0 %i
OpStore %pxg %g
%pwg = OpAccessChain %pf %wg %c0 %i
OpStore %pwg %gw
OpBranch %ocont
%ocont = OpLabel
%inext = OpIAdd %u32 %i %T
OpBranch %ohead
%oexit = OpLabel
OpReturn
OpFunctionEnd
)";

void paste(std::string& text, const std::string& key, uint32_t value) {
  text.replace(text.find(key), key.size(), std::to_string(value));
}

// The sin loop's tape, or (recurrence) the recurrence's, which also takes w and w_grad.
// --tape-reduction: the hand tapes reduce Sin/Cos arguments by 2 pi exactly as vkad's emitter
// does (k rounded by adding and subtracting 1.5 * 2^23, then a two-term Cody-Waite, contraction
// allowed; spirv/spirv_emitter.cpp reduce_two_pi), so
// the ratio compares the reverse-mode machinery on equal math. Rewrites every
// `%r = OpExtInst %f32 %glsl Sin|Cos %a` line of the module text.
void reduce_trig(std::string& text) {
  constexpr double kTwoPi = 6.283185307179586476925;
  char consts[512];
  std::snprintf(consts, sizeof consts,
                "%%rr_inv = OpConstant %%f32 %.9g\n%%rr_c1 = OpConstant %%f32 6.28125\n"
                "%%rr_c2 = OpConstant %%f32 %.9g\n%%rr_m = OpConstant %%f32 12582912\n",
                static_cast<double>(static_cast<float>(1 / kTwoPi)),
                static_cast<double>(static_cast<float>(kTwoPi - 6.28125)));
  std::string out, decorations;
  int n = 0;
  size_t at = 0;
  while (at < text.size()) {
    size_t eol = text.find('\n', at);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(at, eol - at);
    at = eol + 1;
    size_t fn = line.find(" = OpExtInst %f32 %glsl ");
    if (fn != std::string::npos &&
        (line.find(" Sin %") != std::string::npos || line.find(" Cos %") != std::string::npos)) {
      std::string result = line.substr(0, fn), arg = line.substr(line.rfind(' ') + 1);
      std::string inst = line.find(" Sin %") != std::string::npos ? "Sin" : "Cos";
      std::string p = "%rr" + std::to_string(n++) + "_";
      out += p + "q = OpFMul %f32 " + arg + " %rr_inv\n";
      out += p + "m = OpFAdd %f32 " + p + "q %rr_m\n";
      out += p + "k = OpFSub %f32 " + p + "m %rr_m\n";
      decorations += "OpDecorate " + p + "m NoContraction\nOpDecorate " + p + "k NoContraction\n";
      std::string r = arg;
      for (int j = 1; j <= 2; ++j) {
        std::string t = p + "t" + std::to_string(j), rj = p + "r" + std::to_string(j);
        out += t + " = OpFMul %f32 " + p + "k %rr_c" + std::to_string(j) + "\n";
        out += rj + " = OpFSub %f32 " + r + " " + t + "\n";
        r = rj;
      }
      out += result + " = OpExtInst %f32 %glsl " + inst + " " + r + "\n";
    } else {
      out += line + (eol < text.size() ? "\n" : "");
    }
  }
  out.insert(out.find("%main = OpFunction"), consts);
  out.insert(out.find("OpDecorate"), decorations);
  text = std::move(out);
}

// The private tape from a heap tape's text: the tape slots go to `%priv`, a Function array of
// `len` floats (slot k at index k), instead of heap[k*T + t]. The heap binding stays declared
// (unused) so both tapes take the same arguments.
void make_private(std::string& text, uint32_t len, bool static_steps) {
  auto swap_line = [&](const std::string& from, const std::string& to) {
    size_t at = text.find(from);
    text.replace(at, from.size(), to);
  };
  swap_line("%ph = OpAccessChain %pf %heap %c0 %at", "%ph = OpAccessChain %pff %priv %k");
  swap_line("%ph2 = OpAccessChain %pf %heap %c0 %ranext",
            "%rm1 = OpISub %u32 %r %c1\n%ph2 = OpAccessChain %pff %priv %rm1");
  text.insert(text.find("%main = OpFunction"),
              "%plen = OpConstant %u32 " + std::to_string(len) +
                  "\n%tarr = OpTypeArray %f32 %plen\n%ptarr = OpTypePointer Function %tarr\n"
                  "%pff = OpTypePointer Function %f32\n");
  swap_line("%entry = OpLabel\n", "%entry = OpLabel\n%priv = OpVariable %ptarr Function\n");
  // static_steps: the trip count is the array length, a constant the driver sees (it may
  // unroll the loops and index the array statically), as in ../shared/DEVICE.md's private tape.
  if (static_steps) swap_line("%L = OpLoad %u32 %psteps", "%L = OpCopyObject %u32 %plen");
}

// A copy of an adstack kernel that always runs in the heap tier: its tier specialization
// constant renumbered away, so the runtime sees a module without the private tier
// (adstack_layout.h, "Storage tiers"). Lets one runtime time both tiers side by side.
// The same module without launch specialization: no spec words, so every launch uses the
// tier's generic pipeline (its constants keep their defaults: load the words).
runtime::CompiledKernel unspecialized(runtime::CompiledKernel k) {
  k.name += "_generic";
  for (runtime::CompiledTask& t : k.tasks) t.spec_words.clear();
  return k;
}

runtime::CompiledKernel heap_only(runtime::CompiledKernel k) {
  k.name += "_heap";
  for (runtime::CompiledTask& t : k.tasks) {
    std::vector<uint32_t>& w = t.spirv;
    for (size_t i = 5; i < w.size() && (w[i] >> 16);) {
      uint32_t count = w[i] >> 16;
      if ((w[i] & 0xffff) == spv::OpDecorate && count == 4 && w[i + 2] == spv::DecorationSpecId &&
          w[i + 3] == adstack::kPrivateTierSpecId) {
        w[i + 3] = 1000;
      }
      i += count;
    }
  }
  return k;
}

Result<runtime::CompiledKernel> tape_kernel(bool recurrence, bool reduce, uint32_t private_len = 0,
                                            bool static_steps = false) {
  using runtime::DType;
  using runtime::ParamKind;
  runtime::CompiledKernel k;
  k.name = recurrence ? "recurrence_heap_tape" : "heap_tape";
  k.params = {{"steps", ParamKind::kScalar, DType::kI32, 0, false},
              {"threads", ParamKind::kScalar, DType::kU32, 0, false},
              {"x", ParamKind::kNdArray, DType::kF32, 1, false}};
  if (recurrence) k.params.push_back({"w", ParamKind::kNdArray, DType::kF32, 1, false});
  k.params.push_back({"heap", ParamKind::kNdArray, DType::kF32, 1, true});
  k.params.push_back({"x_grad", ParamKind::kNdArray, DType::kF32, 1, true});
  if (recurrence) k.params.push_back({"w_grad", ParamKind::kNdArray, DType::kF32, 1, true});
  k.params.push_back({"y_grad", ParamKind::kNdArray, DType::kF32, 1, false});
  std::string text = recurrence ? kRecurrenceTapeSpirv : kHeapTapeSpirv;
  paste(text, "STEPS_WORD", k.scalar_offset(0) / 4);
  paste(text, "THREADS_WORD", k.scalar_offset(1) / 4);
  paste(text, "N_WORD", k.shape_offset(2) / 4);
  if (private_len) {
    make_private(text, private_len, static_steps);
    k.name = std::string(recurrence ? "recurrence_" : "") + (static_steps ? "static_" : "") +
             "private_tape";
  }
  if (reduce) reduce_trig(text);
  VKAD_ASSIGN_OR_RETURN(std::vector<uint32_t> words, assemble_spirv(text));
  k.tasks.push_back({"tape",
                     std::move(words),
                     kTapeLocalSize,
                     runtime::RangeBound::constant(0),
                     runtime::RangeBound::scalar(1),
                     false,
                     {}});
  return k;
}

// Milliseconds per launch of each kernel: median over `reps` batches of `batch` launches waited
// for once. The kernels' batches are interleaved (a, b, c, a, b, c, ...) so that all of them see
// the same GPU clock state: a GPU raises its clocks only under sustained load, and a kernel timed
// first in a cold run read up to 2x slower than the same kernel timed last.
struct Timed {
  runtime::KernelHandle h;
  std::vector<runtime::Arg> args;
};
std::vector<double> time_ms(runtime::Runtime& rt, const std::vector<Timed>& ks, int reps,
                            int batch) {
  std::vector<std::vector<double>> v(ks.size());
  for (int r = 0; r <= reps; ++r) {
    for (size_t k = 0; k < ks.size(); ++k) {
      double m = bench::batch_ms(rt, ks[k].h, ks[k].args, batch);
      if (r) v[k].push_back(m);  // the first round warms up
    }
  }
  std::vector<double> out;
  for (auto& x : v) out.push_back(bench::median(x));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is printed, also into a pipe or file
  bench::Args args(
      argc, argv,
      "usage: vkad-bench-adjoint-floor [--n N] [--steps L,L,...] [--layout auto|slot|thread]\n"
      "                                [--kernels sin,recurrence] [--reps R] [--batch B] [--json "
      "F]\n"
      "                                [--tape-reduction] [--x0 random|mod|uniform]\n"
      "                                [--particles P] [--train-steps S] [--train-batch B]\n"
      "  the sin loop x <- sin(x)*0.9 + 0.1 for L steps, dL/dx0, and the recurrence\n"
      "  v <- 0.5 v + 0.25 sin(v) w, dL/dx and dL/dw: vkad forward, vkad's generated\n"
      "  adjoint and a hand-written slot-major heap tape (SPIR-V), plus a copy kernel for\n"
      "  GB/s; prints adjoint / hand tape ratios\n"
      "  --n N        elements (default 2^24)\n"
      "  --steps LS   comma-separated step counts (default 16,64,256)\n"
      "  --kernels K  comma-separated: sin, recurrence, training (default all)\n"
      "  --layout X   vkad's adstack layout: auto (the device's, default), slot, thread\n"
      "  --reps R     batches timed, median reported (default 5)\n"
      "  --batch B    launches per batch, waited for once (default 4)\n"
      "  --json F     also write the results as JSON to F\n"
      "  --tape-reduction  the hand tapes reduce sin/cos arguments by 2 pi as vkad does\n"
      "  --x0 X       inputs: random (seeded, x0 over [0, 1), w over [0.25, 0.75); default),\n"
      "               mod (0.001 (i mod 1000), issue 13's first measurement) or uniform (a\n"
      "               hash of i spread uniformly over [0, 1))\n"
      "  --particles P, --train-steps S  the training example's kernel size (default 65536, 256)\n"
      "  --train-batch B  its launches per batch, waited for once (default 50)\n"
      "  --segment K  the checkpointed adjoints' segment length (default 16)\n"
      "  --private-min-length M  RuntimeOptions::adstack_private_min_length (default: its "
      "default)\n",
      {"n", "steps", "layout", "kernels", "reps", "batch", "json", "tape-reduction", "x0",
       "particles", "train-steps", "train-batch", "private-min-length", "segment"});
  const std::string x0_kind = args.get("x0", "random");
  if (x0_kind != "random" && x0_kind != "mod" && x0_kind != "uniform") {
    std::fprintf(stderr, "--x0 must be random, mod or uniform, not '%s'\n", x0_kind.c_str());
    return 2;
  }
  const bool x0_uniform = x0_kind == "uniform";
  const bool tape_reduction = args.has("tape-reduction");
  uint32_t n = static_cast<uint32_t>(args.get_int("n", 1 << 24));
  int reps = static_cast<int>(args.get_int("reps", 5));
  int batch = static_cast<int>(args.get_int("batch", 4));
  std::string layout = args.get("layout", "auto");
  std::vector<int> steps;
  {
    std::string s = args.get("steps", "16,64,256");
    for (size_t at = 0; at < s.size();) {
      size_t comma = s.find(',', at);
      if (comma == std::string::npos) comma = s.size();
      steps.push_back(std::stoi(s.substr(at, comma - at)));
      at = comma + 1;
    }
  }
  for (int L : steps) {
    if (L <= 0) {
      std::fprintf(stderr, "--steps: every step count must be positive\n");
      return 2;
    }
  }
  std::string kernels = "," + args.get("kernels", "sin,recurrence,training") + ",";
  auto want = [&](const char* k) {
    return kernels.find(std::string(",") + k + ",") != std::string::npos;
  };
  for (size_t at = 1; at < kernels.size();) {
    size_t comma = kernels.find(',', at);
    std::string k = kernels.substr(at, comma - at);
    if (k != "sin" && k != "recurrence" && k != "training") {
      std::fprintf(stderr, "--kernels: '%s' is not sin, recurrence or training\n", k.c_str());
      return 2;
    }
    at = comma + 1;
  }
  if (layout != "auto" && layout != "slot" && layout != "thread") {
    std::fprintf(stderr, "--layout must be auto, slot or thread, not '%s'\n", layout.c_str());
    return 2;
  }
  // Forced private tier: the adjoint registered as is runs in private arrays (up to
  // kMaxPrivateTierBytes per thread), its heap_only() copy in the heaps.
  runtime::RuntimeOptions rt_options;
  rt_options.adstack_tier = runtime::AdstackTier::kPrivate;
  // Both tiers specialized where the kernel allows it; unspecialized() copies measure without.
  rt_options.adstack_specialize = runtime::AdstackSpecialize::kAll;
  rt_options.adstack_private_min_length = static_cast<uint32_t>(
      args.get_int("private-min-length", runtime::RuntimeOptions{}.adstack_private_min_length));
  auto rt_r = runtime::Runtime::create(rt_options);
  if (!rt_r.ok()) {
    std::fprintf(stderr, "%s\n", rt_r.status().to_string().c_str());
    return 1;
  }
  runtime::Runtime& rt = **rt_r;
  Target target = target_from_caps(rt.caps());
  if (layout == "slot") target.adstack_layout = adstack::Layout::kSlotMajor;
  if (layout == "thread") target.adstack_layout = adstack::Layout::kThreadMajor;
  // The adjoint columns without segmented checkpointing (every iteration checkpointed, as
  // before it existed) and with it (--segment K, default kGpuCheckpointSegment, on every device).
  AdjointOptions every_iteration, segmented;
  segmented.checkpoint_segment =
      static_cast<uint32_t>(args.get_int("segment", codegen::kGpuCheckpointSegment));
  auto hc = rt.register_kernel(testing::make_copy_u32x4_kernel()).value();

  // Default: seeded random x0 over [0, 1) and w over [0.25, 0.75) (bench_util.h). --x0 mod:
  // x0 = 0.001 (i mod 1000), as in issue 13's first measurement, w = 0.25 + 0.0005 (i mod 1000)
  // for the recurrence; --x0 uniform: x0 a hash of i over [0, 1) (issue 13 saw a 3.6x slower
  // adjoint with these). Seeds 1.
  std::vector<float> x0(n), w0(n), ones(n, 1.0f), zeros(n, 0.0f);
  if (x0_kind == "random") {
    x0 = bench::random_floats(n, 1, 0.0f, 1.0f);
    w0 = bench::random_floats(n, 2, 0.25f, 0.75f);
  } else {
    for (uint32_t i = 0; i < n; ++i) {
      x0[i] = 0.001f * static_cast<float>(i % 1000);
      if (x0_uniform) x0[i] = static_cast<float>((i * 2654435761u) >> 8) / 16777216.0f;
      w0[i] = 0.25f + 0.0005f * static_cast<float>(i % 1000);
    }
  }
  auto arr = [&](const char* name, const std::vector<float>& init) {
    auto h = rt.create_ndarray(runtime::DType::kF32, {n}, name).value();
    (void)rt.upload(h, init.data(), 4ull * n);
    return h;
  };
  auto x = arr("x", x0), y = arr("y", zeros), xg = arr("x_grad", zeros), yg = arr("y_grad", ones),
       tg = arr("tape_x_grad", zeros);
  // The copy moves seeded random bits (bench_util.h) and is checked after timing.
  auto xu = rt.create_ndarray(runtime::DType::kU32, {n}, "xu").value();
  auto yu = rt.create_ndarray(runtime::DType::kU32, {n}, "yu").value();
  const std::vector<float> copy_in = bench::random_floats(n, 7);
  if (!rt.upload(xu, copy_in.data(), 4ull * n).ok())
    bench::check_failed("uploading the copy's input");
  Timed copy{hc, {runtime::Arg::u32(n / 4), runtime::Arg::ndarray(xu), runtime::Arg::ndarray(yu)}};
  bench::warm_up(rt, copy.h, copy.args, 300);
  double copy_ms = time_ms(rt, {copy}, reps, batch)[0];
  {
    std::vector<float> got = bench::download_or_fail<float>(rt, yu, n, "copy output");
    if (std::memcmp(got.data(), copy_in.data(), 4ull * (n & ~3u)) != 0)
      bench::check_failed("the hand-written copy's output differs from its input");
  }
  double copy_gbs = 8.0 * (n & ~3u) / (copy_ms * 1e6);
  std::printf("device: %s; %u elements; vkad adstack layout %s; copy %.3f ms = %.1f GB/s\n",
              rt.caps().device_name.c_str(), n, adstack::layout_name(target.adstack_layout),
              copy_ms, copy_gbs);
  bench::JsonRecords json;
  int status = 0;
  // One kernel: vkad forward and adjoint and the hand tape at every L. `inputs` are the
  // forward's differentiated inputs (x, then w for the recurrence); vkad's gradients go to
  // `grads`, the tape's to `tape_grads` (same order).
  auto measure = [&](const char* kernel, const Kernel& fwd, bool rec,
                     const std::vector<runtime::NdArrayHandle>& inputs,
                     const std::vector<runtime::NdArrayHandle>& grads,
                     const std::vector<runtime::NdArrayHandle>& tape_grads) -> bool {
    Kernel adj = make_adjoint(fwd, target, every_iteration).value();
    auto hf = rt.register_kernel(compile(fwd, target).value()).value();
    runtime::CompiledKernel adj_compiled = compile(adj, target).value();
    auto ha = rt.register_kernel(heap_only(unspecialized(adj_compiled))).value();  // heap tier
    auto hp = rt.register_kernel(unspecialized(adj_compiled)).value();             // private tier
    auto has = rt.register_kernel(heap_only(adj_compiled)).value();  // heap tier, specialized
    auto hps = rt.register_kernel(adj_compiled).value();             // private tier, specialized
    // Segmented checkpointing, both tiers specialized.
    runtime::CompiledKernel seg_compiled =
        compile(make_adjoint(fwd, target, segmented).value(), target).value();
    auto hch = rt.register_kernel(heap_only(seg_compiled)).value();
    auto hcp = rt.register_kernel(seg_compiled).value();
    auto tape = tape_kernel(rec, tape_reduction);
    if (!tape.ok()) {
      std::fprintf(stderr, "hand tape: %s\n", tape.status().to_string().c_str());
      return false;
    }
    auto ht = rt.register_kernel(*tape).value();
    // ht: hand heap tape; pt: hand private tape (trip count from the args, as vkad's); st: the
    // same with the trip count a constant (static capacity).
    std::printf(
        "%5s %9s %10s %10s %10s %10s %10s %10s %10s %10s %10s %10s %9s %9s %9s %9s %9s %9s %9s %9s "
        "%10s %9s %9s\n",
        "L", "tape T", "forward", "adj heap", "adj priv", "heap spec", "priv spec", "ckpt heap",
        "ckpt priv", "heap tape", "priv tape", "stat tape", "heap/ht", "priv/pt", "priv/st",
        "hs/ht", "ps/st", "ch/ht", "cp/st", "pt/ht", "tape GB/s", "tape/copy", "max rel d");
    std::printf("%5s %9s %10s %10s %10s %10s %10s %10s %10s %10s %10s %10s\n", "", "", "ms", "ms",
                "ms", "ms", "ms", "ms", "ms", "ms", "ms", "ms");
    for (int L : steps) {
      auto ptape = tape_kernel(rec, tape_reduction, static_cast<uint32_t>(L));
      if (!ptape.ok()) {
        std::fprintf(stderr, "private tape: %s\n", ptape.status().to_string().c_str());
        return false;
      }
      auto hpt = rt.register_kernel(*ptape).value();
      auto stape = tape_kernel(rec, tape_reduction, static_cast<uint32_t>(L), true);
      if (!stape.ok()) {
        std::fprintf(stderr, "static private tape: %s\n", stape.status().to_string().c_str());
        return false;
      }
      auto hst = rt.register_kernel(*stape).value();
      // The tape's threads: as many as cover n (whole groups), at most max_groups groups, and
      // few enough that L*T floats fit one binding.
      uint64_t groups = (n + kTapeLocalSize - 1) / kTapeLocalSize;
      groups = std::min<uint64_t>(groups, runtime::RuntimeOptions{}.max_groups);
      groups = std::max<uint64_t>(1, std::min<uint64_t>(groups, rt.caps().max_storage_buffer_range /
                                                                    (4ull * L * kTapeLocalSize)));
      uint32_t T = static_cast<uint32_t>(groups * kTapeLocalSize);
      auto heap =
          rt.create_ndarray(runtime::DType::kF32,
                            {static_cast<uint32_t>(static_cast<uint64_t>(L) * T)}, "tape heap")
              .value();
      std::vector<runtime::Arg> fa = {runtime::Arg::i32(L)};
      for (auto h : inputs) fa.push_back(runtime::Arg::ndarray(h));
      fa.push_back(runtime::Arg::ndarray(y));
      std::vector<runtime::Arg> aa = fa;
      for (auto h : grads) aa.push_back(runtime::Arg::ndarray(h));
      aa.push_back(runtime::Arg::ndarray(yg));
      std::vector<runtime::Arg> ta = {runtime::Arg::i32(L), runtime::Arg::u32(T)};
      for (auto h : inputs) ta.push_back(runtime::Arg::ndarray(h));
      ta.push_back(runtime::Arg::ndarray(heap));
      for (auto h : tape_grads) ta.push_back(runtime::Arg::ndarray(h));
      ta.push_back(runtime::Arg::ndarray(yg));

      // Equal work: each of vkad's adjoints (one launch into zeroed gradients: it accumulates)
      // and the private tape against the heap tape.
      const uint64_t fallbacks = rt.stats()->adstack_private_fallbacks;
      const uint64_t spec_misses = rt.stats()->adstack_specialize_misses;
      auto run =
          [&](runtime::KernelHandle h, const std::vector<runtime::Arg>& a,
              const std::vector<runtime::NdArrayHandle>& out) -> std::vector<std::vector<float>> {
        for (auto g : out) (void)rt.upload(g, zeros.data(), 4ull * n);
        Status st = rt.launch(h, a);
        if (st.ok()) st = rt.synchronize();
        if (!st.ok()) std::fprintf(stderr, "%s, L = %d: %s\n", kernel, L, st.to_string().c_str());
        std::vector<std::vector<float>> v(out.size(), std::vector<float>(n));
        for (size_t g = 0; g < out.size(); ++g) (void)rt.download(out[g], v[g].data(), 4ull * n);
        return v;
      };
      const auto ref = run(ht, ta, tape_grads);
      double max_rel = 0;
      for (const auto& got : {run(ha, aa, grads), run(hp, aa, grads), run(has, aa, grads),
                              run(hps, aa, grads), run(hch, aa, grads), run(hcp, aa, grads),
                              run(hpt, ta, tape_grads), run(hst, ta, tape_grads)}) {
        for (size_t g = 0; g < got.size(); ++g) {
          for (uint32_t i = 0; i < n; ++i) {
            double d = std::fabs(double(got[g][i]) - ref[g][i]) /
                       std::max(std::fabs(double(ref[g][i])), 1e-30);
            max_rel = std::max(max_rel, d);
          }
        }
      }
      const bool private_ran = rt.stats()->adstack_private_fallbacks == fallbacks;
      const bool specialized_ran = rt.stats()->adstack_specialize_misses == spec_misses;
      if (!(max_rel <= 1e-3)) {
        std::fprintf(stderr,
                     "%s, L = %d: vkad's gradients, the private tape's and the heap tape's differ "
                     "(max relative %.3g)\n",
                     kernel, L, max_rel);
        status = 1;
      }

      std::vector<double> ms = time_ms(rt,
                                       {{hf, fa},
                                        {ha, aa},
                                        {hp, aa},
                                        {ht, ta},
                                        {hpt, ta},
                                        {hst, ta},
                                        {has, aa},
                                        {hps, aa},
                                        {hch, aa},
                                        {hcp, aa}},
                                       reps, batch);
      double f = ms[0], a = ms[1], ap = ms[2], t = ms[3], pt = ms[4], spt = ms[5], as = ms[6],
             aps = ms[7], ch = ms[8], cp = ms[9];
      // The tape's bytes: the inputs and y_grad read and the gradients written (4 B each per
      // element), each step stored and read back once (8 B).
      double tape_bytes = double(n) * (4.0 * (2 * inputs.size() + 1) + 8.0 * L);
      double tape_gbs = tape_bytes / (t * 1e6);
      std::printf(
          "%5d %9u %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %8.2fx "
          "%8.2fx "
          "%8.2fx %8.2fx %8.2fx %8.2fx %8.2fx "
          "%8.2fx %10.1f %8.0f%% %9.2g%s%s%s\n",
          L, T, f, a, ap, as, aps, ch, cp, t, pt, spt, a / t, ap / pt, ap / spt, as / t, aps / spt,
          ch / t, cp / spt, pt / t, tape_gbs, 100 * tape_gbs / copy_gbs, max_rel,
          private_ran ? "" : "  (adj priv fell back to the heap)",
          specialized_ran ? "" : "  (a specialized launch missed its variant)",
          tape_gbs > copy_gbs ? "  FLAGGED: tape GB/s above the copy measured on the same device, "
                                "not a result"
                              : "");
      json.begin();
      json.field("L", L);
      json.field("n", n);
      json.field("layout", adstack::layout_name(target.adstack_layout));
      json.field("forward_ms", f);
      json.field("adjoint_ms", a);
      json.field("adjoint_private_ms", ap);
      json.field("adjoint_private_ran_private", private_ran ? 1 : 0);
      json.field("adjoint_specialized_ms", as);
      json.field("adjoint_private_specialized_ms", aps);
      json.field("adjoint_specialized_over_hand_tape", as / t);
      json.field("adjoint_private_specialized_over_hand_private_tape", aps / pt);
      json.field("adjoint_private_specialized_over_hand_static_private_tape", aps / spt);
      json.field("specialized_ran", specialized_ran ? 1 : 0);
      json.field("checkpoint_segment", segmented.checkpoint_segment);
      json.field("adjoint_checkpointed_ms", ch);
      json.field("adjoint_private_checkpointed_ms", cp);
      json.field("adjoint_checkpointed_over_hand_tape", ch / t);
      json.field("adjoint_private_checkpointed_over_hand_static_private_tape", cp / spt);
      json.field("hand_tape_ms", t);
      json.field("hand_private_tape_ms", pt);
      json.field("hand_static_private_tape_ms", spt);
      json.field("adjoint_private_over_hand_static_private_tape", ap / spt);
      json.field("private_min_length", rt_options.adstack_private_min_length);
      json.field("adjoint_over_hand_tape", a / t);
      json.field("adjoint_private_over_hand_private_tape", ap / pt);
      json.field("hand_private_tape_over_hand_tape", pt / t);
      json.field("hand_tape_threads", T);
      json.field("hand_tape_gbs", tape_gbs);
      json.field("copy_ms", copy_ms);
      json.field("copy_gbs", copy_gbs);
      json.field("hand_tape_above_copy", tape_gbs > copy_gbs ? 1 : 0);
      json.field("gradient_max_rel_diff", max_rel);
      json.field("kernel", kernel);
      (void)rt.free_ndarray(heap);
      (void)rt.unregister_kernel(hpt);
      (void)rt.unregister_kernel(hst);
    }
    return true;
  };
  if (want("sin") && !measure("sin_loop", sin_loop(), false, {x}, {xg}, {tg})) return 1;
  if (want("recurrence")) {
    auto w = arr("w", w0), wg = arr("w_grad", zeros), twg = arr("tape_w_grad", zeros);
    std::printf("recurrence v <- 0.5 v + 0.25 sin(v) w, v0 = x; dL/dx and dL/dw:\n");
    if (!measure("recurrence", recurrence(), true, {x, w}, {xg, wg}, {tg, twg})) return 1;
  }
  if (want("training")) {
    // The training example's kernel (examples/diffsim: particles integrated for S steps, four
    // carried locals), forward and adjoint per tier, as the training loop launches them: many
    // launches between syncs.
    const uint32_t P = static_cast<uint32_t>(args.get_int("particles", 65536));
    const int S = static_cast<int>(args.get_int("train-steps", 256));
    const int tb = static_cast<int>(args.get_int("train-batch", 50));
    Kernel fwd = diffsim::simulate_kernel();
    Kernel adj = make_adjoint(fwd, target, every_iteration).value();
    runtime::CompiledKernel ca = compile(adj, target).value();
    runtime::CompiledKernel cs =
        compile(make_adjoint(fwd, target, segmented).value(), target).value();
    auto hf = rt.register_kernel(compile(fwd, target).value()).value();
    auto ha = rt.register_kernel(heap_only(unspecialized(ca))).value();
    auto hp = rt.register_kernel(unspecialized(ca)).value();
    auto has = rt.register_kernel(heap_only(ca)).value();
    auto hps = rt.register_kernel(ca).value();
    auto hch = rt.register_kernel(heap_only(cs)).value(), hcp = rt.register_kernel(cs).value();
    std::vector<float> p0(2 * P), v0(2 * P, 0.0f), tgt(2 * P), seed(P, 1.0f), zero2(2 * P, 0.0f);
    for (uint32_t i = 0; i < P; ++i) {
      float a = static_cast<float>((i * 2654435761u) >> 8) / 16777216.0f;
      float b = static_cast<float>((i * 40503u + 7u) % 1000u) / 1000.0f;
      p0[2 * i] = 2 * a - 1, p0[2 * i + 1] = 0.5f * b;
      tgt[2 * i] = p0[2 * i] + 0.8f * b - 0.4f, tgt[2 * i + 1] = p0[2 * i + 1] + 0.6f * a - 0.5f;
    }
    auto arr2 = [&](std::vector<uint32_t> shape, const char* name, const std::vector<float>& init) {
      auto h = rt.create_ndarray(runtime::DType::kF32, shape, name).value();
      (void)rt.upload(h, init.data(), 4 * init.size());
      return h;
    };
    auto hp0 = arr2({P, 2}, "p0", p0), hv0 = arr2({P, 2}, "v0", v0),
         ht = arr2({P, 2}, "target", tgt), hl = arr2({P}, "loss", std::vector<float>(P, 0.0f)),
         hg = arr2({P, 2}, "v0_grad", zero2), hlg = arr2({P}, "loss_grad", seed);
    using runtime::Arg;
    std::vector<Arg> fa = {Arg::i32(S),       Arg::f32(1.0f / static_cast<float>(S)),
                           Arg::ndarray(hp0), Arg::ndarray(hv0),
                           Arg::ndarray(ht),  Arg::ndarray(hl)};
    std::vector<Arg> aa = fa;
    aa.push_back(Arg::ndarray(hg));
    aa.push_back(Arg::ndarray(hlg));
    // The two tiers' gradients agree (same arithmetic, different storage).
    const runtime::KernelHandle variants[] = {ha, hp, has, hps, hch, hcp};
    constexpr int kVariants = 6;
    std::vector<std::vector<float>> g(kVariants, std::vector<float>(2 * P));
    const uint64_t fallbacks = rt.stats()->adstack_private_fallbacks;
    for (int tier = 0; tier < kVariants; ++tier) {
      (void)rt.upload(hg, zero2.data(), 4 * zero2.size());
      Status st = rt.launch(variants[tier], aa);
      if (st.ok()) st = rt.synchronize();
      if (!st.ok()) {
        std::fprintf(stderr, "training: %s\n", st.to_string().c_str());
        return 1;
      }
      (void)rt.download(hg, g[tier].data(), 4 * g[tier].size());
    }
    const bool private_ran = rt.stats()->adstack_private_fallbacks == fallbacks;
    double max_rel = 0;
    for (int v = 1; v < kVariants; ++v) {
      for (uint32_t i = 0; i < 2 * P; ++i) {
        max_rel = std::max(max_rel, std::fabs(double(g[v][i]) - g[0][i]) /
                                        std::max(std::fabs(double(g[0][i])), 1e-30));
      }
    }
    if (!(max_rel <= 1e-4)) {
      std::fprintf(stderr, "training: the tiers' gradients differ (max relative %.3g)\n", max_rel);
      status = 1;
    }
    std::vector<double> ms = time_ms(
        rt, {{hf, fa}, {ha, aa}, {hp, aa}, {has, aa}, {hps, aa}, {hch, aa}, {hcp, aa}}, reps, tb);
    std::printf(
        "training example kernel: %u particles, %d steps, batches of %d launches:\n"
        "  forward %.3f ms, adjoint heap tier %.3f ms (%.2fx forward), private tier %.3f ms "
        "(%.2fx)%s;\n"
        "  specialized: heap tier %.3f ms (%.2fx), private tier %.3f ms (%.2fx);\n"
        "  checkpointed every %u steps, specialized: heap tier %.3f ms (%.2fx), private tier %.3f "
        "ms "
        "(%.2fx); variants' max rel d %.2g\n",
        P, S, tb, ms[0], ms[1], ms[1] / ms[0], ms[2], ms[2] / ms[0],
        private_ran ? "" : " (private fell back to the heap)", ms[3], ms[3] / ms[0], ms[4],
        ms[4] / ms[0], segmented.checkpoint_segment, ms[5], ms[5] / ms[0], ms[6], ms[6] / ms[0],
        max_rel);
    json.begin();
    json.field("kernel", "training");
    json.field("particles", P);
    json.field("L", S);
    json.field("train_batch", tb);
    json.field("forward_ms", ms[0]);
    json.field("adjoint_ms", ms[1]);
    json.field("adjoint_private_ms", ms[2]);
    json.field("adjoint_private_ran_private", private_ran ? 1 : 0);
    json.field("adjoint_over_forward", ms[1] / ms[0]);
    json.field("adjoint_private_over_forward", ms[2] / ms[0]);
    json.field("adjoint_specialized_ms", ms[3]);
    json.field("adjoint_private_specialized_ms", ms[4]);
    json.field("checkpoint_segment", segmented.checkpoint_segment);
    json.field("adjoint_checkpointed_ms", ms[5]);
    json.field("adjoint_private_checkpointed_ms", ms[6]);
    json.field("adjoint_checkpointed_over_forward", ms[5] / ms[0]);
    json.field("adjoint_private_checkpointed_over_forward", ms[6] / ms[0]);
    json.field("adjoint_specialized_over_forward", ms[3] / ms[0]);
    json.field("adjoint_private_specialized_over_forward", ms[4] / ms[0]);
  }
  std::printf("vkad adstack heap: %llu bytes\n",
              (unsigned long long)rt.stats()->adstack_heap_bytes);
  if (args.has("json") && !json.write(args.get("json", ""), rt.caps().device_name)) {
    std::fprintf(stderr, "cannot write %s\n", args.get("json", "").c_str());
    return 1;
  }
  return status;
}
