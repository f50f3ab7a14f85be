#include "ir/verifier.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "abi/print_records.h"
#include "ir/text.h"

namespace vkad::codegen {

namespace {

enum class IdKind : uint8_t { kValue, kLocal, kStack, kShared };

struct IdInfo {
  IdKind kind = IdKind::kValue;
  DType type = DType::kF32;
  const Stmt* def = nullptr;  // null for a task index
};

// What the verifier's layers share: the kernel and target, the task being checked, the ids
// defined so far with the scopes that see them, and the state the walk keeps (loop depth,
// divergence, launch-uniform values). Formats every error ("kernel 'k', task 't', statement
// `...`: what"); define() records an id in the innermost scope, use() looks an operand up and
// says why it is not usable.
class VerifierState {
 protected:
  VerifierState(const Kernel& k, const Target& t) : k_(k), target_(t) {}

  Status kernel_error(const std::string& what) const {
    return make_error(ErrorCode::kInvalidArgument, "kernel '" + k_.name + "': " + what);
  }
  Status task_error(const std::string& what) const {
    return make_error(ErrorCode::kInvalidArgument,
                      "kernel '" + k_.name + "', task '" + task_->name + "': " + what);
  }
  Status error(const Stmt& s, const std::string& what,
               ErrorCode code = ErrorCode::kInvalidArgument) const {
    return make_error(code, "kernel '" + k_.name + "', task '" + task_->name + "', statement `" +
                                print_stmt(k_, s) + "`: " + what);
  }
  Status dtype_supported(DType t, const std::string& where, const Stmt* s) const {
    std::string what;
    if (t == DType::kI64 && !target_.int64) {
      what = "dtype i64 is not supported on this device (" + target_.device_name +
             " lacks shaderInt64)";
    }
    if (t == DType::kF64 && !target_.float64) {
      what = "dtype f64 is not supported on this device (" + target_.device_name +
             " lacks shaderFloat64)";
    }
    if (what.empty()) return {};
    if (s) return error(*s, what, ErrorCode::kUnsupported);
    return make_error(ErrorCode::kUnsupported, "kernel '" + k_.name + "', " + where + ": " + what);
  }

  Status define(ValueId id, IdInfo info, const Stmt* s) {
    if (id == kNoValue) return error(*s, "the statement has no result id");
    if (!ids_.emplace(id, info).second) {
      std::string what = "%" + std::to_string(id) + " is defined twice";
      return s ? error(*s, what) : task_error(what);
    }
    if (!scopes_.empty()) scopes_.back().insert(id);
    return {};
  }

  // Looks `id` up as an operand and says precisely why it is not usable.
  Result<IdInfo> use(const Stmt& s, ValueId id, IdKind want) {
    std::string name = "%" + std::to_string(id);
    bool visible = false;
    for (const auto& scope : scopes_) visible = visible || scope.count(id);
    if (!visible) {
      auto it = ids_.find(id);
      if (it != ids_.end()) {
        return error(s, name + " is used outside its scope (it is defined inside `" +
                            (it->second.def ? print_stmt(k_, *it->second.def) : "a task") +
                            "`'s block, which has ended)");
      }
      if (all_defs_.count(id)) return error(s, "use of " + name + " before its definition");
      return error(s, name + " is not defined");
    }
    const IdInfo& info = ids_.at(id);
    if (info.kind != want) {
      const char* kinds[] = {"a value", "a local (alloca)", "an adstack (stack_alloc)",
                             "a shared array (shared_alloc)"};
      return error(s, name + " is " + kinds[static_cast<int>(info.kind)] + ", expected " +
                          kinds[static_cast<int>(want)]);
    }
    return info;
  }

  Result<DType> value(const Stmt& s, size_t i) {
    VKAD_ASSIGN_OR_RETURN(IdInfo info, use(s, s.args[i], IdKind::kValue));
    return info.type;
  }

  static std::string tn(DType t) { return abi::dtype_name(t); }

  Status expect_args(const Stmt& s, size_t n) const {
    if (s.args.size() != n) {
      return error(s, std::string(op_info(s.op).name) + " takes " + std::to_string(n) +
                          " operand(s), got " + std::to_string(s.args.size()));
    }
    return {};
  }

  Status same(const Stmt& s, DType a, DType b) const {
    if (a != b) return error(s, "type mismatch: operands are " + tn(a) + " and " + tn(b));
    return {};
  }
  Status result_is(const Stmt& s, DType t) const {
    if (s.type != t)
      return error(
          s, "type mismatch: the result is " + tn(s.type) + " but the operation yields " + tn(t));
    return {};
  }
  Result<const Param*> param(const Stmt& s) const {
    if (s.param >= k_.params.size())
      return error(s, "parameter " + std::to_string(s.param) + " does not exist");
    return &k_.params[s.param];
  }

  const Kernel& k_;
  const Target& target_;
  const Task* task_ = nullptr;
  std::unordered_map<ValueId, IdInfo> ids_;
  std::unordered_set<ValueId> all_defs_;
  std::vector<std::unordered_set<ValueId>> scopes_;
  uint32_t loop_depth_ = 0;  // for / while bodies around the statement (branches don't count)
  // Blocks around the statement that invocations may run differently (if, while, for loops
  // with varying bounds or early exits): a barrier needs none.
  uint32_t divergent_ = 0;
  std::unordered_set<ValueId> uniform_;
};

// The kernel's outline, before any statement: its parameters, the tasks' 1-d range bounds and
// N-d dimensions, the size expressions statements carry (caps), and whether a task's
// workgroups are whole (where a barrier or a shared array may go). Reads the state, changes none.
class ShapeChecks : public VerifierState {
 protected:
  using VerifierState::VerifierState;

  Status check_param(size_t i) {
    const Param& p = k_.params[i];
    if (p.name.empty()) return kernel_error("parameter " + std::to_string(i) + " has no name");
    for (size_t j = 0; j < i; ++j) {
      if (k_.params[j].name == p.name)
        return kernel_error("two parameters are called '" + p.name + "'");
    }
    VKAD_TRY(dtype_supported(p.dtype, "parameter '" + p.name + "'", nullptr));
    if (p.kind == ParamKind::kNdArray && (p.rank == 0 || p.rank > abi::kMaxNdArrayRank)) {
      return kernel_error("ndarray parameter '" + p.name + "' has rank " + std::to_string(p.rank) +
                          " (1 to " + std::to_string(abi::kMaxNdArrayRank) + " supported)");
    }
    if (p.needs_grad && !is_float(p.dtype)) {
      return kernel_error("parameter '" + p.name +
                          "' is marked grad, but only float ndarrays and scalars have gradients");
    }
    return {};
  }

  Status check_bound(const RangeBound& b, const char* which) const {
    if (b.kind == RangeBound::Kind::kConstant) {
      if (b.value < 0) return task_error(std::string("range ") + which + " is negative");
      return {};
    }
    if (b.param >= k_.params.size()) {
      return task_error(std::string("range ") + which + " names parameter " +
                        std::to_string(b.param) + ", which does not exist");
    }
    const Param& p = k_.params[b.param];
    if (b.kind == RangeBound::Kind::kScalarParam &&
        (p.kind != ParamKind::kScalar || (p.dtype != DType::kI32 && p.dtype != DType::kU32))) {
      return task_error(std::string("range ") + which + " uses '" + p.name +
                        "', which is not an i32 or u32 scalar");
    }
    if (b.kind == RangeBound::Kind::kArrayDim &&
        (p.kind != ParamKind::kNdArray || b.dim >= p.rank)) {
      return task_error(std::string("range ") + which + " uses shape(" + p.name + ", " +
                        std::to_string(b.dim) + "), which does not exist");
    }
    return {};
  }

  // An N-d task's dimensions: 1 to kMaxTaskDims, index = dims[0].index, and bounds whose
  // leaves are i32 constants, i32 / u32 scalars and existing extents (the module evaluates
  // them in i32). A constant begin must not be negative; other bounds are checked per launch.
  Status check_dims(const Task& t) const {
    if (t.dims.size() > kMaxTaskDims) {
      return task_error("the task has " + std::to_string(t.dims.size()) + " dimensions (1 to " +
                        std::to_string(kMaxTaskDims) + " supported)");
    }
    if (t.index != t.dims[0].index)
      return task_error("the task's index is not its first dimension's");
    for (size_t d = 0; d < t.dims.size(); ++d) {
      std::string where = "dimension " + std::to_string(d);
      VKAD_TRY(check_dim_bound(t.dims[d].begin, where + " begin"));
      VKAD_TRY(check_dim_bound(t.dims[d].end, where + " end"));
      const SizeExpr& b = t.dims[d].begin;
      if (b.kind == SizeExpr::Kind::kConst && b.value < 0) {
        return task_error(where + " begin is negative (" + std::to_string(b.value) + ")");
      }
    }
    return {};
  }
  Status check_dim_bound(const SizeExpr& e, const std::string& which) const {
    using K = SizeExpr::Kind;
    switch (e.kind) {
      case K::kConst:
        if (e.value < INT32_MIN || e.value > INT32_MAX) {
          return task_error(which + ": constant " + std::to_string(e.value) +
                            " is out of range for i32");
        }
        return {};
      case K::kScalar:
      case K::kDim: {
        if (e.param >= k_.params.size()) {
          return task_error(which + " names parameter " + std::to_string(e.param) +
                            ", which does not exist");
        }
        const Param& p = k_.params[e.param];
        if (e.kind == K::kScalar &&
            (p.kind != ParamKind::kScalar || (p.dtype != DType::kI32 && p.dtype != DType::kU32))) {
          return task_error(which + " uses '" + p.name + "', which is not an i32 or u32 scalar");
        }
        if (e.kind == K::kDim && (p.kind != ParamKind::kNdArray || e.dim >= p.rank)) {
          return task_error(which + " uses shape(" + p.name + ", " + std::to_string(e.dim) +
                            "), which does not exist");
        }
        return {};
      }
      case K::kDiv:
        return task_error(which + ": a quotient (div) is not allowed in a task dimension");
      case K::kNegScalar: return task_error(which + ": neg() is not allowed in a task dimension");
      case K::kAdd:
      case K::kMul:
      case K::kMax:
        if (e.operands.empty()) return task_error(which + ": a combination without operands");
        for (const SizeExpr& o : e.operands) VKAD_TRY(check_dim_bound(o, which));
        return {};
    }
    return {};
  }

  Status check_size(const Stmt& s, const SizeExpr& e) const {
    using K = SizeExpr::Kind;
    if (e.kind == K::kScalar || e.kind == K::kNegScalar || e.kind == K::kDim) {
      if (e.param >= k_.params.size())
        return error(
            s, "size refers to parameter " + std::to_string(e.param) + ", which does not exist");
      const Param& p = k_.params[e.param];
      if ((e.kind == K::kScalar || e.kind == K::kNegScalar) &&
          (p.kind != ParamKind::kScalar || !is_int(p.dtype))) {
        return error(s, "size uses '" + p.name + "', which is not an integer scalar");
      }
      if (e.kind == K::kDim && (p.kind != ParamKind::kNdArray || e.dim >= p.rank)) {
        return error(s, "size uses shape(" + p.name + ", " + std::to_string(e.dim) +
                            "), which does not exist");
      }
    }
    if ((e.kind == K::kAdd || e.kind == K::kMul || e.kind == K::kMax) && e.operands.empty()) {
      return error(s, "size combination without operands");
    }
    if (e.kind == K::kDiv && (e.operands.size() != 1 || e.value < 1)) {
      return error(s, "size quotient div(x, d) needs one operand and a constant divisor d >= 1");
    }
    for (const SizeExpr& o : e.operands) VKAD_TRY(check_size(s, o));
    return {};
  }

  // Where every workgroup's invocations all run the task's body alike, so they may meet at
  // a barrier and share memory: a parallel 1-d task with its local size set over [0, n *
  // local_size) (constants; the grid-stride loop then gives every invocation of a workgroup
  // the same passes).
  static inline const std::string kWholeGroups =
      "(a parallel 1-d task over [0, n * local_size) with its local size set)";
  static bool whole_workgroups(const Task& t) {
    return !t.serial && t.dims.empty() && t.local_size != 0 &&
           t.begin.kind == RangeBound::Kind::kConstant &&
           t.end.kind == RangeBound::Kind::kConstant && t.begin.value == 0 && t.end.value > 0 &&
           t.end.value % static_cast<int64_t>(t.local_size) == 0;
  }
};

// One statement without blocks, per op family: its operands (defined, visible, of the right
// kind and type), its result's type, and what its result is (a value, a local, an adstack, a
// shared array). The result's definition and the blocks of for / while / if are the
// Verifier's.
class OpChecks : public ShapeChecks {
 protected:
  using ShapeChecks::ShapeChecks;

  // What every statement must be, whatever its op: a result exactly when the op yields one,
  // types the device has, the op's number of blocks, a well-formed cap.
  Status check_form(const Stmt& s) {
    const OpInfo& info = op_info(s.op);
    if (info.has_result && s.result == kNoValue) return error(s, "the statement has no result id");
    if (!info.has_result && s.result != kNoValue) return error(s, "this statement yields no value");
    if (info.has_result) VKAD_TRY(dtype_supported(s.type, "", &s));
    if (s.blocks.size() != info.blocks) return error(s, "malformed blocks");
    if (s.has_cap) VKAD_TRY(check_size(s, s.cap));
    // Operands count too: a statement may use i64 values without yielding one (a store).
    if (!info.has_result || s.type != DType::kI64) {
      for (ValueId a : s.args) {
        auto it = ids_.find(a);
        if (it != ids_.end() && it->second.type == DType::kI64)
          VKAD_TRY(dtype_supported(DType::kI64, "", &s));
      }
    }
    return {};
  }

  // Launch-uniform values (the same in every invocation): constants, scalar parameters and
  // extents, and what is computed from them alone; where a barrier may go depends on them.
  void note_uniform(const Stmt& s) {
    if (!op_info(s.op).has_result || !is_pure_value(s.op)) return;
    if (std::all_of(s.args.begin(), s.args.end(),
                    [&](ValueId a) { return uniform_.count(a) != 0; })) {
      uniform_.insert(s.result);
    }
  }

  Status leaf(const Stmt& s) {
    VKAD_TRY(expect_args(s, 0));
    switch (leaf_op(s.op)) {
      case LeafOp::kConst: return constant(s);
      case LeafOp::kArg: {
        VKAD_ASSIGN_OR_RETURN(const Param* p, param(s));
        if (p->kind != ParamKind::kScalar)
          return error(s, "'" + p->name + "' is an ndarray; read it with load");
        return result_is(s, p->dtype);
      }
      case LeafOp::kShape: {
        VKAD_ASSIGN_OR_RETURN(const Param* p, param(s));
        if (p->kind != ParamKind::kNdArray)
          return error(s, "'" + p->name + "' is a scalar and has no shape");
        if (s.dim >= p->rank)
          return error(s, "'" + p->name + "' has rank " + std::to_string(p->rank) +
                              ", no dimension " + std::to_string(s.dim));
        return result_is(s, DType::kI32);
      }
    }
    return {};
  }
  Status constant(const Stmt& s) const {
    if (s.type == DType::kBool && s.iimm != 0 && s.iimm != 1)
      return error(s, "a bool constant is 0 or 1");
    if (s.type == DType::kI32 && (s.iimm < INT32_MIN || s.iimm > INT32_MAX))
      return error(s, "constant out of range for i32");
    if (s.type == DType::kU32 && (s.iimm < 0 || s.iimm > UINT32_MAX))
      return error(s, "constant out of range for u32");
    return {};
  }

  // The typing rule of arithmetic and comparisons: the op's `operands` column of ops.def.
  // `numbers` words what a non-bool operand is ("a number" for one, "numbers" for two).
  Status operand_types(const Stmt& s, DType a, const char* numbers) const {
    const OpInfo& info = op_info(s.op);
    const std::string what = "type mismatch: " + std::string(info.name);
    switch (info.operands) {
      case Operands::kAny: return {};
      case Operands::kBool:
        if (a != DType::kBool) return error(s, what + " takes bool, got " + tn(a));
        return {};
      case Operands::kNumber:
      case Operands::kFloat:
      case Operands::kInt:
        if (a == DType::kBool) return error(s, what + " takes " + numbers + ", got bool");
        break;
    }
    if (info.operands == Operands::kInt && !is_int(a))
      return error(s, what + " takes i32 or u32, got " + tn(a));
    if (info.operands == Operands::kFloat && !is_float(a))
      return error(s, what + " takes f32 or f64, got " + tn(a));
    return {};
  }
  Status unary(const Stmt& s) {
    VKAD_TRY(expect_args(s, 1));
    VKAD_ASSIGN_OR_RETURN(DType a, value(s, 0));
    VKAD_TRY(operand_types(s, a, "a number"));
    return result_is(s, a);
  }
  // Binary arithmetic and comparisons: two operands of one type.
  Status binary(const Stmt& s) {
    VKAD_TRY(expect_args(s, 2));
    VKAD_ASSIGN_OR_RETURN(DType a, value(s, 0));
    VKAD_ASSIGN_OR_RETURN(DType b, value(s, 1));
    VKAD_TRY(same(s, a, b));
    VKAD_TRY(operand_types(s, a, "numbers"));
    return result_is(s, op_info(s.op).family == OpFamily::kCompare ? DType::kBool : a);
  }
  Status select(const Stmt& s) {
    VKAD_TRY(expect_args(s, 3));
    VKAD_ASSIGN_OR_RETURN(DType c, value(s, 0));
    if (c != DType::kBool)
      return error(s, "type mismatch: the condition is " + tn(c) + ", expected bool");
    VKAD_ASSIGN_OR_RETURN(DType a, value(s, 1));
    VKAD_ASSIGN_OR_RETURN(DType b, value(s, 2));
    VKAD_TRY(same(s, a, b));
    return result_is(s, a);
  }

  // Returns what the statement's result is (a local for alloca).
  Result<IdKind> local(const Stmt& s) {
    switch (local_op(s.op)) {
      case LocalOp::kAlloca: VKAD_TRY(expect_args(s, 0)); return IdKind::kLocal;
      case LocalOp::kLoadLocal: {
        VKAD_TRY(expect_args(s, 1));
        VKAD_ASSIGN_OR_RETURN(IdInfo l, use(s, s.args[0], IdKind::kLocal));
        VKAD_TRY(result_is(s, l.type));
        return IdKind::kValue;
      }
      case LocalOp::kStoreLocal: {
        VKAD_TRY(holder_and_value(s, IdKind::kLocal, "local").status());
        return IdKind::kValue;
      }
      case LocalOp::kSharedAlloc: return shared_alloc(s);
      case LocalOp::kLoadShared: {
        VKAD_TRY(expect_args(s, 2));
        VKAD_ASSIGN_OR_RETURN(IdInfo a, use(s, s.args[0], IdKind::kShared));
        VKAD_TRY(shared_index(s));
        VKAD_TRY(result_is(s, a.type));
        return IdKind::kValue;
      }
      case LocalOp::kStoreShared: {
        VKAD_TRY(expect_args(s, 3));
        VKAD_ASSIGN_OR_RETURN(IdInfo a, use(s, s.args[0], IdKind::kShared));
        VKAD_TRY(shared_index(s));
        VKAD_ASSIGN_OR_RETURN(DType v, value(s, 2));
        if (v != a.type) {
          return error(
              s, "type mismatch: the shared array holds " + tn(a.type) + ", the value is " + tn(v));
        }
        return IdKind::kValue;
      }
    }
    return IdKind::kValue;
  }
  // A workgroup's shared array: numbers, a positive size, at the top of a task whose
  // workgroups are whole (the barrier's condition), outside any branch or loop.
  Result<IdKind> shared_alloc(const Stmt& s) {
    VKAD_TRY(expect_args(s, 0));
    if (s.type == DType::kBool) return error(s, "a shared array holds numbers, not bool");
    if (s.iimm <= 0 || s.iimm > (int64_t{1} << 24))
      return error(s, "a shared array needs 1 to 2^24 elements, not " + std::to_string(s.iimm));
    if (!whole_workgroups(*task_))
      return error(s, "shared array in a task whose workgroups are not whole " + kWholeGroups);
    if (scopes_.size() != 1 || divergent_ != 0)
      return error(s, "shared array inside a branch or loop (only at the top of the task)");
    return IdKind::kShared;
  }
  Status shared_index(const Stmt& s) {
    VKAD_ASSIGN_OR_RETURN(DType i, value(s, 1));
    if (i != DType::kI32) return error(s, "a shared array's index is i32, not " + tn(i));
    return {};
  }
  // (holder, value): a local or adstack and a value of the type it holds (store_local,
  // stack_push, stack_acc_adj). Returns the holder.
  Result<IdInfo> holder_and_value(const Stmt& s, IdKind kind, const char* holder) {
    VKAD_TRY(expect_args(s, 2));
    VKAD_ASSIGN_OR_RETURN(IdInfo h, use(s, s.args[0], kind));
    VKAD_ASSIGN_OR_RETURN(DType v, value(s, 1));
    if (v != h.type) {
      return error(s, "type mismatch: the " + std::string(holder) + " holds " + tn(h.type) +
                          ", the value is " + tn(v));
    }
    return h;
  }

  Status array(const Stmt& s) {
    switch (array_op(s.op)) {
      case ArrayOp::kLoad:
        VKAD_TRY(array_access(s, s.args.size()));
        return result_is(s, k_.params[s.param].dtype);
      case ArrayOp::kStore:
      case ArrayOp::kAtomicAdd:
      case ArrayOp::kAtomicMax: return array_write(s);
    }
    return {};
  }
  Status array_access(const Stmt& s, size_t n_indices) {
    if (s.param >= k_.params.size())
      return error(s, "parameter " + std::to_string(s.param) + " does not exist");
    const Param& p = k_.params[s.param];
    if (p.kind != ParamKind::kNdArray) {
      if (s.op == Op::kLoad) return error(s, "'" + p.name + "' is a scalar; read it with arg");
      return error(s, "store to scalar parameter '" + p.name + "', which is read-only");
    }
    if (s.op != Op::kLoad && p.read_only) {
      return error(s, "store to ndarray '" + p.name + "', which is declared read-only");
    }
    if (n_indices != p.rank) {
      return error(s, "index rank mismatch: ndarray '" + p.name + "' has rank " +
                          std::to_string(p.rank) + ", got " + std::to_string(n_indices) +
                          " index(es)");
    }
    for (size_t i = 0; i < n_indices; ++i) {
      VKAD_ASSIGN_OR_RETURN(DType t, value(s, i));
      if (t != DType::kI32 && t != DType::kU32) {
        return error(s, "index " + std::to_string(i) + " is " + tn(t) + ", expected i32 or u32");
      }
    }
    return {};
  }
  // store, atomic_add, atomic_max: the value's type is the ndarray's, and the device has the
  // atomic.
  Status array_write(const Stmt& s) {
    if (s.args.empty()) return error(s, std::string(op_info(s.op).name) + " needs a value");
    VKAD_TRY(array_access(s, s.args.size() - 1));
    VKAD_ASSIGN_OR_RETURN(DType v, value(s, s.args.size() - 1));
    DType e = k_.params[s.param].dtype;
    if (v != e)
      return error(s, "type mismatch: ndarray '" + k_.params[s.param].name + "' holds " + tn(e) +
                          ", the value is " + tn(v));
    if (s.op == Op::kAtomicMax && e != DType::kI32 && e != DType::kU32) {
      return error(s, "atomic_max on a " + tn(e) + " ndarray (i32 or u32 only)");
    }
    if (s.op == Op::kAtomicAdd) return atomic_add_supported(s, e);
    return {};
  }
  Status atomic_add_supported(const Stmt& s, DType e) const {
    if (e == DType::kBool) return error(s, "atomic_add on a bool ndarray");
    if (e == DType::kI64 && !target_.atomic_int64) {
      return error(
          s,
          "atomic_add on i64 needs shaderBufferInt64Atomics; " + target_.device_name + " lacks it",
          ErrorCode::kUnsupported);
    }
    if (e == DType::kF64 && !target_.atomic_float64_add && !target_.atomic_int64) {
      return error(s,
                   "atomic_add on f64 needs shaderBufferFloat64AtomicAdd or "
                   "shaderBufferInt64Atomics; " +
                       target_.device_name + " has neither",
                   ErrorCode::kUnsupported);
    }
    return {};
  }

  // print "fmt", %v... / assert "message", %cond, %v...: values of any type, at most
  // abi::kMaxPrintValues of them (a record's size is fixed per statement).
  Status debug_output(const Stmt& s) {
    const bool is_assert = s.op == Op::kAssert;
    if (is_assert && s.args.empty()) return error(s, "assert needs its condition (a bool)");
    const size_t values = s.args.size() - (is_assert ? 1 : 0);
    if (values > abi::kMaxPrintValues) {
      return error(s, std::string(op_info(s.op).name) + " records at most " +
                          std::to_string(abi::kMaxPrintValues) + " values, got " +
                          std::to_string(values));
    }
    for (size_t i = 0; i < s.args.size(); ++i) {
      VKAD_ASSIGN_OR_RETURN(DType t, value(s, i));
      if (is_assert && i == 0 && t != DType::kBool)
        return error(s, std::string("assert's condition is a bool, got ") + abi::dtype_name(t));
    }
    return {};
  }
  Status barrier(const Stmt& s) const {
    VKAD_TRY(expect_args(s, 0));
    if (!whole_workgroups(*task_))
      return error(s, "barrier in a task whose workgroups are not whole " + kWholeGroups);
    if (divergent_ != 0) {
      return error(s,
                   "barrier where invocations may diverge (inside if / while, or a "
                   "for loop whose bounds are not launch-uniform or whose body breaks "
                   "or continues)");
    }
    return {};
  }

  // Returns what the statement's result is (an adstack for stack_alloc).
  Result<IdKind> stack(const Stmt& s) {
    switch (stack_op(s.op)) {
      case StackOp::kStackAlloc:
        VKAD_TRY(expect_args(s, 0));
        if (s.type == DType::kBool) return error(s, "an adstack holds numbers, not bool");
        // The integer heap has 32-bit elements.
        if (s.type == DType::kI64)
          return error(s, "an adstack holds f32, f64, i32 or u32, not i64",
                       ErrorCode::kUnsupported);
        return IdKind::kStack;
      case StackOp::kStackPush:
      case StackOp::kStackAccAdj: VKAD_TRY(stack_write(s)); return IdKind::kValue;
      case StackOp::kStackPop:
      case StackOp::kStackTop:
      case StackOp::kStackTopAdj: VKAD_TRY(stack_read(s)); return IdKind::kValue;
    }
    return IdKind::kValue;
  }
  // stack_push, stack_acc_adj: (stack, value of its element type)
  Status stack_write(const Stmt& s) {
    VKAD_ASSIGN_OR_RETURN(IdInfo st, holder_and_value(s, IdKind::kStack, "adstack"));
    if (s.op == Op::kStackAccAdj && !is_float(st.type))
      return error(s, "an integer adstack has no adjoint");
    return {};
  }
  // stack_pop, stack_top, stack_top_adj: (stack)
  Status stack_read(const Stmt& s) {
    VKAD_TRY(expect_args(s, 1));
    VKAD_ASSIGN_OR_RETURN(IdInfo st, use(s, s.args[0], IdKind::kStack));
    if (s.op != Op::kStackPop) VKAD_TRY(result_is(s, st.type));
    if (s.op == Op::kStackTopAdj && !is_float(st.type))
      return error(s, "an integer adstack has no adjoint");
    return {};
  }
};

// The walk: tasks in order, each a scope holding its indices; blocks and their statements;
// for / while / if, which open scopes, count loop depth and divergence, and define their
// index where their body sees it.
class Verifier : public OpChecks {
 public:
  Verifier(const Kernel& k, const Target& t) : OpChecks(k, t) {}

  Status run() {
    VKAD_TRY(check_nesting(k_));
    if (k_.name.empty()) return kernel_error("the kernel has no name");
    for (size_t i = 0; i < k_.params.size(); ++i) VKAD_TRY(check_param(i));
    if (k_.tasks.empty()) return kernel_error("the kernel has no tasks");
    std::unordered_set<std::string> task_names;
    for (const Task& t : k_.tasks) {
      task_ = &t;
      if (!task_names.insert(t.name).second)
        return task_error("two tasks are called '" + t.name + "'");
      if (t.dims.empty()) {
        VKAD_TRY(check_bound(t.begin, "begin"));
        VKAD_TRY(check_bound(t.end, "end"));
      } else {
        VKAD_TRY(check_dims(t));
      }
      if (t.local_size > target_.max_local_size) {
        return task_error("local size " + std::to_string(t.local_size) + " exceeds the device's " +
                          std::to_string(target_.max_local_size));
      }
      if (t.index == kNoValue) return task_error("the task has no index value");
      std::vector<ValueId> indices = task_indices(t);
      scopes_.emplace_back();
      for (ValueId ix : indices) {
        if (ix == kNoValue) return task_error("the task has no index value");
        VKAD_TRY(define(ix, {IdKind::kValue, DType::kI32, nullptr}, nullptr));
      }
      VKAD_TRY(block(t.body));
      scopes_.pop_back();
    }
    return {};
  }

 private:
  void collect(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.result != kNoValue) all_defs_.insert(s.result);
      for (const Block& c : s.blocks) collect(c);
    }
  }

  Status block(const Block& b) {
    if (all_defs_.empty()) {
      for (const Task& t : k_.tasks) collect(t.body);
    }
    for (const Stmt& s : b.stmts) {
      if ((s.op == Op::kBreak || s.op == Op::kContinue) && &s != &b.stmts.back()) {
        return error(s,
                     std::string(op_info(s.op).name) +
                         " must be the last statement of its block (what follows it never runs)");
      }
      VKAD_TRY(stmt(s));
    }
    return {};
  }

  Status stmt(const Stmt& s) {
    const OpInfo& info = op_info(s.op);
    VKAD_TRY(check_form(s));
    IdKind kind = IdKind::kValue;
    switch (info.family) {
      case OpFamily::kLeaf: VKAD_TRY(leaf(s)); break;
      case OpFamily::kUnary: VKAD_TRY(unary(s)); break;
      case OpFamily::kBinary:
      case OpFamily::kCompare: VKAD_TRY(binary(s)); break;
      case OpFamily::kSelect: VKAD_TRY(select(s)); break;
      case OpFamily::kCast:
        VKAD_TRY(expect_args(s, 1));
        VKAD_TRY(value(s, 0).status());
        break;
      case OpFamily::kLocal: {
        VKAD_ASSIGN_OR_RETURN(kind, local(s));
        break;
      }
      case OpFamily::kArray: VKAD_TRY(array(s)); break;
      case OpFamily::kStack: {
        VKAD_ASSIGN_OR_RETURN(kind, stack(s));
        break;
      }
      // Loops define their index in their body's scope, not the enclosing one.
      case OpFamily::kControl: return control(s);
    }
    if (info.has_result) VKAD_TRY(define(s.result, {kind, s.type, &s}, &s));
    note_uniform(s);
    return {};
  }

  Status control(const Stmt& s) {
    switch (control_op(s.op)) {
      case ControlOp::kFor: return for_loop(s);
      case ControlOp::kIf: return branch(s);
      case ControlOp::kWhile: return while_loop(s);
      case ControlOp::kBreak:
      case ControlOp::kContinue:
        VKAD_TRY(expect_args(s, 0));
        if (loop_depth_ == 0)
          return error(s, std::string(op_info(s.op).name) + " outside a for or while loop body");
        return {};
      case ControlOp::kBarrier: return barrier(s);
      case ControlOp::kPrint:
      case ControlOp::kAssert: return debug_output(s);
    }
    return {};
  }
  Status for_loop(const Stmt& s) {
    VKAD_TRY(expect_args(s, 2));
    VKAD_ASSIGN_OR_RETURN(DType b, value(s, 0));
    VKAD_ASSIGN_OR_RETURN(DType e, value(s, 1));
    if (b != DType::kI32 || e != DType::kI32)
      return error(s,
                   "type mismatch: loop bounds are " + tn(b) + " and " + tn(e) + ", expected i32");
    VKAD_TRY(result_is(s, DType::kI32));
    VKAD_TRY(define(s.result, {IdKind::kValue, DType::kI32, &s}, &s));
    // The index belongs to the body's scope, not the enclosing one.
    scopes_.back().erase(s.result);
    scopes_.push_back({s.result});
    // Every invocation runs the loop's iterations alike when its bounds are
    // launch-uniform and nothing leaves an iteration early: a barrier may sit inside.
    const bool alike = uniform_.count(s.args[0]) && uniform_.count(s.args[1]) &&
                       !contains_op(s.blocks[0], Op::kBreak) &&
                       !contains_op(s.blocks[0], Op::kContinue);
    if (alike) uniform_.insert(s.result);
    divergent_ += alike ? 0 : 1;
    ++loop_depth_;
    VKAD_TRY(block(s.blocks[0]));
    --loop_depth_;
    divergent_ -= alike ? 0 : 1;
    scopes_.pop_back();
    return {};
  }
  Status while_loop(const Stmt& s) {
    VKAD_TRY(expect_args(s, 1));
    VKAD_TRY(result_is(s, DType::kI32));
    VKAD_TRY(define(s.result, {IdKind::kValue, DType::kI32, &s}, &s));
    scopes_.back().erase(s.result);
    // The test only decides (ir.h): reverse mode replays it in the forward sweeps and
    // never reverses it, which is right only while it changes nothing.
    for (const Stmt& t : s.blocks[0].stmts) {
      if (!allowed_in_while_test(t.op)) {
        return error(t, std::string("a while loop's test may compute and read, not ") +
                            op_info(t.op).name + " (move it into the body or before the loop)");
      }
    }
    scopes_.push_back({s.result});  // the index is visible in the test and the body
    VKAD_TRY(block(s.blocks[0]));
    if (!scopes_.back().count(s.args[0])) {
      return error(s, "the test value %" + std::to_string(s.args[0]) +
                          " must be defined in the loop's test block");
    }
    VKAD_ASSIGN_OR_RETURN(DType c, value(s, 0));
    if (c != DType::kBool)
      return error(s, "type mismatch: the test is " + tn(c) + ", expected bool");
    scopes_.pop_back();
    scopes_.push_back({s.result});
    ++loop_depth_;
    ++divergent_;
    VKAD_TRY(block(s.blocks[1]));
    --divergent_;
    --loop_depth_;
    scopes_.pop_back();
    return {};
  }
  // A while test computes and reads: values, loads of locals and ndarrays; nothing that
  // writes, allocates or moves control.
  static bool allowed_in_while_test(Op op) {
    return is_pure_value(op) || op == Op::kLoadLocal || op == Op::kLoad;
  }
  Status branch(const Stmt& s) {
    VKAD_TRY(expect_args(s, 1));
    VKAD_ASSIGN_OR_RETURN(DType c, value(s, 0));
    if (c != DType::kBool)
      return error(s, "type mismatch: the condition is " + tn(c) + ", expected bool");
    ++divergent_;
    for (const Block& b : s.blocks) {
      scopes_.emplace_back();
      VKAD_TRY(block(b));
      scopes_.pop_back();
    }
    --divergent_;
    return {};
  }
};

// Depth of `e`, counting up to `limit + 1` at most (so a pathological expression costs
// bounded stack).
uint32_t size_depth(const SizeExpr& e, uint32_t limit) {
  if (limit == 0) return 1;
  uint32_t d = 0;
  for (const SizeExpr& o : e.operands) d = std::max(d, size_depth(o, limit - 1));
  return d + 1;
}

}  // namespace

Status check_nesting(const Kernel& k) {
  for (const Task& t : k.tasks) {
    std::string where = "kernel '" + k.name + "', task '" + t.name + "'";
    for (const TaskDim& d : t.dims) {
      if (size_depth(d.begin, kMaxNestingDepth) > kMaxNestingDepth ||
          size_depth(d.end, kMaxNestingDepth) > kMaxNestingDepth) {
        return make_error(ErrorCode::kInvalidArgument,
                          where + ": a range bound nests add/mul/max deeper than " +
                              std::to_string(kMaxNestingDepth) + " (kMaxNestingDepth)");
      }
    }
    // Explicit stack of (block, depth of its statements): no recursion over the tree.
    std::vector<std::pair<const Block*, uint32_t>> todo = {{&t.body, 0}};
    while (!todo.empty()) {
      auto [b, depth] = todo.back();
      todo.pop_back();
      for (const Stmt& s : b->stmts) {
        if ((s.has_cap || s.op == Op::kStackAlloc) &&
            size_depth(s.cap, kMaxNestingDepth) > kMaxNestingDepth) {
          return make_error(ErrorCode::kInvalidArgument,
                            where + ": a " + op_info(s.op).name +
                                " size expression nests add/mul/max deeper than " +
                                std::to_string(kMaxNestingDepth) + " (kMaxNestingDepth)");
        }
        if (s.blocks.empty()) continue;
        if (depth + 1 > kMaxNestingDepth) {
          return make_error(ErrorCode::kInvalidArgument,
                            where + ", statement `" + print_stmt(k, s) +
                                "`: for / if bodies nest deeper than " +
                                std::to_string(kMaxNestingDepth) + " (kMaxNestingDepth)");
        }
        for (const Block& c : s.blocks) todo.push_back({&c, depth + 1});
      }
    }
  }
  return {};
}

Status verify(const Kernel& k, const Target& target) {
  Verifier v(k, target);
  return v.run();
}

}  // namespace vkad::codegen
