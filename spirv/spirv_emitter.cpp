#include "spirv/spirv_emitter.h"

#include <spirv/unified1/GLSL.std.450.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "abi/print_records.h"
#include "ir/launch_access.h"
#include "ir/walk.h"
#include "spirv/f64_math.h"
#include "spirv/spirv_module.h"

namespace vkad::codegen {

namespace {

using abi::kErrorOutOfBounds;

constexpr uint32_t kScopeDevice = 1;
// An out-of-bounds flag whose access has no site (describe_device_error names none): the largest
// 24-bit detail.
constexpr uint32_t kUnknownSite = (1u << 24) - 1;
constexpr uint32_t kRelaxed = 0;

// The emitter of one task is five layers, each a class on top of the one before it; a layer
// calls only into itself and the layers below, and owns the state of its concern:
//   ModuleBuilder   the module, the task's inputs, and the building blocks the layers above emit
//                   with (instructions, dtype constants, structured control flow, IR values, the
//                   args buffer);
//   ValueEmitter    pure values: arithmetic, comparisons, casts, transcendentals;
//   MemoryEmitter   ndarrays: storage buffers, addressing, bounds and finite checks, loads,
//                   stores, atomics;
//   AdstackEmitter  the adstacks: heaps, the private tier, push / pop / top / accumulate;
//   TaskEmitter     the entry point, the grid-stride loop over the task's range, and the
//                   statements (dispatched by family to the layers below; locals, shared
//                   arrays, control flow, barriers, print / assert).

// The SPIR-V module of one task and the building blocks every layer above emits with:
// instructions (op / ext), the types and constants of IR dtypes, the IR values bound so far,
// structured control flow (blocks, loops, selections, and the current block's state), and the
// args buffer: the module's interface, launch-constant words (a specializable one as a select
// of spec constants), the scalars and shapes read once per invocation, the error words.
class ModuleBuilder {
 protected:
  ModuleBuilder(const Kernel& k, size_t task, const abi::CompiledKernel& layout,
                const Target& target, const EmitOptions& o)
      : k_(k),
        task_(k.tasks[task]),
        task_index_(static_cast<uint32_t>(task)),
        layout_(layout),
        target_(target),
        o_(o) {}

  // The module's inputs: the invocation and workgroup counts, the args buffer (as `args` and
  // `errors`), the push constants (the launch's [begin, end)).
  struct Interface {
    uint32_t gid_var, nwg_var, pc_var, v3;
  };
  Interface declare_interface() {
    uint32_t v3 = m_.t_vector(u32_, 3);
    uint32_t in_v3 = m_.t_pointer(spv::StorageClassInput, v3);
    uint32_t gid_var = m_.global_variable(in_v3, spv::StorageClassInput);
    m_.decorate(gid_var, spv::DecorationBuiltIn, {spv::BuiltInGlobalInvocationId});
    uint32_t nwg_var = m_.global_variable(in_v3, spv::StorageClassInput);
    m_.decorate(nwg_var, spv::DecorationBuiltIn, {spv::BuiltInNumWorkgroups});
    // The args buffer through two variables on its one binding: `args`, read-only, for the
    // scalars, extents and the rest the host wrote, and `errors` for the error words a kernel
    // raises with an atomic. With the atomic on the read variable the driver could not treat
    // the launch constants as read-only (H100: DiffTaichi's mass_spring spent a quarter of its
    // time so). The two never touch the same word.
    uint32_t args_block = m_.t_buffer_block(u32_, 4);
    const uint32_t args_ptr_t = m_.t_pointer(spv::StorageClassStorageBuffer, args_block);
    args_var_ = m_.global_variable(args_ptr_t, spv::StorageClassStorageBuffer, 0);
    m_.decorate(args_var_, spv::DecorationNonWritable);
    m_.name(args_var_, "args");
    errors_var_ = m_.global_variable(args_ptr_t, spv::StorageClassStorageBuffer, 0);
    m_.name(errors_var_, "errors");
    uint32_t pc_block = m_.t_u32_block(2);
    uint32_t pc_var = m_.global_variable(m_.t_pointer(spv::StorageClassPushConstant, pc_block),
                                         spv::StorageClassPushConstant);
    return {gid_var, nwg_var, pc_var, v3};
  }

  uint32_t op(spv::Op o, uint32_t type, std::initializer_list<uint32_t> operands) {
    uint32_t r = m_.id();
    SpirvModule::Words w = {type, r};
    w.insert(w.end(), operands.begin(), operands.end());
    m_.op(o, w);
    return r;
  }
  uint32_t ext(GLSLstd450 inst, uint32_t type, std::initializer_list<uint32_t> operands) {
    uint32_t r = m_.id();
    SpirvModule::Words w = {type, r, m_.glsl_std_450(), static_cast<uint32_t>(inst)};
    w.insert(w.end(), operands.begin(), operands.end());
    m_.op(spv::OpExtInst, w);
    return r;
  }
  void block(uint32_t label) {
    m_.label(label);
    cur_ = label;
    ended_ = false;
    sole_pred_ = 0;
  }
  // Opens a loop's header block and returns it with the block its entry edge comes from. A
  // loop body that begins with a loop is its header: no empty block that only branches on
  // (validation time grows faster than the block count in deep nests, issue 27).
  void enter_header(uint32_t* header, uint32_t* pre) {
    if (sole_pred_ && !ended_ && m_.block_empty()) {
      *header = cur_;
      *pre = sole_pred_;
      sole_pred_ = 0;
      return;
    }
    *header = m_.id();
    *pre = cur_;
    branch(*header);
    block(*header);
  }
  // Ends the current block, unless a break / continue (the last statement of its IR block)
  // already did.
  void branch(uint32_t to) {
    if (!ended_) m_.op(spv::OpBranch, {to});
    ended_ = false;
  }

  uint32_t type(DType t) {
    switch (t) {
      case DType::kF32: return m_.t_float(32);
      case DType::kF64: return m_.t_float(64);
      case DType::kI32: return i32_;
      case DType::kU32: return u32_;
      case DType::kI64: return m_.t_int(64, true);
      case DType::kBool: return bool_;
    }
    return u32_;
  }
  uint32_t zero(DType t) {
    switch (t) {
      case DType::kF32: return m_.c_f32(0);
      case DType::kF64: return m_.c_f64(0);
      case DType::kI32: return m_.c_i32(0);
      case DType::kI64: return m_.c_i64(0);
      case DType::kBool: return m_.c_bool(false);
      case DType::kU32: return m_.c_u32(0);
    }
    return m_.c_u32(0);
  }
  uint32_t one(DType t) {
    switch (t) {
      case DType::kF32: return m_.c_f32(1);
      case DType::kF64: return m_.c_f64(1);
      case DType::kI32: return m_.c_i32(1);
      case DType::kI64: return m_.c_i64(1);
      case DType::kBool: return m_.c_bool(true);
      case DType::kU32: return m_.c_u32(1);
    }
    return m_.c_u32(1);
  }
  uint32_t v(ValueId id) const { return values_.at(id); }
  DType vt(ValueId id) const { return types_.at(id); }
  void set(const Stmt& s, uint32_t id) {
    values_[s.result] = id;
    types_[s.result] = s.type;
  }

  // A structured loop `for (i = start; i < end; i += step) body(i)`. The header tests and
  // branches itself (no separate test block): SPIR-V validation walks the dominator tree once
  // per enclosing construct and block, so every block a loop adds costs superlinearly in a deep
  // nest (issue 27, docs/benchmarks-log.md "Compile time against nesting depth").
  template <typename Body>
  // Returns the index's phi, which at the merge block holds the first index not run.
  uint32_t loop(uint32_t ty, uint32_t start, uint32_t end, uint32_t step, bool is_signed, Body body,
                uint32_t control = spv::LoopControlMaskNone) {
    uint32_t header = 0, body_l = m_.id(), cont = m_.id(), merge = m_.id();
    uint32_t next = m_.id();
    uint32_t pre = 0;
    enter_header(&header, &pre);
    uint32_t i = op(spv::OpPhi, ty, {start, pre, next, cont});
    uint32_t c = op(is_signed ? spv::OpSLessThan : spv::OpULessThan, bool_, {i, end});
    m_.op(spv::OpLoopMerge, {merge, cont, control});
    m_.op(spv::OpBranchConditional, {c, body_l, merge});
    block(body_l);
    sole_pred_ = header;
    loops_.push_back({merge, cont});
    body(i);
    loops_.pop_back();
    branch(cont);
    block(cont);
    m_.op(spv::OpIAdd, {ty, next, i, step});
    branch(header);
    block(merge);
    return i;
  }

  // `if (cond) then(); else otherwise();` as a structured selection.
  template <typename Then, typename Else>
  void if_else(uint32_t cond, Then then_body, Else else_body) {
    uint32_t t = m_.id(), e = m_.id(), merge = m_.id();
    m_.op(spv::OpSelectionMerge, {merge, spv::SelectionControlMaskNone});
    m_.op(spv::OpBranchConditional, {cond, t, e});
    block(t);
    then_body();
    branch(merge);
    block(e);
    else_body();
    branch(merge);
    block(merge);
  }

  // A launch-constant word. One the runtime may specialize (abi/kernel_abi.h, "Launch
  // specialization") is select(flag, value, loaded), both spec constants: the driver folds it
  // to the constant or to the load when it creates the pipeline.
  uint32_t args_word(uint32_t byte_offset) {
    uint32_t loaded = op(spv::OpLoad, u32_, {args_ptr(m_.c_u32(byte_offset / 4))});
    const std::vector<uint32_t>& spec = layout_.tasks[task_index_].spec_words;
    auto it = std::find(spec.begin(), spec.end(), byte_offset);
    if (it == spec.end()) return loaded;
    uint32_t i = static_cast<uint32_t>(it - spec.begin());
    auto [c, fresh] = spec_consts_.try_emplace(i);
    if (fresh) {
      c->second.first = m_.spec_bool(abi::launch_spec_flag_id(i), false);
      c->second.second = m_.spec_u32(abi::launch_spec_value_id(i), 0);
      m_.name(c->second.first, "launch_spec_flag_" + std::to_string(byte_offset / 4));
      m_.name(c->second.second, "launch_spec_word_" + std::to_string(byte_offset / 4));
    }
    return op(spv::OpSelect, u32_, {c->second.first, c->second.second, loaded});
  }
  // Every word the runtime may specialize declares its constants (kernel_checks.cpp checks
  // it), also one this task's statements never load (its unused load is dropped).
  void declare_spec_words() {
    const std::vector<uint32_t>& spec = layout_.tasks[task_index_].spec_words;
    for (uint32_t i = 0; i < spec.size(); ++i) {
      if (!spec_consts_.count(i)) args_word(spec[i]);
    }
  }

  // The first error of a launch wins: compare-and-swap 0 -> code.
  void raise(uint32_t code_id) {
    const uint32_t ptr =
        op(spv::OpAccessChain, m_.t_pointer(spv::StorageClassStorageBuffer, u32_),
           {errors_var_, m_.c_u32(0), m_.c_u32(layout_.error_flag_offset(task_index_) / 4)});
    op(spv::OpAtomicCompareExchange, u32_,
       {ptr, m_.c_u32(kScopeDevice), m_.c_u32(kRelaxed), m_.c_u32(kRelaxed), code_id, m_.c_u32(0)});
  }
  // A word of the args buffer through the writable view (`errors`).
  uint32_t error_word_ptr(uint32_t word) {
    return op(spv::OpAccessChain, m_.t_pointer(spv::StorageClassStorageBuffer, u32_),
              {errors_var_, m_.c_u32(0), word});
  }
  uint32_t read_scalar(uint32_t param) {
    const Param& p = k_.params[param];
    uint32_t off = layout_.scalar_offset(param);
    uint32_t w = args_word(off);
    switch (p.dtype) {
      case DType::kF32: return op(spv::OpBitcast, m_.t_float(32), {w});
      case DType::kI32: return op(spv::OpBitcast, i32_, {w});
      case DType::kBool: return op(spv::OpINotEqual, bool_, {w, m_.c_u32(0)});
      case DType::kF64:
      case DType::kI64: {
        uint32_t hi = args_word(off + 4);
        uint32_t pair = op(spv::OpCompositeConstruct, m_.t_vector(u32_, 2), {w, hi});
        return op(spv::OpBitcast, type(p.dtype), {pair});
      }
      case DType::kU32: return w;
    }
    return w;
  }

  // Scalars and shapes are constant for a launch: read each one once, in the entry block, so
  // every use (inside loops too) shares the load.
  void load_launch_constants(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.op == Op::kArg && !scalars_.count(s.param)) scalars_[s.param] = read_scalar(s.param);
      const bool array = s.op == Op::kShape || accesses_array(s.op);
      if (array && !shapes_.count(s.param)) {
        std::vector<uint32_t>& dims = shapes_[s.param];
        for (uint32_t d = 0; d < k_.params[s.param].rank; ++d) {
          dims.push_back(args_word(layout_.shape_offset(s.param) + 4 * d));
        }
      }
      for (const Block& c : s.blocks) load_launch_constants(c);
    }
  }

  SpirvModule m_;
  const Kernel& k_;
  const Task& task_;
  uint32_t task_index_;
  const abi::CompiledKernel& layout_;
  const Target& target_;
  const EmitOptions& o_;
  uint32_t u32_ = 0, i32_ = 0, bool_ = 0, gid_ = 0, cur_ = 0;
  bool ended_ = false;  // the current block ends with a break / continue already
  // The only predecessor of the current block while it is a loop body's first block, else 0.
  uint32_t sole_pred_ = 0;
  std::vector<std::pair<uint32_t, uint32_t>> loops_;  // (merge, continue target), innermost last
  std::unordered_map<ValueId, uint32_t> values_;
  std::unordered_map<ValueId, DType> types_;
  std::unordered_map<uint32_t, uint32_t> scalars_;              // param -> value
  std::unordered_map<uint32_t, std::vector<uint32_t>> shapes_;  // param -> extents (u32)

 private:
  uint32_t args_ptr(uint32_t word) {
    return op(spv::OpAccessChain, m_.t_pointer(spv::StorageClassStorageBuffer, u32_),
              {args_var_, m_.c_u32(0), word});
  }

  uint32_t args_var_ = 0, errors_var_ = 0;
  // Launch specialization constants per spec word index: (flag, value).
  std::map<uint32_t, std::pair<uint32_t, uint32_t>> spec_consts_;
};

// The values of pure statements (leaves, unary, binary, compare, cast) with the semantics of
// ir.h's table for every input, transcendentals as spirv_emitter.h says. Each emits
// straight-line code into the current block; none touches an ndarray or an adstack.
class ValueEmitter : public ModuleBuilder {
 protected:
  using ModuleBuilder::ModuleBuilder;

  uint32_t leaf(const Stmt& s) {
    switch (leaf_op(s.op)) {
      case LeafOp::kConst: return constant(s);
      case LeafOp::kArg: return scalars_.at(s.param);
      case LeafOp::kShape: return op(spv::OpBitcast, i32_, {shapes_.at(s.param)[s.dim]});
    }
    return 0;
  }

  uint32_t unary(const Stmt& s) {
    uint32_t a = v(s.args[0]);
    DType t = s.type;
    uint32_t ty = type(t);
    bool f = is_float(t);
    switch (unary_op(s.op)) {
      case UnaryOp::kNeg: return op(f ? spv::OpFNegate : spv::OpSNegate, ty, {a});
      case UnaryOp::kNot: return op(spv::OpLogicalNot, ty, {a});
      case UnaryOp::kSqrt: return ext(GLSLstd450Sqrt, ty, {a});
      case UnaryOp::kRsqrt: return ext(GLSLstd450InverseSqrt, ty, {a});
      case UnaryOp::kExp: return math(GLSLstd450Exp, t, {a});
      case UnaryOp::kLog: return math(GLSLstd450Log, t, {a});
      case UnaryOp::kSin: return math(GLSLstd450Sin, t, {a});
      case UnaryOp::kCos: return math(GLSLstd450Cos, t, {a});
      case UnaryOp::kTan: return math(GLSLstd450Tan, t, {a});
      case UnaryOp::kTanh: return math(GLSLstd450Tanh, t, {a});
      case UnaryOp::kAsin: return math(GLSLstd450Asin, t, {a});
      case UnaryOp::kAcos: return math(GLSLstd450Acos, t, {a});
      case UnaryOp::kAbs:
        if (t == DType::kU32) return a;
        return ext(f ? GLSLstd450FAbs : GLSLstd450SAbs, ty, {a});
      case UnaryOp::kFloor: return ext(GLSLstd450Floor, ty, {a});
      case UnaryOp::kCeil: return ext(GLSLstd450Ceil, ty, {a});
    }
    return 0;
  }

  uint32_t binary(const Stmt& s) {
    uint32_t a = v(s.args[0]), b = v(s.args[1]);
    DType t = vt(s.args[0]);
    uint32_t ty = type(s.type);
    bool f = is_float(t);
    switch (binary_op(s.op)) {
      case BinaryOp::kAdd: return op(f ? spv::OpFAdd : spv::OpIAdd, ty, {a, b});
      case BinaryOp::kSub: return op(f ? spv::OpFSub : spv::OpISub, ty, {a, b});
      case BinaryOp::kMul: return op(f ? spv::OpFMul : spv::OpIMul, ty, {a, b});
      case BinaryOp::kDiv:
        if (f) return op(spv::OpFDiv, ty, {a, b});
        return integer_division(s.op, t, a, b);
      case BinaryOp::kMod:
      case BinaryOp::kFloorDiv: return integer_division(s.op, t, a, b);
      case BinaryOp::kMin:
      case BinaryOp::kMax: return min_max(s.op == Op::kMin, t, a, b);
      case BinaryOp::kPow: return math(GLSLstd450Pow, t, {a, b});
      case BinaryOp::kAtan2: return math(GLSLstd450Atan2, t, {a, b});
      case BinaryOp::kAnd: return op(spv::OpLogicalAnd, ty, {a, b});
      case BinaryOp::kOr: return op(spv::OpLogicalOr, ty, {a, b});
    }
    return 0;
  }

  uint32_t compare(const Stmt& s) {
    uint32_t a = v(s.args[0]), b = v(s.args[1]);
    DType t = vt(s.args[0]);
    uint32_t ty = type(s.type);
    bool f = is_float(t), sg = t == DType::kI32 || t == DType::kI64, bl = t == DType::kBool;
    auto pick = [&](spv::Op fo, spv::Op so, spv::Op uo) { return f ? fo : sg ? so : uo; };
    switch (compare_op(s.op)) {
      case CompareOp::kLt:
        return op(pick(spv::OpFOrdLessThan, spv::OpSLessThan, spv::OpULessThan), ty, {a, b});
      case CompareOp::kLe:
        return op(pick(spv::OpFOrdLessThanEqual, spv::OpSLessThanEqual, spv::OpULessThanEqual), ty,
                  {a, b});
      case CompareOp::kGt:
        return op(pick(spv::OpFOrdGreaterThan, spv::OpSGreaterThan, spv::OpUGreaterThan), ty,
                  {a, b});
      case CompareOp::kGe:
        return op(
            pick(spv::OpFOrdGreaterThanEqual, spv::OpSGreaterThanEqual, spv::OpUGreaterThanEqual),
            ty, {a, b});
      case CompareOp::kEq:
        return op(bl ? spv::OpLogicalEqual : f ? spv::OpFOrdEqual : spv::OpIEqual, ty, {a, b});
      case CompareOp::kNe:
        return op(bl  ? spv::OpLogicalNotEqual
                  : f ? spv::OpFUnordNotEqual
                      : spv::OpINotEqual,
                  ty, {a, b});
    }
    return 0;
  }

  uint32_t cast(const Stmt& s) {
    uint32_t a = v(s.args[0]);
    DType from = vt(s.args[0]), to = s.type;
    uint32_t ty = type(to);
    if (from == to) return a;
    if (to == DType::kBool) {
      return op(is_float(from) ? spv::OpFUnordNotEqual : spv::OpINotEqual, ty, {a, zero(from)});
    }
    if (from == DType::kBool) return op(spv::OpSelect, ty, {a, one(to), zero(to)});
    if (is_float(from) && is_float(to)) return op(spv::OpFConvert, ty, {a});
    if (is_float(from)) return float_to_int(from, to, a);
    if (is_float(to))
      return op(from == DType::kU32 ? spv::OpConvertUToF : spv::OpConvertSToF, ty, {a});
    if (to == DType::kI64) {  // i32 sign-extends, u32 zero-extends (OpUConvert yields unsigned)
      if (from == DType::kI32) return op(spv::OpSConvert, ty, {a});
      return op(spv::OpBitcast, ty, {op(spv::OpUConvert, m_.t_int(64, false), {a})});
    }
    if (from == DType::kI64) {  // the low 32 bits
      uint32_t low = op(spv::OpUConvert, u32_, {op(spv::OpBitcast, m_.t_int(64, false), {a})});
      return to == DType::kU32 ? low : op(spv::OpBitcast, ty, {low});
    }
    return op(spv::OpBitcast, ty, {a});  // i32 <-> u32
  }

 private:
  uint32_t constant(const Stmt& s) {
    switch (s.type) {
      case DType::kF32: return m_.c_f32(static_cast<float>(s.fimm));
      case DType::kF64: return m_.c_f64(s.fimm);
      case DType::kI32: return m_.c_i32(static_cast<int32_t>(s.iimm));
      case DType::kI64: return m_.c_i64(s.iimm);
      case DType::kBool: return m_.c_bool(s.iimm != 0);
      case DType::kU32: return m_.c_u32(static_cast<uint32_t>(s.iimm));
    }
    return m_.c_u32(static_cast<uint32_t>(s.iimm));
  }

  // x - 2*pi*k with k = x / 2pi rounded to an integer, in f32: a two-term Cody-Waite, 2*pi =
  // C1 + C2 + e with C1 = 201/32 (8 significant bits) and C2 = f32(2*pi - C1). For |k| <= 2^14,
  // k*C1 is exact and x - k*C1 is exact (Sterbenz), fused or not; the second term rounds once
  // or twice (a driver may fuse it into an fma: both are covered), and e*k is below 2^-34 |k|.
  // So the reduced argument is within 2^-19 + |x| 2^-36 of the exact one (precision.cpp) -- far
  // inside Vulkan's 2^-11 for sin/cos, which holds only inside [-pi, pi], so the reduction is
  // needed for every |x| up to 2^14 * 2 pi.
  // k is rounded by adding and subtracting M = 1.5 * 2^23 (exact for |x / 2pi| < 2^22, which
  // covers the reduction's range), not by RoundEven: NVIDIA runs RoundEven (FRND) on the same
  // quarter-rate pipe as the sin itself, which doubled the sin loop's time on the H200, while
  // the two adds are full-rate. They are NoContraction so that no driver folds (q + M) - M
  // back to q (the f64 algorithms rely on the same decoration); a k off by one at a tie leaves
  // the argument a rounding past +-pi, as RoundEven of a rounded quotient does.
  uint32_t reduce_two_pi(uint32_t x) {
    uint32_t f32 = m_.t_float(32);
    constexpr double kTwoPi = 6.283185307179586476925;
    constexpr float kC1 = 6.28125f;        // 201 / 32
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
    const float c2 = static_cast<float>(kTwoPi - 6.28125);
    uint32_t q = op(spv::OpFMul, f32, {x, m_.c_f32(static_cast<float>(1 / kTwoPi))});
    uint32_t k = exact(op(spv::OpFSub, f32,
                          {exact(op(spv::OpFAdd, f32, {q, m_.c_f32(kRound)})), m_.c_f32(kRound)}));
    uint32_t r = op(spv::OpFSub, f32, {x, op(spv::OpFMul, f32, {k, m_.c_f32(kC1)})});
    return op(spv::OpFSub, f32, {r, op(spv::OpFMul, f32, {k, m_.c_f32(c2)})});
  }

  // Decorates a float result NoContraction: the driver may not fuse it with a neighbouring
  // multiply or add (Vulkan otherwise allows contraction into fma, which changes the rounding
  // that range reductions and compensated sums are built on).
  uint32_t exact(uint32_t id) {
    m_.decorate(id, spv::DecorationNoContraction);
    return id;
  }

  // f64_math.h's backend: the f64 operations Vulkan defines, emitted into the current block.
  struct SpirvF64 {
    using Value = uint32_t;
    ValueEmitter& e;
    uint32_t f64 = e.m_.t_float(64);
    uint32_t constant(double v) { return e.m_.c_f64(v); }
    // NoContraction on every add/sub/mul: the algorithms (Cody-Waite reductions, exact
    // splits) assume each operation rounds on its own, as on the host; NVIDIA fuses them into
    // fma otherwise (tan near its poles was 5e5 ulp off on an H100).
    uint32_t add(uint32_t a, uint32_t b) { return e.exact(e.op(spv::OpFAdd, f64, {a, b})); }
    uint32_t sub(uint32_t a, uint32_t b) { return e.exact(e.op(spv::OpFSub, f64, {a, b})); }
    uint32_t mul(uint32_t a, uint32_t b) { return e.exact(e.op(spv::OpFMul, f64, {a, b})); }
    uint32_t div(uint32_t a, uint32_t b) { return e.op(spv::OpFDiv, f64, {a, b}); }
    uint32_t neg(uint32_t a) { return e.op(spv::OpFNegate, f64, {a}); }
    uint32_t abs(uint32_t a) { return e.ext(GLSLstd450FAbs, f64, {a}); }
    uint32_t min(uint32_t a, uint32_t b) { return select(lt(a, b), a, b); }
    uint32_t sqrt(uint32_t a) { return e.ext(GLSLstd450Sqrt, f64, {a}); }
    uint32_t floor(uint32_t a) { return e.ext(GLSLstd450Floor, f64, {a}); }
    uint32_t round_even(uint32_t a) { return e.ext(GLSLstd450RoundEven, f64, {a}); }
    // `k` holds a small integer (the algorithms clamp first); NaN, whose conversion is
    // undefined, becomes 0 -- the caller passes NaN through separately.
    uint32_t ldexp(uint32_t a, uint32_t k) {
      uint32_t safe = select(is_nan(k), constant(0), k);
      return e.ext(GLSLstd450Ldexp, f64, {a, e.op(spv::OpConvertFToS, e.i32_, {safe})});
    }
    uint32_t frexp(uint32_t a, uint32_t* exponent) {
      uint32_t var = e.m_.function_variable(e.i32_);
      uint32_t m = e.ext(GLSLstd450Frexp, f64, {a, var});
      *exponent = e.op(spv::OpConvertSToF, f64, {e.op(spv::OpLoad, e.i32_, {var})});
      return m;
    }
    uint32_t lt(uint32_t a, uint32_t b) { return e.op(spv::OpFOrdLessThan, e.bool_, {a, b}); }
    uint32_t eq(uint32_t a, uint32_t b) { return e.op(spv::OpFOrdEqual, e.bool_, {a, b}); }
    uint32_t is_nan(uint32_t a) { return e.op(spv::OpIsNan, e.bool_, {a}); }
    uint32_t select(uint32_t c, uint32_t a, uint32_t b) {
      return e.op(spv::OpSelect, f64, {c, a, b});
    }
  };

  // A transcendental. f32: GLSL.std.450, with Sin, Cos and Tan (period 2*pi too) seeing their
  // argument reduced first. f64: computed in f64 by f64_math.h (GLSL.std.450 defines these
  // for 16- and 32-bit floats only).
  uint32_t math(GLSLstd450 inst, DType t, std::initializer_list<uint32_t> xs) {
    std::vector<uint32_t> in(xs);
    if (t == DType::kF64) {
      SpirvF64 backend{*this};
      F64Math<SpirvF64> f(backend);
      switch (inst) {
        case GLSLstd450Exp: return f.exp(in[0]);
        case GLSLstd450Log: return f.log(in[0]);
        case GLSLstd450Sin: return f.sin(in[0]);
        case GLSLstd450Cos: return f.cos(in[0]);
        case GLSLstd450Tan: return f.tan(in[0]);
        case GLSLstd450Tanh: return f.tanh(in[0]);
        case GLSLstd450Asin: return f.asin(in[0]);
        case GLSLstd450Acos: return f.acos(in[0]);
        case GLSLstd450Pow: return f.pow(in[0], in[1]);
        case GLSLstd450Atan2: return f.atan2(in[0], in[1]);
        default: break;
      }
    }
    uint32_t f32 = m_.t_float(32);
    if (inst == GLSLstd450Sin || inst == GLSLstd450Cos || inst == GLSLstd450Tan)
      in[0] = reduce_two_pi(in[0]);
    return in.size() == 1 ? ext(inst, f32, {in[0]}) : ext(inst, f32, {in[0], in[1]});
  }

  // Integer div / mod / floordiv with the semantics of ir.h's table for every input:
  // x / 0 = 0, x mod 0 = x, floordiv(x, 0) = 0, INT_MIN / -1 = INT_MIN, INT_MIN mod -1 = 0.
  // SPIR-V leaves OpSDiv/OpUDiv/OpSRem undefined for a zero divisor and for INT_MIN / -1, so
  // those divisors are replaced by 1 before dividing and the results selected after. The
  // remainder is a - q*d rather than OpSRem/OpUMod: an NVIDIA driver (580.159) computed OpSRem
  // by a negative constant as an unsigned remainder; the quotient alone is the one primitive
  // every driver must get right.
  // i64 follows the same rules with INT64_MIN.
  uint32_t integer_division(Op o, DType t, uint32_t a, uint32_t b) {
    bool is_signed = t != DType::kU32;
    uint32_t ty = type(t);
    uint32_t z = zero(t);
    uint32_t one = this->one(t);
    uint32_t by_zero = op(spv::OpIEqual, bool_, {b, z});
    uint32_t bad = by_zero;
    if (is_signed) {
      uint32_t min = t == DType::kI64 ? m_.c_i64(INT64_MIN) : m_.c_i32(INT32_MIN);
      uint32_t minus_one = t == DType::kI64 ? m_.c_i64(-1) : m_.c_i32(-1);
      uint32_t overflow =
          op(spv::OpLogicalAnd, bool_,
             {op(spv::OpIEqual, bool_, {a, min}), op(spv::OpIEqual, bool_, {b, minus_one})});
      bad = op(spv::OpLogicalOr, bool_, {by_zero, overflow});
    }
    uint32_t d = op(spv::OpSelect, ty, {bad, one, b});
    uint32_t q = op(is_signed ? spv::OpSDiv : spv::OpUDiv, ty, {a, d});
    if (o == Op::kDiv || (o == Op::kFloorDiv && !is_signed))
      return op(spv::OpSelect, ty, {by_zero, z, q});
    uint32_t r = op(spv::OpISub, ty, {a, op(spv::OpIMul, ty, {q, d})});
    if (!is_signed) return op(spv::OpSelect, ty, {by_zero, a, r});
    // Floor semantics: when the truncated remainder's sign differs from the divisor's, the
    // quotient steps down by one and the remainder moves by one divisor.
    uint32_t differ =
        op(spv::OpLogicalNotEqual, bool_,
           {op(spv::OpSLessThan, bool_, {r, z}), op(spv::OpSLessThan, bool_, {d, z})});
    uint32_t adjust = op(spv::OpLogicalAnd, bool_, {op(spv::OpINotEqual, bool_, {r, z}), differ});
    if (o == Op::kFloorDiv) {
      uint32_t fq = op(spv::OpISub, ty, {q, op(spv::OpSelect, ty, {adjust, one, z})});
      return op(spv::OpSelect, ty, {by_zero, z, fq});
    }
    uint32_t fr = op(spv::OpIAdd, ty, {r, op(spv::OpSelect, ty, {adjust, d, z})});
    return op(spv::OpSelect, ty, {by_zero, a, fr});
  }

  // Float -> i32/u32, saturating (ir.h's table): NaN -> 0, below the range -> its minimum,
  // above -> its maximum, otherwise truncation toward zero. OpConvertFToS/U are undefined
  // outside the range, so only in-range values reach them.
  uint32_t float_to_int(DType from, DType to, uint32_t x) {
    bool sg = to != DType::kU32;
    uint32_t ty = type(to), fty = type(from);
    auto fc = [&](double v) {
      return from == DType::kF64 ? m_.c_f64(v) : m_.c_f32(static_cast<float>(v));
    };
    // Both bounds are powers of two, exact in f32 and f64; every value in [lo, hi) truncates
    // to a representable integer.
    bool wide = to == DType::kI64;
    uint32_t lo = fc(wide ? -0x1p63 : sg ? -2147483648.0 : 0.0);
    uint32_t hi = fc(wide ? 0x1p63 : sg ? 2147483648.0 : 4294967296.0);
    uint32_t clamped = op(spv::OpSelect, fty, {op(spv::OpFOrdLessThan, bool_, {x, lo}), lo, x});
    uint32_t in_range = op(spv::OpFOrdLessThan, bool_, {clamped, hi});  // false for NaN
    uint32_t safe = op(spv::OpSelect, fty, {in_range, clamped, fc(0)});
    uint32_t conv = op(sg ? spv::OpConvertFToS : spv::OpConvertFToU, ty, {safe});
    uint32_t top = wide ? m_.c_i64(INT64_MAX) : sg ? m_.c_i32(INT32_MAX) : m_.c_u32(UINT32_MAX);
    uint32_t zero_v = zero(to);
    uint32_t out = op(spv::OpSelect, ty, {op(spv::OpIsNan, bool_, {x}), zero_v, top});
    return op(spv::OpSelect, ty, {in_range, conv, out});
  }

  // FMin/FMax leave the result undefined when an operand is NaN (and may flush or reorder
  // signed zeros); a compare and a select give the documented `a < b ? a : b`.
  uint32_t min_max(bool is_min, DType t, uint32_t a, uint32_t b) {
    uint32_t ty = type(t);
    if (is_float(t)) {
      spv::Op cmp = is_min ? spv::OpFOrdLessThan : spv::OpFOrdGreaterThan;
      return op(spv::OpSelect, ty, {op(cmp, bool_, {a, b}), a, b});
    }
    bool sg = t == DType::kI32 || t == DType::kI64;
    if (is_min) return ext(sg ? GLSLstd450SMin : GLSLstd450UMin, ty, {a, b});
    return ext(sg ? GLSLstd450SMax : GLSLstd450UMax, ty, {a, b});
  }
};

// The ndarrays: their storage buffers, row-major addressing, bounds checks (one out-of-bounds
// flag per invocation, raised after its last element), loads, stores, atomic add / max, and
// the finite checks of the float values stored. emit_array() emits one access statement.
class MemoryEmitter : public ValueEmitter {
 protected:
  // The launch's iterations (end - begin of the push constants) reach kCombineUniformFrom
  // (atomic_add); set by the task's entry before its body is emitted.
  static constexpr uint32_t kCombineUniformFrom = 1024;
  uint32_t wide_ = 0;
  // ... and pass kCombineRunsAbove (flush_runs).
  static constexpr uint32_t kCombineRunsAbove = 132 * 4 * 32;
  uint32_t runs_wide_ = 0;
  // may_run's switch (the task's plain copy turns it off), and whether flush_runs branches on
  // runs_wide_ itself (off where the whole body already sits in that branch).
  bool runs_on_ = true, runs_branch_ = true;
  // SubgroupLocalInvocationId, SubgroupSize, SubgroupLeMask (or 0: not used)
  uint32_t lane_var_ = 0, size_var_ = 0, le_mask_var_ = 0;

  MemoryEmitter(const Kernel& k, size_t task, const abi::CompiledKernel& layout,
                const Target& target, const EmitOptions& o)
      : ValueEmitter(k, task, layout, target, o) {
    if (o_.check_finite) {
      const std::vector<const Stmt*> sites = finite_check_sites(k, task);
      for (uint32_t i = 0; i < sites.size(); ++i) finite_site_[sites[i]] = i;
    }
    if (o_.bounds_checks) {
      const std::vector<const Stmt*> sites = access_sites(k, task);
      for (uint32_t i = 0; i < sites.size(); ++i) access_site_[sites[i]] = i;
    }
  }

  // Before any ndarray is declared: the float ones whose atomic adds are compare-and-swap loops
  // (their elements are then stored as bits), and the ones the task stores to or adds to (the
  // others are read-only: CompileOptions::read_only_buffers).
  void scan_arrays(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.op == Op::kStore || s.op == Op::kAtomicAdd || s.op == Op::kAtomicMax) {
        written_params_.insert(s.param);
      }
      if (s.op == Op::kAtomicAdd && is_float(k_.params[s.param].dtype) &&
          !native_atomic(k_.params[s.param].dtype)) {
        bits_params_.insert_or_assign(s.param, true);
      }
      for (const Block& c : s.blocks) scan_arrays(c);
    }
  }
  // The bounds checks' flag, 0 until an access is out of bounds: declared before the first
  // access (no flag without bounds checks).
  void declare_bounds_flag() {
    if (!o_.bounds_checks) return;
    oob_var_ = m_.function_variable(u32_);
    m_.op(spv::OpStore, {oob_var_, m_.c_u32(0)});
  }
  // After the invocation's last element: raises kErrorOutOfBounds with the flag's site.
  void raise_bounds_flag() {
    if (!oob_var_) return;  // the bounds checks' one flag, raised once per invocation
    const uint32_t site1 = op(spv::OpLoad, u32_, {oob_var_});
    const uint32_t any = op(spv::OpINotEqual, bool_, {site1, m_.c_u32(0)});
    if_else(
        any,
        [&] {
          // out_of_bounds_word(site): the code, the site + 1 above it.
          raise(op(spv::OpBitwiseOr, u32_,
                   {m_.c_u32(kErrorOutOfBounds),
                    op(spv::OpShiftLeftLogical, u32_, {site1, m_.c_u32(8)})}));
        },
        [] {});
  }

  void emit_array(const Stmt& s) {
    switch (array_op(s.op)) {
      case ArrayOp::kLoad: set(s, load(s)); return;
      case ArrayOp::kStore: store(s); return;
      case ArrayOp::kAtomicAdd: atomic_add(s); return;
      case ArrayOp::kAtomicMax: atomic_max(s); return;
    }
  }

 private:
  std::unordered_set<uint32_t> written_params_;  // stored or added to anywhere in the task
  struct ArrayVar {
    uint32_t var = 0;
    uint32_t elem = 0;  // storage element type
    bool bits = false;  // float stored as its bit pattern (compare-and-swap atomics)
  };

  bool native_atomic(DType t) const {
    return o_.native_float_atomics && ((t == DType::kF32 && target_.atomic_float32_add) ||
                                       (t == DType::kF64 && target_.atomic_float64_add));
  }

  const ArrayVar& array(uint32_t p) {
    auto it = arrays_.find(p);
    if (it != arrays_.end()) return it->second;
    const Param& prm = k_.params[p];
    ArrayVar a;
    a.bits = bits_params_.count(p) > 0;
    uint32_t stride = abi::dtype_bytes(prm.dtype);
    switch (prm.dtype) {
      case DType::kF32: a.elem = a.bits ? u32_ : m_.t_float(32); break;
      case DType::kF64:
        a.elem = a.bits ? m_.t_int(64, false) : m_.t_float(64);
        if (a.bits) m_.capability(spv::CapabilityInt64Atomics);
        break;
      case DType::kI32: a.elem = i32_; break;
      case DType::kI64: a.elem = m_.t_int(64, true); break;
      case DType::kU32:
      case DType::kBool: a.elem = u32_; break;  // bool: one u32 (0/1) per element
    }
    uint32_t binding = 1;
    for (uint32_t q = 0; q < p; ++q) binding += k_.params[q].kind == ParamKind::kNdArray;
    uint32_t blk = m_.t_buffer_block(a.elem, stride);
    a.var = m_.global_variable(m_.t_pointer(spv::StorageClassStorageBuffer, blk),
                               spv::StorageClassStorageBuffer, static_cast<int>(binding));
    m_.name(a.var, prm.name);
    if (o_.read_only_buffers && !written_params_.count(p)) {
      m_.decorate(a.var, spv::DecorationNonWritable);
    }
    return arrays_.emplace(p, a).first->second;
  }

  // Computes the row-major element index of `s`'s first `n` args, then runs `access(ptr)` only
  // when every index is in bounds; otherwise flags kErrorOutOfBounds. Returns the value
  // `access` produced, or `fallback` on the out-of-bounds path (0 if result_type is 0).
  //
  // A load (a result type) is not put behind a branch: it reads element 0 instead when an index
  // is out of bounds (every ndarray has one: empty shapes are refused) and its value is then
  // replaced by `fallback`. Stores and atomics stay behind theirs: they must not write element
  // 0. No access raises the error itself: each ORs its verdict into one flag (a register) that
  // the invocation raises once, after its last element (a branch and an atomic per access cost
  // DiffTaichi's mass_spring on an H100 40% of its time: 34.9 ms a replay against 20.6 with no
  // checks at all; per-access flag writes 26.7).
  template <typename Access>
  uint32_t guarded(const Stmt& s, size_t n, uint32_t result_type, uint32_t fallback,
                   Access access) {
    const ArrayVar& a = array(s.param);
    uint32_t lin = 0, ok = 0;
    for (size_t d = 0; d < n; ++d) {
      uint32_t idx = v(s.args[d]);
      if (vt(s.args[d]) == DType::kI32) idx = op(spv::OpBitcast, u32_, {idx});
      uint32_t extent = shapes_.at(s.param)[d];
      uint32_t in = op(spv::OpULessThan, bool_, {idx, extent});
      ok = ok ? op(spv::OpLogicalAnd, bool_, {ok, in}) : in;
      lin = lin ? op(spv::OpIAdd, u32_, {op(spv::OpIMul, u32_, {lin, extent}), idx}) : idx;
    }
    uint32_t ptr_t = m_.t_pointer(spv::StorageClassStorageBuffer, a.elem);
    auto ptr = [&] { return op(spv::OpAccessChain, ptr_t, {a.var, m_.c_u32(0), lin}); };
    if (!o_.bounds_checks) return access(ptr());
    // The flag holds the site + 1 of the invocation's last out-of-bounds access (0: none).
    const uint32_t flag = op(spv::OpLoad, u32_, {oob_var_});
    // (Every access the emitter guards is a statement of the body; an unknown one would be
    // reported without its statement.)
    auto it = access_site_.find(&s);
    const uint32_t site = m_.c_u32(it != access_site_.end() ? it->second + 1 : kUnknownSite);
    m_.op(spv::OpStore, {oob_var_, op(spv::OpSelect, u32_, {ok, flag, site})});
    if (result_type) {
      lin = op(spv::OpSelect, u32_, {ok, lin, m_.c_u32(0)});
      return op(spv::OpSelect, result_type, {ok, access(ptr()), fallback});
    }
    if_else(
        ok, [&] { access(ptr()); }, [] {});
    return 0;
  }

  uint32_t load(const Stmt& s) {
    DType t = k_.params[s.param].dtype;
    uint32_t ty = type(t);
    return guarded(s, s.args.size(), ty, zero(t), [&](uint32_t ptr) {
      const ArrayVar& a = arrays_.at(s.param);
      uint32_t raw = op(spv::OpLoad, a.elem, {ptr});
      if (t == DType::kBool) return op(spv::OpINotEqual, bool_, {raw, m_.c_u32(0)});
      if (a.bits) return op(spv::OpBitcast, ty, {raw});
      return raw;
    });
  }
  // check_finite: a NaN or infinity about to be stored at site `s` raises kErrorNonFinite (the
  // first error of the launch wins, like every error word); the value is stored all the same.
  void check_finite(const Stmt& s, uint32_t val) {
    auto it = finite_site_.find(&s);
    if (it == finite_site_.end()) return;
    const uint32_t bad = op(spv::OpLogicalOr, bool_,
                            {op(spv::OpIsNan, bool_, {val}), op(spv::OpIsInf, bool_, {val})});
    if_else(
        bad, [&] { raise(m_.c_u32(abi::non_finite_word(it->second))); }, [] {});
  }

  void store(const Stmt& s) {
    DType t = k_.params[s.param].dtype;
    uint32_t val = v(s.args.back());
    check_finite(s, val);
    guarded(s, s.args.size() - 1, 0, 0, [&](uint32_t ptr) -> uint32_t {
      const ArrayVar& a = arrays_.at(s.param);
      uint32_t w = val;
      if (t == DType::kBool)
        w = op(spv::OpSelect, u32_, {val, m_.c_u32(1), m_.c_u32(0)});
      else if (a.bits)
        w = op(spv::OpBitcast, a.elem, {val});
      m_.op(spv::OpStore, {ptr, w});
      return 0;
    });
  }

  // element = max(element, value). With subgroup arithmetic (Target::subgroup_arithmetic), the
  // invocations of a subgroup that all hit one element combine first: the subgroup's maximum,
  // one atomic from one of them (a counting kernel's threads otherwise all contend for a few
  // words: issue 27). Invocations whose subgroup is split over several elements issue their
  // own. The test, the reduction and the election are in one block, so they see the same
  // active invocations, whatever the subgroup size and however the code diverged before.
  //
  // The atomic itself is issued only when the element, read atomically first, is below the
  // value: the element only grows, so a value not above what was read cannot change it. A
  // counting kernel's invocations mostly carry the same trip count, so after the first few
  // atomics per word the rest are loads, which do not serialise on the word the way atomics do
  // (on an H100 the atomics of 4M invocations on 64 words cost as much as the forward itself).
  void atomic_max(const Stmt& s) {
    const bool sg = k_.params[s.param].dtype == DType::kI32;
    auto atomic = [&](uint32_t val) {
      guarded(s, s.args.size() - 1, 0, 0, [&](uint32_t ptr) -> uint32_t {
        const uint32_t elem = arrays_.at(s.param).elem;
        const uint32_t scope = m_.c_u32(kScopeDevice), sem = m_.c_u32(kRelaxed);
        const uint32_t seen = op(spv::OpAtomicLoad, elem, {ptr, scope, sem});
        const uint32_t above =
            op(sg ? spv::OpSGreaterThan : spv::OpUGreaterThan, bool_, {val, seen});
        if_else(
            above,
            [&] {
              op(sg ? spv::OpAtomicSMax : spv::OpAtomicUMax, elem, {ptr, scope, sem, val});
            },
            [] {});
        return 0;
      });
    };
    const uint32_t val = v(s.args.back());
    if (!target_.subgroup_arithmetic) return atomic(val);
    m_.capability(spv::CapabilityGroupNonUniform);
    m_.capability(spv::CapabilityGroupNonUniformVote);
    m_.capability(spv::CapabilityGroupNonUniformArithmetic);
    const uint32_t scope = m_.c_u32(spv::ScopeSubgroup);
    uint32_t same = 0;  // every active invocation has these indices
    for (size_t d = 0; d + 1 < s.args.size(); ++d) {
      uint32_t eq = op(spv::OpGroupNonUniformAllEqual, bool_, {scope, v(s.args[d])});
      same = d == 0 ? eq : op(spv::OpLogicalAnd, bool_, {same, eq});
    }
    if (!same) same = m_.c_bool(true);  // a rank-0 array: one element
    const uint32_t ty = type(vt(s.args.back()));
    uint32_t most = op(sg ? spv::OpGroupNonUniformSMax : spv::OpGroupNonUniformUMax, ty,
                       {scope, spv::GroupOperationReduce, val});
    uint32_t elected = op(spv::OpGroupNonUniformElect, bool_, {scope});
    uint32_t issue = op(spv::OpLogicalOr, bool_, {op(spv::OpLogicalNot, bool_, {same}), elected});
    uint32_t mine = op(spv::OpSelect, ty, {same, most, val});
    auto issue_mine = [&] { atomic(mine); };
    if_else(issue, issue_mine, [] {});
  }

  // element += value. Atomics on one element serialise where the memory does them (an H100's
  // L2): what they cost is how many hit one element. Where every index is a table index or
  // launch-uniform, at least one a table index (table_index_values: an actuator id, a
  // material), many invocations likely hit few elements, and two things cut their number:
  //
  // - The invocations of a subgroup that all hit one element combine first: the subgroup's sum,
  //   one atomic from one of them (as atomic_max does).
  // - A float value of +0.0 or -0.0 is not added (tested on its bits, after the bounds check:
  //   a bad index is still reported, and a NaN is added whatever the driver assumes of NaNs in
  //   comparisons; an element holding -0.0 then keeps its sign, which adding +0.0 would have
  //   flipped). Reverse mode adds a read's adjoint
  //   wherever the read ran, and it is often zero: diffmpm's particles without an actuator add
  //   0 into one actuation gradient word per step (1,824 of its 2,976 particles).
  //
  // On an H100 the two took diffmpm's replayed iteration from 22.3-23.0 to 18.2-18.6 ms (the
  // vote alone 18.7). Elsewhere each invocation issues its own atomic, as measured too:
  // combining every float atomic_add made diffmpm 26.7 ms (an MPM grid scatter's subgroups
  // rarely agree on a cell); skipping zeros in every one made mass_spring 5.9 -> 6.9 ms (its
  // adds sit in a resident step loop, where the branch costs more than the atomic); combining
  // where every index is launch-uniform made mass_spring's launches of 32 invocations 25%
  // slower (an earlier measurement); reducing before the vote said whether to cost mass_spring
  // 16% (springs whose anchors come from a table but rarely agree).
  //
  // - Where every index is launch-uniform (a loss summed over a grid, a shared parameter's
  //   gradient), every invocation hits one element: in a launch of at least
  //   kCombineUniformFrom iterations the subgroup adds first and one invocation issues the
  //   atomic. DiffTaichi's wave summed its 65,536-cell loss in 119 us of its 1.33 ms iteration
  //   on an H200, an atomic per cell queued on one word. Smaller launches (mass_spring's of 32
  //   invocations, a resident kernel's phases) keep one atomic per invocation: there the
  //   reduction's latency costs more than the few atomics it saves.
  //
  // - A masked value (masked_values: a select's zero arm, a 0/1 flag, a local only branches
  //   change, and reverse mode's accumulators of them) is not added where it is a float zero,
  //   as above, in every kernel. DiffTaichi's volume_renderer adds `density * flag` at every
  //   marching step and its adjoint `flag * d image` into the density's gradient: ~95% of the
  //   steps lie outside the volume, their indices clamped onto its faces, so nearly every
  //   atomic was a zero queued on a few boundary voxels -- 129 ms a view on an H200.
  //   DiffTaichi's billiards' rolled adjoint adds each pair's contact adjoint, zero where the
  //   balls did not touch (nearly always): 8.9 -> 8.0 ms an iteration on an H200 once resident
  //   kernels skip too; mass_spring, rigid_body, electric and mass_spring_velocity unchanged.
  void atomic_add(const Stmt& s) {
    const DType t = k_.params[s.param].dtype;
    const uint32_t val = v(s.args.back());
    check_finite(s, val);
    const bool skip = is_float(t) && skips_zero(s.args.back());
    if (!target_.subgroup_arithmetic || !is_float(t)) return add_atomically(s, val, skip);
    if (uniform_indexed(s)) return combine_where(wide_, s, val, false);
    if (!table_indexed(s)) {
      if (may_run(s)) {
        // a group is consecutive adds at one key: another key emits the pending ones first,
        // which keeps their values' lives (registers) as short as in program order
        if (!pending_runs_.empty() && run_key(*pending_runs_.back().s) != run_key(s)) {
          flush_runs();
        }
        return pending_runs_.push_back({&s, val, skip});
      }
      return add_atomically(s, val, skip);
    }
    m_.capability(spv::CapabilityGroupNonUniformVote);
    const uint32_t scope = m_.c_u32(spv::ScopeSubgroup);
    // Whether every active invocation has these indices (the launch-uniform ones agree): the
    // same in all of them, so the branch on it is uniform and the reduction inside sees
    // exactly the invocations that voted. A subgroup that disagrees pays the vote only.
    uint32_t same = 0;  // table_indexed: at least one table index to vote on
    for (size_t d = 0; d + 1 < s.args.size(); ++d) {
      if (!table_values_->count(s.args[d])) continue;
      uint32_t eq = op(spv::OpGroupNonUniformAllEqual, bool_, {scope, v(s.args[d])});
      same = same == 0 ? eq : op(spv::OpLogicalAnd, bool_, {same, eq});
    }
    combine_where(same, s, val, true);
  }

  // atomic_add of `val` where `combine` (a uniform condition: the active invocations all take
  // the same branch) as the subgroup's sum from one elected invocation, else one atomic each.
  void combine_where(uint32_t combine, const Stmt& s, uint32_t val, bool skip_zero) {
    m_.capability(spv::CapabilityGroupNonUniform);
    m_.capability(spv::CapabilityGroupNonUniformArithmetic);
    const uint32_t scope = m_.c_u32(spv::ScopeSubgroup);
    const DType t = k_.params[s.param].dtype;
    if_else(
        combine,
        [&] {
          const uint32_t sum =
              op(spv::OpGroupNonUniformFAdd, type(t), {scope, spv::GroupOperationReduce, val});
          const uint32_t elected = op(spv::OpGroupNonUniformElect, bool_, {scope});
          if_else(
              elected, [&] { add_atomically(s, sum, skip_zero); }, [] {});
        },
        [&] { add_atomically(s, val, skip_zero); });
  }

  // atomic_add of `val` at a computed index, on a device with ballot and relative shuffles:
  // consecutive active invocations of a subgroup that hit one element add their sum from one of
  // them, in chunks of up to kRunChunk. Particles a program made one after another sit near
  // each other, so an MPM scatter's neighbouring invocations often share a cell at every
  // stencil offset (DiffTaichi's diffmpm3d: runs of 3 along a row of its lattice, 27 nodes x 4
  // words each; on an H200 its iteration went from 86-88 to 51-60 ms, liquid's 115-121 ->
  // 98-107). Only in launches of more than
  // kCombineRunsAbove iterations (a uniform branch; the plain adds otherwise): an H200's 132
  // compute units have 4 schedulers each, so a launch of at most 132 x 4 subgroups of 32 gives
  // each at most one and the chain below adds its latency whole -- diffmpm's 2,976 particles
  // went 17.7 -> 20.6 ms with it (its adds meet few others on a cell: 9 nodes x 4 particles a
  // cell), smoke's 128^2 cells 5.5 -> 5.9 (bilinear adjoints, whose neighbours rarely share a
  // cell). A device with more compute units would want a larger bound; one with fewer a
  // smaller (Vulkan does not say how many a device has).
  //
  // Consecutive such adds at the same non-uniform indices wait in pending_runs_ while only
  // values, locals and other atomic adds come between them (their values are SSA, and atomic
  // adds commute: an add at a table or uniform index may be issued before them, so where an
  // invocation has two out-of-bounds accesses the bounds report may name the other one), and
  // flush_runs emits them as one group at the first other statement, another key or the
  // block's end: a grid node's vector components and mass, whose run is found once, whose sums
  // build up side by side, and whose adds sit behind one branch.
  //
  // Lanes are the subgroup's: an invocation joins the run of the one before it where that one
  // is active (a ballot) and has the same indices (a shuffle up; launch-uniform indices agree
  // everywhere and are not compared). head = the last lane at or before this one that does not
  // join (the highest bit of the ballot of those, below or at this lane); a run is cut into
  // chunks of kRunChunk lanes from its head, and each chunk's sum builds up over doubling
  // distances, a lane adding the partial sum d lanes up while that lane is in its chunk (after
  // the step of distance d a lane holds the sum of the up to 2d lanes of its chunk ending at
  // it). The last lane of a chunk -- the chunk full, or the next lane inactive, past the
  // subgroup or not joining -- adds the sums. Every value used is read from a lane of the same
  // chunk, so inactive lanes' undefined shuffles are never used. Straight-line code but for the
  // adds' branch: the chain is a shuffle, three ballots and log2(kRunChunk) shuffles, short
  // enough for a launch of few subgroups per compute unit, whose latency nothing hides.
  static constexpr uint32_t kRunChunk = 4;
  struct PendingAdd {
    const Stmt* s;
    uint32_t val;
    bool skip_zero;
  };
  std::vector<PendingAdd> pending_runs_;

  // Whether combine-by-runs applies to the float atomic_add `s` (neither uniform- nor
  // table-indexed): the device allows it, the task is not serial and has no shared memory
  // (uses_shared), its range may pass kCombineRunsAbove (a constant range that does not never
  // will: the adds stay where they are), an index is not launch-uniform, and none is the
  // task's index (or an N-d task's fastest one), which consecutive invocations never share.
  bool may_run(const Stmt& s) {
    if (!runs_on_ || !target_.subgroup_arithmetic || !target_.subgroup_shuffle || !runs_wide_ ||
        s.op != Op::kAtomicAdd || !is_float(k_.params[s.param].dtype)) {
      return false;
    }
    if (task_.serial || uses_shared()) return false;
    // never wide enough: a resident kernel's one workgroup, a small constant N-d range
    if (std::optional<int64_t> n = constant_range(); n && *n <= kCombineRunsAbove) return false;
    index_values();
    if (uniform_indexed(s) || table_indexed(s)) return false;
    const ValueId fastest = task_.dims.empty() ? task_.index : task_.dims.back().index;
    for (size_t d = 0; d + 1 < s.args.size(); ++d) {
      if (s.args[d] == fastest) return false;
    }
    return true;
  }

  // The task's iteration count where its bounds are constants (nullopt otherwise).
  std::optional<int64_t> constant_range() const {
    if (task_.dims.empty()) {
      if (task_.begin.kind != abi::RangeBound::Kind::kConstant ||
          task_.end.kind != abi::RangeBound::Kind::kConstant) {
        return std::nullopt;
      }
      return task_.end.value - task_.begin.value;
    }
    int64_t n = 1;
    for (const TaskDim& d : task_.dims) {
      if (d.begin.kind != SizeExpr::Kind::kConst || d.end.kind != SizeExpr::Kind::kConst) {
        return std::nullopt;
      }
      const int64_t extent = std::max<int64_t>(d.end.value - d.begin.value, 0);
      if (extent > 0 && n > (int64_t{1} << 40) / extent) return std::nullopt;  // wide anyway
      n *= extent;
    }
    return n;
  }

  // Whether the task declares shared memory: a blocked stencil's tile or a resident kernel's
  // phases, which add where their own tile or phase says (runs are not what they meet), and
  // whose body could not run as two copies (run). On an H200 smoke's blocked Jacobi adjoint
  // took 11.0 -> 11.5 us with the runs' branches in it.
  bool uses_shared() {
    if (!uses_shared_) uses_shared_ = contains_op(task_.body, Op::kSharedAlloc);
    return *uses_shared_;
  }
  std::optional<bool> uses_shared_;

  // Non-uniform indices of `s` (what a run compares).
  std::vector<ValueId> run_key(const Stmt& s) {
    std::vector<ValueId> key;
    for (size_t d = 0; d + 1 < s.args.size(); ++d) {
      if (!uniform_values_->count(s.args[d])) key.push_back(s.args[d]);
    }
    return key;
  }

 protected:
  // Whether an add in `b` (or a block inside it) may combine in runs.
  bool any_may_run(const Block& b) {
    bool any = false;
    for_each_stmt(b, [&](const Stmt& st) { any = any || may_run(st); });
    return any;
  }
  // Emits the pending run adds (may_run): called before a statement they may not pass and at
  // every block's end.
  void flush_runs() {
    if (pending_runs_.empty()) return;
    std::vector<PendingAdd> group;
    group.swap(pending_runs_);  // one key: atomic_add flushes before another
    const std::vector<ValueId> key = run_key(*group.front().s);
    if (!runs_branch_) return combine_runs(key, group);
    if_else(
        runs_wide_, [&] { combine_runs(key, group); },
        [&] {
          for (const PendingAdd& p : group) add_atomically(*p.s, p.val, p.skip_zero);
        });
  }

 private:
  void combine_runs(const std::vector<ValueId>& key, std::vector<PendingAdd> group) {
    m_.capability(spv::CapabilityGroupNonUniform);
    m_.capability(spv::CapabilityGroupNonUniformBallot);
    m_.capability(spv::CapabilityGroupNonUniformShuffleRelative);
    const uint32_t scope = m_.c_u32(spv::ScopeSubgroup);
    const uint32_t zero = m_.c_u32(0), one = m_.c_u32(1);
    uint32_t same = 0;
    for (ValueId index : key) {
      const uint32_t x = v(index);
      const uint32_t up = op(spv::OpGroupNonUniformShuffleUp, type(vt(index)), {scope, x, one});
      const uint32_t eq = op(spv::OpIEqual, bool_, {up, x});
      same = same == 0 ? eq : op(spv::OpLogicalAnd, bool_, {same, eq});
    }
    const uint32_t v4 = m_.t_vector(u32_, 4);
    const uint32_t lane = builtin_u32(&lane_var_, spv::BuiltInSubgroupLocalInvocationId);
    const uint32_t size = builtin_u32(&size_var_, spv::BuiltInSubgroupSize);
    const uint32_t active = op(spv::OpGroupNonUniformBallot, v4, {scope, m_.c_bool(true)});
    const uint32_t has_prev = op(spv::OpUGreaterThan, bool_, {lane, zero});
    const uint32_t prev =
        op(spv::OpSelect, u32_, {has_prev, op(spv::OpISub, u32_, {lane, one}), zero});
    const uint32_t prev_on =
        op(spv::OpGroupNonUniformBallotBitExtract, bool_, {scope, active, prev});
    // a select, not an and: `same` is undefined where the lane before is inactive or absent,
    // and a driver may treat that as poison, which an and would pass on
    const uint32_t joins =
        op(spv::OpSelect, bool_,
           {op(spv::OpLogicalAnd, bool_, {has_prev, prev_on}), same, m_.c_bool(false)});
    const uint32_t starts =
        op(spv::OpGroupNonUniformBallot, v4, {scope, op(spv::OpLogicalNot, bool_, {joins})});
    if (le_mask_var_ == 0) {
      le_mask_var_ =
          m_.global_variable(m_.t_pointer(spv::StorageClassInput, v4), spv::StorageClassInput);
      m_.decorate(le_mask_var_, spv::DecorationBuiltIn, {spv::BuiltInSubgroupLeMask});
    }
    const uint32_t le = op(spv::OpLoad, v4, {le_mask_var_});
    const uint32_t head = op(spv::OpGroupNonUniformBallotFindMSB, u32_,
                             {scope, op(spv::OpBitwiseAnd, v4, {starts, le})});
    // the chunk's first lane: head + (lane - head) rounded down to kRunChunk
    const uint32_t first =
        op(spv::OpIAdd, u32_,
           {head, op(spv::OpBitwiseAnd, u32_,
                     {op(spv::OpISub, u32_, {lane, head}), m_.c_u32(~(kRunChunk - 1))})});
    for (uint32_t d = 1; d < kRunChunk; d *= 2) {
      const uint32_t take =
          op(spv::OpUGreaterThanEqual, bool_, {lane, op(spv::OpIAdd, u32_, {first, m_.c_u32(d)})});
      for (PendingAdd& p : group) {
        const uint32_t ft = type(k_.params[p.s->param].dtype);
        const uint32_t up = op(spv::OpGroupNonUniformShuffleUp, ft, {scope, p.val, m_.c_u32(d)});
        p.val = op(spv::OpSelect, ft, {take, op(spv::OpFAdd, ft, {p.val, up}), p.val});
      }
    }
    const uint32_t next = op(spv::OpIAdd, u32_, {lane, one});
    const uint32_t next_in = op(spv::OpULessThan, bool_, {next, size});
    const uint32_t joined = op(spv::OpGroupNonUniformBallot, v4, {scope, joins});  // active ones
    const uint32_t next_joins =
        op(spv::OpLogicalAnd, bool_,
           {next_in, op(spv::OpGroupNonUniformBallotBitExtract, bool_,
                        {scope, joined, op(spv::OpSelect, u32_, {next_in, next, lane})})});
    const uint32_t chunk_full =
        op(spv::OpIEqual, bool_, {op(spv::OpISub, u32_, {lane, first}), m_.c_u32(kRunChunk - 1)});
    const uint32_t last =
        op(spv::OpLogicalOr, bool_, {chunk_full, op(spv::OpLogicalNot, bool_, {next_joins})});
    if_else(
        last,
        [&] {
          for (const PendingAdd& p : group) add_atomically(*p.s, p.val, p.skip_zero);
        },
        [] {});
  }

  // A u32 builtin input (declared at first use into *var, listed in the entry point's
  // interface by the task's entry), loaded here.
  uint32_t builtin_u32(uint32_t* var, spv::BuiltIn b) {
    if (*var == 0) {
      *var = m_.global_variable(m_.t_pointer(spv::StorageClassInput, u32_), spv::StorageClassInput);
      m_.decorate(*var, spv::DecorationBuiltIn, {static_cast<uint32_t>(b)});
    }
    return op(spv::OpLoad, u32_, {*var});
  }
  // Whether an atomic add of `value` skips a float zero (atomic_add): `value` is masked. The
  // set is made at the kernel's first atomic_add.
  bool skips_zero(ValueId value) {
    if (!masked_values_) masked_values_ = masked_values(k_);
    return masked_values_->count(value) > 0;
  }

  // table_values_ and uniform_values_, made at the kernel's first atomic_add.
  void index_values() {
    if (table_values_) return;
    table_values_ = table_index_values(k_);
    uniform_values_ = launch_uniform_values(k_);
  }

  // Every index of `s` launch-uniform (a 0-d array's element included).
  bool uniform_indexed(const Stmt& s) {
    index_values();
    for (size_t d = 0; d + 1 < s.args.size(); ++d) {
      if (!uniform_values_->count(s.args[d])) return false;
    }
    return true;
  }

  // Every index of `s` a table index or launch-uniform, at least one a table index.
  bool table_indexed(const Stmt& s) {
    index_values();
    bool table = false;
    for (size_t d = 0; d + 1 < s.args.size(); ++d) {
      if (table_values_->count(s.args[d])) {
        table = true;
      } else if (!uniform_values_->count(s.args[d])) {
        return false;
      }
    }
    return table;
  }

  // Whether float `val` of type `t` is neither +0.0 nor -0.0: its bits less the sign bit are
  // not all zero (an integer test: no float comparison a driver may fold under no-NaN rules).
  uint32_t nonzero_bits(uint32_t val, DType t) {
    const uint32_t one = m_.c_u32(1), zero32 = m_.c_u32(0);
    if (t == DType::kF32) {
      const uint32_t bits = op(spv::OpBitcast, u32_, {val});
      return op(spv::OpINotEqual, bool_, {op(spv::OpShiftLeftLogical, u32_, {bits, one}), zero32});
    }
    const uint32_t words = op(spv::OpBitcast, m_.t_vector(u32_, 2), {val});
    const uint32_t lo = op(spv::OpCompositeExtract, u32_, {words, 0});
    const uint32_t hi = op(spv::OpCompositeExtract, u32_, {words, 1});
    const uint32_t rest =
        op(spv::OpBitwiseOr, u32_, {lo, op(spv::OpShiftLeftLogical, u32_, {hi, one})});
    return op(spv::OpINotEqual, bool_, {rest, zero32});
  }

  // One invocation's atomic add of `val` (with skip_zero, not of a float zero: atomic_add).
  void add_atomically(const Stmt& s, uint32_t val, bool skip_zero) {
    const DType t = k_.params[s.param].dtype;
    guarded(s, s.args.size() - 1, 0, 0, [&](uint32_t ptr) -> uint32_t {
      const ArrayVar& a = arrays_.at(s.param);
      uint32_t scope = m_.c_u32(kScopeDevice), sem = m_.c_u32(kRelaxed);
      if (t == DType::kI64) m_.capability(spv::CapabilityInt64Atomics);
      if (!is_float(t)) return op(spv::OpAtomicIAdd, a.elem, {ptr, scope, sem, val});
      auto unless_zero = [&](const std::function<void()>& add) {
        if (!skip_zero) return add();
        if_else(nonzero_bits(val, t), add, [] {});
      };
      if (!a.bits) {
        m_.extension("SPV_EXT_shader_atomic_float_add");
        m_.capability(t == DType::kF32 ? spv::CapabilityAtomicFloat32AddEXT
                                       : spv::CapabilityAtomicFloat64AddEXT);
        unless_zero([&] { op(spv::OpAtomicFAddEXT, a.elem, {ptr, scope, sem, val}); });
        return 0;
      }
      // Compare-and-swap on the bits until no other invocation got in between.
      unless_zero([&] { add_by_compare_and_swap(a, ptr, t, val); });
      return 0;
    });
  }

  void add_by_compare_and_swap(const ArrayVar& a, uint32_t ptr, DType t, uint32_t val) {
    uint32_t scope = m_.c_u32(kScopeDevice), sem = m_.c_u32(kRelaxed);
    uint32_t ft = type(t);
    uint32_t init = op(spv::OpAtomicLoad, a.elem, {ptr, scope, sem});
    uint32_t header = m_.id(), body = m_.id(), cont = m_.id(), merge = m_.id();
    uint32_t got = m_.id();
    uint32_t pre = cur_;
    branch(header);
    block(header);
    uint32_t expected = op(spv::OpPhi, a.elem, {init, pre, got, cont});
    m_.op(spv::OpLoopMerge, {merge, cont, spv::LoopControlMaskNone});
    branch(body);
    block(body);
    uint32_t sum = op(spv::OpFAdd, ft, {op(spv::OpBitcast, ft, {expected}), val});
    uint32_t desired = op(spv::OpBitcast, a.elem, {sum});
    m_.op(spv::OpAtomicCompareExchange, {a.elem, got, ptr, scope, sem, sem, desired, expected});
    uint32_t done = op(spv::OpIEqual, bool_, {got, expected});
    m_.op(spv::OpBranchConditional, {done, merge, cont});
    block(cont);
    branch(header);
    block(merge);
  }

  std::unordered_map<const Stmt*, uint32_t> finite_site_;  // check_finite's sites
  std::unordered_map<const Stmt*, uint32_t> access_site_;  // the bounds checks' sites
  uint32_t oob_var_ = 0;  // the bounds checks' flag (a Function variable), 0 without checks
  // table_index_values and launch_uniform_values of the kernel, made at its first atomic_add.
  std::optional<std::unordered_set<ValueId>> table_values_, uniform_values_;
  // masked_values of the kernel (skips_zero).
  std::optional<std::unordered_set<ValueId>> masked_values_;

  std::unordered_map<uint32_t, ArrayVar> arrays_;
  std::unordered_map<uint32_t, bool> bits_params_;
};

// The adstacks of a task: one storage heap per element kind (the target's adstack layout) and
// the private tier's Function arrays, every stack's bases computed once per invocation
// (load_adstack_layout), and the stack statements (emit_stack) in the launch's tier.
class AdstackEmitter : public MemoryEmitter {
 protected:
  using MemoryEmitter::MemoryEmitter;

  // Per stack, the heap index of slot 0's primal and adjoint for this thread, computed once in
  // the entry block; slot k is then `base + k * slot_step_` (adstack::element_index):
  //   thread-major  base = gid * row_elems[heap] + offset (+ cap),  step 1;
  //   slot-major    base = (offset (+ cap)) * T + gid,             step T (dispatched threads).
  void load_adstack_layout() {
    uint32_t n = 0;
    count_stacks(task_.body, &n);
    if (!n) return;
    const std::vector<adstack::StackDesc>& descs = layout_.tasks[task_index_].adstacks;
    uint32_t base = layout_.adstack_args_offset(task_index_);
    std::array<uint32_t, adstack::kHeapCount> row_base{};
    if (slot_major()) {
      slot_step_ = args_word(base + 4 * adstack::threads_word());
    } else {
      for (uint32_t h = 0; h < adstack::kHeapCount; ++h) {
        bool used = false;
        for (const adstack::StackDesc& d : descs) used = used || static_cast<uint32_t>(d.heap) == h;
        if (!used) continue;
        uint32_t len =
            args_word(base + 4 * adstack::row_length_word(static_cast<adstack::Heap>(h)));
        row_base[h] = op(spv::OpIMul, u32_, {gid_, len});  // this thread's row
      }
    }
    // The private tier (adstack_layout.h, "Storage tiers"): one Function array per heap used,
    // its length a specialization constant; the tier itself is a spec constant every stack
    // access branches on, which the driver folds when it creates the pipeline.
    private_tier_ = m_.spec_bool(adstack::kPrivateTierSpecId, false);
    m_.name(private_tier_, "adstack_private_tier");
    for (const adstack::StackDesc& d : descs) {
      size_t h = static_cast<size_t>(d.heap);
      if (private_vars_[h]) continue;
      uint32_t len = m_.spec_u32(adstack::private_length_spec_id(d.heap), 1);
      uint32_t elem = d.heap == adstack::Heap::kInt
                          ? u32_
                          : m_.t_float(d.heap == adstack::Heap::kF64 ? 64 : 32);
      private_vars_[h] = m_.function_variable(m_.t_array(elem, len));
      m_.name(private_vars_[h], std::string("adstack_private_") + adstack::heap_name(d.heap));
    }
    for (uint32_t s = 0; s < n; ++s) {
      uint32_t offset = args_word(base + 4 * adstack::offset_word(s));
      uint32_t cap = args_word(base + 4 * adstack::capacity_word(s));
      stack_cap_.push_back(cap);
      private_base_.push_back(offset);
      private_adj_base_.push_back(
          adstack::has_adjoint_block(descs.at(s)) ? op(spv::OpIAdd, u32_, {offset, cap}) : 0);
      auto at = [&](uint32_t pos) {
        if (slot_major())
          return op(spv::OpIAdd, u32_, {op(spv::OpIMul, u32_, {pos, slot_step_}), gid_});
        return op(spv::OpIAdd, u32_, {row_base[static_cast<size_t>(descs.at(s).heap)], pos});
      };
      stack_base_.push_back(at(offset));
      stack_adj_base_.push_back(
          adstack::has_adjoint_block(descs.at(s)) ? at(op(spv::OpIAdd, u32_, {offset, cap})) : 0);
    }
    heap_binding_ = 1 + layout_.array_count();
  }

  void emit_stack(const Stmt& s) {
    if (s.op == Op::kStackAlloc) {
      StackVar st;
      st.type = s.type;
      st.heap = stack_heap(s.type);
      st.index = static_cast<uint32_t>(stacks_.size());
      st.count = m_.function_variable(u32_);
      st.cap = stack_cap_.at(st.index);
      m_.op(spv::OpStore, {st.count, m_.c_u32(0)});
      stacks_.emplace(s.result, st);
      return;
    }
    const StackVar& st = stacks_.at(s.args[0]);
    switch (stack_op(s.op)) {
      case StackOp::kStackAlloc: return;  // above: it makes the stack the others use
      case StackOp::kStackPush: {
        uint32_t c = op(spv::OpLoad, u32_, {st.count});
        uint32_t fits = op(spv::OpULessThan, bool_, {c, st.cap});
        if_else(
            fits,
            [&] {
              store_slot(st, c, false, to_heap(st, v(s.args[1])));
              // A stack without an adjoint block (its adjoint is never used) writes no zero.
              if (stack_adj_base_.at(st.index)) store_slot(st, c, true, zero(st.type));
              m_.op(spv::OpStore, {st.count, op(spv::OpIAdd, u32_, {c, m_.c_u32(1)})});
            },
            [&] { raise(m_.c_u32(abi::adstack_overflow_word(st.index))); });
        return;
      }
      case StackOp::kStackPop: {
        uint32_t c = op(spv::OpLoad, u32_, {st.count});
        uint32_t has = op(spv::OpUGreaterThan, bool_, {c, m_.c_u32(0)});
        uint32_t dec = op(spv::OpSelect, u32_, {has, op(spv::OpISub, u32_, {c, m_.c_u32(1)}), c});
        m_.op(spv::OpStore, {st.count, dec});
        return;
      }
      case StackOp::kStackTop:
      case StackOp::kStackTopAdj: {
        set(s, from_heap(st, load_slot(st, top_slot(st), s.op == Op::kStackTopAdj)));
        return;
      }
      case StackOp::kStackAccAdj: {
        uint32_t top = top_slot(st);
        uint32_t sum = op(spv::OpFAdd, type(st.type), {load_slot(st, top, true), v(s.args[1])});
        store_slot(st, top, true, sum);
        return;
      }
    }
  }
  // Whether a stack was allocated in what was emitted so far.
  bool any_stack() const { return !stacks_.empty(); }

 private:
  struct StackVar {
    DType type;
    adstack::Heap heap;
    uint32_t index;  // within the task
    uint32_t count;  // Function variable holding the count
    uint32_t cap;    // value: capacity
  };

  void count_stacks(const Block& b, uint32_t* n) {
    for (const Stmt& s : b.stmts) {
      if (s.op == Op::kStackAlloc) ++*n;
      for (const Block& c : s.blocks) count_stacks(c, n);
    }
  }

  bool slot_major() const { return target_.adstack_layout == adstack::Layout::kSlotMajor; }

  uint32_t heap_var(adstack::Heap h, DType t) {
    size_t i = static_cast<size_t>(h);
    if (heap_vars_[i]) return heap_vars_[i];
    uint32_t elem = h == adstack::Heap::kInt ? u32_ : type(t);
    uint32_t blk = m_.t_buffer_block(elem, adstack::heap_elem_bytes(h));
    heap_vars_[i] =
        m_.global_variable(m_.t_pointer(spv::StorageClassStorageBuffer, blk),
                           spv::StorageClassStorageBuffer, static_cast<int>(heap_binding_ + i));
    m_.name(heap_vars_[i], std::string("adstack_") + adstack::heap_name(h));
    heap_elem_[i] = elem;
    return heap_vars_[i];
  }

  // Pointer to slot `slot` of stack `st` (its primal, or its adjoint) for this thread.
  uint32_t stack_ptr(const StackVar& st, uint32_t slot, bool adjoint) {
    size_t h = static_cast<size_t>(st.heap);
    uint32_t var = heap_var(st.heap, st.type);
    uint32_t base = adjoint ? stack_adj_base_.at(st.index) : stack_base_.at(st.index);
    uint32_t step = slot_major() ? op(spv::OpIMul, u32_, {slot, slot_step_}) : slot;
    uint32_t at = op(spv::OpIAdd, u32_, {base, step});
    return op(spv::OpAccessChain, m_.t_pointer(spv::StorageClassStorageBuffer, heap_elem_[h]),
              {var, m_.c_u32(0), at});
  }

  // Pointer to slot `slot` of stack `st` in its private array (private tier).
  uint32_t private_ptr(const StackVar& st, uint32_t slot, bool adjoint) {
    size_t h = static_cast<size_t>(st.heap);
    heap_var(st.heap, st.type);  // heap_elem_[h]: the element type of both tiers
    uint32_t base = adjoint ? private_adj_base_.at(st.index) : private_base_.at(st.index);
    return op(spv::OpAccessChain, m_.t_pointer(spv::StorageClassFunction, heap_elem_[h]),
              {private_vars_[h], op(spv::OpIAdd, u32_, {base, slot})});
  }

  // Load / store of a slot in the launch's tier: both accesses behind a branch on the tier's
  // spec constant (after specialization, one side is dead code).
  uint32_t load_slot(const StackVar& st, uint32_t slot, bool adjoint) {
    uint32_t elem = heap_elem_for(st);
    uint32_t t = m_.id(), e = m_.id(), merge = m_.id();
    m_.op(spv::OpSelectionMerge, {merge, spv::SelectionControlMaskNone});
    m_.op(spv::OpBranchConditional, {private_tier_, t, e});
    block(t);
    uint32_t from_private = op(spv::OpLoad, elem, {private_ptr(st, slot, adjoint)});
    branch(merge);
    block(e);
    uint32_t from_heap = op(spv::OpLoad, elem, {stack_ptr(st, slot, adjoint)});
    branch(merge);
    block(merge);
    return op(spv::OpPhi, elem, {from_private, t, from_heap, e});
  }
  void store_slot(const StackVar& st, uint32_t slot, bool adjoint, uint32_t value) {
    if_else(
        private_tier_,
        [&] {
          m_.op(spv::OpStore, {private_ptr(st, slot, adjoint), value});
        },
        [&] {
          m_.op(spv::OpStore, {stack_ptr(st, slot, adjoint), value});
        });
  }

  // The top slot: count - 1, or 0 for an empty stack (capacity >= 1 keeps it in the row).
  uint32_t top_slot(const StackVar& st) {
    uint32_t c = op(spv::OpLoad, u32_, {st.count});
    uint32_t has = op(spv::OpUGreaterThan, bool_, {c, m_.c_u32(0)});
    return op(spv::OpSelect, u32_, {has, op(spv::OpISub, u32_, {c, m_.c_u32(1)}), m_.c_u32(0)});
  }

  uint32_t to_heap(const StackVar& st, uint32_t val) {
    return st.type == DType::kI32 ? op(spv::OpBitcast, u32_, {val}) : val;
  }
  uint32_t from_heap(const StackVar& st, uint32_t val) {
    return st.type == DType::kI32 ? op(spv::OpBitcast, i32_, {val}) : val;
  }
  uint32_t heap_elem_for(const StackVar& st) {
    heap_var(st.heap, st.type);
    return heap_elem_[static_cast<size_t>(st.heap)];
  }

  std::unordered_map<ValueId, StackVar> stacks_;
  std::vector<uint32_t> stack_cap_, stack_base_, stack_adj_base_;  // per stack (values)
  std::vector<uint32_t> private_base_, private_adj_base_;          // per stack (values)
  uint32_t private_tier_ = 0;                                      // spec constant (bool)
  std::array<uint32_t, adstack::kHeapCount> private_vars_{};
  uint32_t slot_step_ = 0;  // slot-major: T, the dispatched threads
  std::array<uint32_t, adstack::kHeapCount> heap_vars_{}, heap_elem_{};
  uint32_t heap_binding_ = 0;
};

// The statement emitter: the entry function (its interface, the launch constants, the
// grid-stride loop over the task's range, unrolled where the body allows, and an N-d task's
// indices), and every statement, each family dispatched to the layer that emits it; locals,
// shared arrays, control flow, barriers and print / assert records are emitted here.
class TaskEmitter : public AdstackEmitter {
 public:
  TaskEmitter(const Kernel& k, size_t task, const abi::CompiledKernel& layout, const Target& target,
              const EmitOptions& o)
      : AdstackEmitter(k, task, layout, target, o) {
    const std::vector<const Stmt*> prints = print_sites(k, task);
    for (uint32_t i = 0; i < prints.size(); ++i) print_site_[prints[i]] = i;
  }

  std::vector<uint32_t> run() {
    scan_arrays(task_.body);
    u32_ = m_.t_int(32, false);
    i32_ = m_.t_int(32, true);
    bool_ = m_.t_bool();
    const Interface io = declare_interface();
    uint32_t void_t = m_.t_void();
    uint32_t fn = m_.id();
    m_.op(spv::OpFunction, {void_t, fn, spv::FunctionControlMaskNone, m_.t_function(void_t)});
    uint32_t entry = m_.id();
    block(entry);
    uint32_t gid3 = op(spv::OpLoad, io.v3, {io.gid_var});
    gid_ = op(spv::OpCompositeExtract, u32_, {gid3, 0});
    uint32_t nwg3 = op(spv::OpLoad, io.v3, {io.nwg_var});
    uint32_t nwg = op(spv::OpCompositeExtract, u32_, {nwg3, 0});
    uint32_t stride = op(spv::OpIMul, u32_, {nwg, m_.c_u32(o_.local_size)});
    uint32_t pc_ptr = m_.t_pointer(spv::StorageClassPushConstant, u32_);
    uint32_t begin =
        op(spv::OpLoad, u32_, {op(spv::OpAccessChain, pc_ptr, {io.pc_var, m_.c_u32(0)})});
    uint32_t end =
        op(spv::OpLoad, u32_, {op(spv::OpAccessChain, pc_ptr, {io.pc_var, m_.c_u32(1)})});
    uint32_t start = op(spv::OpIAdd, u32_, {begin, gid_});
    // Whether the launch runs enough iterations for a subgroup's combined add to pay (atomic_add:
    // a uniform value, so a branch on it costs a small launch nothing).
    wide_ = op(spv::OpUGreaterThanEqual, bool_,
               {op(spv::OpISub, u32_, {end, begin}), m_.c_u32(kCombineUniformFrom)});
    runs_wide_ = op(spv::OpUGreaterThan, bool_,
                    {op(spv::OpISub, u32_, {end, begin}), m_.c_u32(kCombineRunsAbove)});
    m_.preserve_nan_inf(target_.preserve_nan_inf_f32, target_.preserve_nan_inf_f64);
    load_adstack_layout();
    load_launch_constants(task_.body);
    declare_spec_words();
    load_nd_bounds();
    declare_bounds_flag();
    uint32_t first = emit_unrolled_loop(start, end, stride);
    // A body with adds that may combine in runs (may_run), no adstack and no shared memory runs
    // as two copies, one per side of a uniform branch on runs_wide_: the plain one is the code
    // without combining, so a launch too small for it pays nothing (branches per group inside
    // it cost diffmpm's 2,976-particle g2p/p2g 7.7 -> 8.2 us on an H200).
    // (may_run leaves shared-memory tasks out; an adstack is declared once per task)
    const bool two_copies = !contains_op(task_.body, Op::kStackAlloc) && any_may_run(task_.body);
    loop(u32_, first, end, stride, /*is_signed=*/false, [&](uint32_t i) {
      bind_indices(i);
      if (!two_copies) return emit_block(task_.body);
      runs_branch_ = false;
      if_else(
          runs_wide_, [&] { emit_block(task_.body); },
          [&] {
            runs_on_ = false;
            emit_block(task_.body);
            runs_on_ = true;
          });
      runs_branch_ = true;
    });
    flush_runs();  // emit_block flushed (none pending here)
    raise_bounds_flag();
    m_.op(spv::OpReturn, {});
    m_.op(spv::OpFunctionEnd, {});
    std::vector<uint32_t> interface = {io.gid_var, io.nwg_var};
    for (uint32_t var : {lane_var_, size_var_, le_mask_var_}) {
      if (var) interface.push_back(var);
    }
    return m_.finish(fn, entry, interface, o_.local_size);
  }

 private:
  // The main loop of an unrolled task (o_.unroll elements per iteration), when the task can
  // take one; returns where the plain loop starts.
  uint32_t emit_unrolled_loop(uint32_t start, uint32_t end, uint32_t stride) {
    uint32_t first = start;
    if (o_.unroll > 1 && !task_.serial && task_.dims.empty() && unrollable(task_.body)) {
      // Main loop: kUnroll elements per iteration (i, i + stride, ...), their statements
      // interleaved so the loads of all copies issue before the first use. One 4-byte load in
      // flight per thread cannot saturate HBM (H200: generated saxpy 87% of a uvec4 copy).
      // It runs while the last copy is in range; the plain loop below finishes the rest.
      const uint32_t u = o_.unroll;
      uint32_t span = op(spv::OpIMul, u32_, {stride, m_.c_u32(u - 1)});
      uint32_t has_room = op(spv::OpUGreaterThan, bool_, {end, span});
      uint32_t limit =
          op(spv::OpSelect, u32_, {has_room, op(spv::OpISub, u32_, {end, span}), m_.c_u32(0)});
      uint32_t step = op(spv::OpIMul, u32_, {stride, m_.c_u32(u)});
      first = loop(u32_, start, limit, step, /*is_signed=*/false, [&](uint32_t i) {
        std::vector<std::unordered_map<ValueId, uint32_t>> copies(u, values_);
        for (uint32_t c = 0; c < u; ++c) {
          uint32_t ic =
              c == 0 ? i : op(spv::OpIAdd, u32_, {i, op(spv::OpIMul, u32_, {stride, m_.c_u32(c)})});
          copies[c][task_.index] = op(spv::OpBitcast, i32_, {ic});
        }
        types_[task_.index] = DType::kI32;
        for (const Stmt& st : task_.body.stmts) {
          for (uint32_t c = 0; c < u; ++c) {
            std::swap(values_, copies[c]);
            emit(st);
            std::swap(values_, copies[c]);
          }
        }
      });
    }
    return first;
  }

  // A parallel task body may run several elements interleaved (statement by statement) only
  // if the elements cannot see each other: straight-line code (no loops, branches, locals,
  // adstacks or atomics, whose order or storage the copies would share) in which every ndarray
  // the body stores to is accessed only at the task's own index, so the copies touch disjoint
  // elements of it. Reads of arrays the body does not write may use any index.
  bool unrollable(const Block& b) const {
    std::unordered_map<uint32_t, bool> written;
    for (const Stmt& st : b.stmts) {
      if (!straight_line(st.op)) return false;
      if (st.op == Op::kStore) written[st.param] = true;
    }
    if (written.empty()) return false;
    for (const Stmt& st : b.stmts) {
      if ((st.op != Op::kLoad && st.op != Op::kStore) || !written.count(st.param)) continue;
      size_t nidx = st.op == Op::kStore ? st.args.size() - 1 : st.args.size();
      if (nidx != 1 || st.args[0] != task_.index) return false;
    }
    return true;
  }
  // Whether copies of `op` for several elements may run interleaved: values, loads and
  // stores; not loops, branches, locals, adstacks, atomics or barriers.
  static bool straight_line(Op op) {
    return is_pure_value(op) || op == Op::kLoad || op == Op::kStore;
  }

  // ------------------------------------------------------------ N-d ranges
  // An N-d task's range is [0, product of extents) (the runtime sets it so); each dimension's
  // begin and extent are computed here once per invocation, from the same args-buffer words
  // the host evaluated, in i32 (add and mul wrap like the host's exact values modulo 2^32;
  // the launch refused bounds outside [0, 2^31)).
  uint32_t size_value(const SizeExpr& e) {
    switch (e.kind) {
      case SizeExpr::Kind::kConst: return m_.c_i32(static_cast<int32_t>(e.value));
      case SizeExpr::Kind::kScalar: {
        uint32_t s = read_scalar(e.param);
        if (k_.params[e.param].dtype == DType::kU32) s = op(spv::OpBitcast, i32_, {s});
        return ext(GLSLstd450SMax, i32_, {s, m_.c_i32(0)});  // a negative scalar counts as 0
      }
      case SizeExpr::Kind::kNegScalar: {  // verify() keeps it out of task dimensions
        uint32_t s = read_scalar(e.param);
        if (k_.params[e.param].dtype == DType::kU32) return m_.c_i32(0);
        return ext(GLSLstd450SMax, i32_, {op(spv::OpSNegate, i32_, {s}), m_.c_i32(0)});
      }
      case SizeExpr::Kind::kDim:
        return op(spv::OpBitcast, i32_, {args_word(layout_.shape_offset(e.param) + 4 * e.dim)});
      case SizeExpr::Kind::kAdd:
      case SizeExpr::Kind::kMul:
      case SizeExpr::Kind::kMax:
      case SizeExpr::Kind::kDiv: {  // verify() keeps div out of task dimensions
        uint32_t r = size_value(e.operands[0]);
        for (size_t i = 1; i < e.operands.size(); ++i) {
          uint32_t x = size_value(e.operands[i]);
          if (e.kind == SizeExpr::Kind::kAdd)
            r = op(spv::OpIAdd, i32_, {r, x});
          else if (e.kind == SizeExpr::Kind::kMul)
            r = op(spv::OpIMul, i32_, {r, x});
          else
            r = ext(GLSLstd450SMax, i32_, {r, x});
        }
        return r;
      }
    }
    return m_.c_i32(0);
  }
  void load_nd_bounds() {
    for (const TaskDim& d : task_.dims) {
      uint32_t b = size_value(d.begin), e = size_value(d.end);
      uint32_t ext = ext_inst_smax(op(spv::OpISub, i32_, {e, b}));
      nd_begin_.push_back(op(spv::OpBitcast, u32_, {b}));
      nd_extent_.push_back(op(spv::OpBitcast, u32_, {ext}));
    }
  }
  uint32_t ext_inst_smax(uint32_t x) { return ext(GLSLstd450SMax, i32_, {x, m_.c_i32(0)}); }
  // The index values of iteration `i` (u32): i itself for a 1-d task; for an N-d one its
  // row-major coordinates, the last dimension fastest. i < product of extents, so no
  // extent divided by here is 0.
  void bind_indices(uint32_t i) {
    if (task_.dims.empty()) {
      values_[task_.index] = op(spv::OpBitcast, i32_, {i});
      types_[task_.index] = DType::kI32;
      return;
    }
    uint32_t rem = i;
    for (size_t d = task_.dims.size(); d-- > 0;) {
      uint32_t coord = rem;
      if (d > 0) {
        coord = op(spv::OpUMod, u32_, {rem, nd_extent_[d]});
        rem = op(spv::OpUDiv, u32_, {rem, nd_extent_[d]});
      }
      uint32_t idx = op(spv::OpIAdd, u32_, {nd_begin_[d], coord});
      values_[task_.dims[d].index] = op(spv::OpBitcast, i32_, {idx});
      types_[task_.dims[d].index] = DType::kI32;
    }
  }

  // ------------------------------------------------------------ statements
  void emit_block(const Block& b) {
    for (const Stmt& s : b.stmts) emit(s);
    flush_runs();
  }

  void emit(const Stmt& s) {
    const OpFamily family = op_info(s.op).family;
    // Pending run adds (flush_runs) wait only behind values, locals and other atomic adds.
    const bool passes =
        family != OpFamily::kArray && family != OpFamily::kControl && family != OpFamily::kStack;
    if (!passes && s.op != Op::kAtomicAdd) flush_runs();
    switch (family) {
      case OpFamily::kLeaf: set(s, leaf(s)); return;
      case OpFamily::kUnary: set(s, unary(s)); return;
      case OpFamily::kBinary: set(s, binary(s)); return;
      case OpFamily::kCompare: set(s, compare(s)); return;
      case OpFamily::kSelect:
        set(s, op(spv::OpSelect, type(s.type), {v(s.args[0]), v(s.args[1]), v(s.args[2])}));
        return;
      case OpFamily::kCast: set(s, cast(s)); return;
      case OpFamily::kLocal: local(s); return;
      case OpFamily::kArray: emit_array(s); return;
      case OpFamily::kControl: control(s); return;
      case OpFamily::kStack: emit_stack(s); return;
    }
  }

  void local(const Stmt& s) {
    switch (local_op(s.op)) {
      case LocalOp::kAlloca: {
        uint32_t var = m_.function_variable(type(s.type));
        m_.op(spv::OpStore, {var, zero(s.type)});
        locals_[s.result] = var;
        return;
      }
      case LocalOp::kLoadLocal:
        set(s, op(spv::OpLoad, type(s.type), {locals_.at(s.args[0])}));
        return;
      case LocalOp::kStoreLocal: m_.op(spv::OpStore, {locals_.at(s.args[0]), v(s.args[1])}); return;
      case LocalOp::kSharedAlloc: {
        // One Workgroup variable per array, however often the body is emitted (the
        // grid-stride loop's unrolled copies share it: they run one after another).
        auto [it, fresh] = shared_.try_emplace(s.result);
        if (fresh) {
          const uint32_t arr = m_.t_array(type(s.type), m_.c_u32(static_cast<uint32_t>(s.iimm)));
          it->second = {m_.global_variable(m_.t_pointer(spv::StorageClassWorkgroup, arr),
                                           spv::StorageClassWorkgroup),
                        static_cast<uint32_t>(s.iimm), s.type};
        }
        return;
      }
      case LocalOp::kLoadShared: set(s, op(spv::OpLoad, type(s.type), {shared_element(s)})); return;
      case LocalOp::kStoreShared: m_.op(spv::OpStore, {shared_element(s), v(s.args[2])}); return;
    }
  }
  // The element of a shared array at args[1], the index clamped into the array (the blocked
  // stencils index it in range; a clamp keeps a wrong index from reaching other memory).
  uint32_t shared_element(const Stmt& s) {
    const Shared& a = shared_.at(s.args[0]);
    const uint32_t i = op(spv::OpBitcast, u32_, {v(s.args[1])});
    const uint32_t in = ext(GLSLstd450UMin, u32_, {i, m_.c_u32(a.n - 1)});
    return op(spv::OpAccessChain, m_.t_pointer(spv::StorageClassWorkgroup, type(a.type)),
              {a.var, in});
  }

  void control(const Stmt& s) {
    switch (control_op(s.op)) {
      case ControlOp::kFor: for_loop(s); return;
      case ControlOp::kIf:
        if_else(
            v(s.args[0]), [&] { emit_block(s.blocks[0]); }, [&] { emit_block(s.blocks[1]); });
        return;
      case ControlOp::kWhile: while_loop(s); return;
      case ControlOp::kBreak:
      case ControlOp::kContinue:
        // A break / continue block of the innermost loop's construct (structured: the loop's
        // merge block or continue target). The verifier put it last in its IR block, so the
        // enclosing construct's closing branch is the next thing emitted; branch() drops it.
        m_.op(spv::OpBranch, {s.op == Op::kBreak ? loops_.back().first : loops_.back().second});
        ended_ = true;
        return;
      case ControlOp::kBarrier: barrier(); return;
      case ControlOp::kPrint: print_record(s, 0); return;
      case ControlOp::kAssert: {
        const uint32_t site = print_site_.at(&s);
        if_else(
            op(spv::OpLogicalNot, bool_, {v(s.args[0])}),
            [&] {
              print_record(s, 1);
              raise(m_.c_u32(abi::assert_word(site)));
            },
            [] {});
        return;
      }
    }
  }
  // One record of a print / assert (abi/print_records.h): its words reserved whole by an
  // atomic add on the area's first word, written if they fit, else counted as dropped.
  void print_record(const Stmt& s, size_t first) {
    const uint32_t site = print_site_.at(&s);
    std::vector<uint32_t> words = {m_.c_u32(abi::print_site_word(task_index_, site))};
    for (ValueId ix : task_indices(task_)) words.push_back(op(spv::OpBitcast, u32_, {v(ix)}));
    for (size_t a = first; a < s.args.size(); ++a) {
      const uint32_t x = v(s.args[a]);
      switch (vt(s.args[a])) {
        case DType::kF32:
        case DType::kI32: words.push_back(op(spv::OpBitcast, u32_, {x})); break;
        case DType::kU32: words.push_back(x); break;
        case DType::kBool:
          words.push_back(op(spv::OpSelect, u32_, {x, m_.c_u32(1), m_.c_u32(0)}));
          break;
        case DType::kF64:
        case DType::kI64: {
          const uint32_t pair = op(spv::OpBitcast, m_.t_vector(u32_, 2), {x});
          words.push_back(op(spv::OpCompositeExtract, u32_, {pair, 0}));
          words.push_back(op(spv::OpCompositeExtract, u32_, {pair, 1}));
          break;
        }
      }
    }
    const uint32_t base = layout_.print_offset() / 4;
    const uint32_t capacity = layout_.print_bytes / 4 - abi::kPrintHeaderWords;
    const auto n = static_cast<uint32_t>(words.size());
    const uint32_t scope = m_.c_u32(kScopeDevice), sem = m_.c_u32(kRelaxed);
    const uint32_t at =
        op(spv::OpAtomicIAdd, u32_, {error_word_ptr(m_.c_u32(base)), scope, sem, m_.c_u32(n)});
    // `at` <= capacity - n, written so that no sum wraps (capacity >= n: kMinPrintBytes).
    const uint32_t fits = op(spv::OpULessThanEqual, bool_, {at, m_.c_u32(capacity - n)});
    if_else(
        fits,
        [&] {
          const uint32_t first_word = op(spv::OpIAdd, u32_, {at, m_.c_u32(base + 2)});
          for (uint32_t w = 0; w < n; ++w) {
            const uint32_t index = op(spv::OpIAdd, u32_, {first_word, m_.c_u32(w)});
            m_.op(spv::OpStore, {error_word_ptr(index), words[w]});
          }
        },
        [&] {
          op(spv::OpAtomicIAdd, u32_,
             {error_word_ptr(m_.c_u32(base + 1)), scope, sem, m_.c_u32(1)});
        });
  }
  // `for (i = 0; test(i); ++i) body(i)`: the loop() shape with the test block emitted in the
  // check block (its statements may open selections of their own: bounds-checked loads).
  void while_loop(const Stmt& s) {
    uint32_t header = 0, check = m_.id(), body_l = m_.id(), cont = m_.id(), merge = m_.id();
    uint32_t next = m_.id();
    uint32_t pre = 0;
    enter_header(&header, &pre);
    uint32_t i = op(spv::OpPhi, i32_, {m_.c_i32(0), pre, next, cont});
    values_[s.result] = i;
    types_[s.result] = DType::kI32;
    m_.op(spv::OpLoopMerge, {merge, cont, spv::LoopControlMaskNone});
    branch(check);
    block(check);
    emit_block(s.blocks[0]);
    const uint32_t test_end = cur_;  // the test's statements may have opened blocks of their own
    m_.op(spv::OpBranchConditional, {v(s.args[0]), body_l, merge});
    block(body_l);
    sole_pred_ = test_end;
    loops_.push_back({merge, cont});
    emit_block(s.blocks[1]);
    loops_.pop_back();
    branch(cont);
    block(cont);
    m_.op(spv::OpIAdd, {i32_, next, i, m_.c_i32(1)});
    branch(header);
    block(merge);
  }
  void for_loop(const Stmt& s) {
    const bool unroll = any_stack() && s.has_cap && s.cap.kind == adstack::SizeExpr::Kind::kConst &&
                        s.cap.value <= kUnrollMaxTrips;
    loop(
        i32_, v(s.args[0]), v(s.args[1]), m_.c_i32(1), /*is_signed=*/true,
        [&](uint32_t i) {
          values_[s.result] = i;
          types_[s.result] = DType::kI32;
          emit_block(s.blocks[0]);
        },
        unroll ? spv::LoopControlUnrollMask : spv::LoopControlMaskNone);
  }
  void barrier() {
    // Workgroup execution and memory scope: the invocations that meet here share an SM /
    // core, and only they read what the others wrote (ir.h). AcquireRelease over storage
    // buffers (UniformMemory) and workgroup memory: GLSL's memoryBarrierBuffer() + barrier()
    // at the narrowest scope that covers them.
    constexpr uint32_t kScopeWorkgroup = 2;
    constexpr uint32_t kSemantics =
        0x8 /*AcquireRelease*/ | 0x40 /*UniformMemory*/ | 0x100 /*WorkgroupMemory*/;
    m_.op(spv::OpControlBarrier,
          {m_.c_u32(kScopeWorkgroup), m_.c_u32(kScopeWorkgroup), m_.c_u32(kSemantics)});
  }

  std::unordered_map<const Stmt*, uint32_t> print_site_;  // print and assert statements
  std::unordered_map<ValueId, uint32_t> locals_;
  struct Shared {
    uint32_t var = 0, n = 0;
    DType type = DType::kF32;
  };
  std::unordered_map<ValueId, Shared> shared_;
  std::vector<uint32_t> nd_begin_, nd_extent_;  // N-d tasks: per dimension (u32 values)
};

}  // namespace

namespace {
// The statements of task `task` that `pred` picks, in a pre-order walk: the site numbers the
// finite and bounds checks carry.
template <typename Pred>
std::vector<const Stmt*> sites_of(const Kernel& k, size_t task, Pred pred) {
  std::vector<const Stmt*> out;
  for_each_stmt(k.tasks[task].body, [&](const Stmt& s) {
    if (pred(s)) out.push_back(&s);
  });
  return out;
}
}  // namespace

std::vector<const Stmt*> finite_check_sites(const Kernel& k, size_t task) {
  return sites_of(k, task, [&](const Stmt& s) {
    return (s.op == Op::kStore || s.op == Op::kAtomicAdd) && is_float(k.params[s.param].dtype);
  });
}

std::vector<const Stmt*> access_sites(const Kernel& k, size_t task) {
  return sites_of(k, task, [](const Stmt& s) {
    return s.op == Op::kLoad || s.op == Op::kStore || s.op == Op::kAtomicAdd ||
           s.op == Op::kAtomicMax;
  });
}

std::vector<const Stmt*> print_sites(const Kernel& k, size_t task) {
  return sites_of(k, task, [](const Stmt& s) { return s.op == Op::kPrint || s.op == Op::kAssert; });
}

std::vector<uint32_t> emit_task(const Kernel& k, size_t task, const abi::CompiledKernel& layout,
                                const Target& target, const EmitOptions& options) {
  TaskEmitter e(k, task, layout, target, options);
  return e.run();
}

}  // namespace vkad::codegen
