#include "autodiff/forward_mode.h"

#include <unordered_map>

#include "autodiff/derivative_rules.h"
#include "ir/pass.h"
#include "ir/rewriter.h"
#include "ir/verifier.h"

namespace vkad::codegen {

namespace {

class ForwardMode : public PartialBuilder {
 public:
  explicit ForwardMode(const Kernel& f) : f_(f) {}

  Result<Kernel> run(const Target& target) {
    VKAD_TRY(verify(f_, target));
    k_.name = f_.name + "_jvp";
    k_.params = f_.params;
    k_.next_id = f_.next_id;  // forward ids are kept; new ones come after them
    dot_.assign(f_.params.size(), UINT32_MAX);
    for (uint32_t p = 0; p < f_.params.size(); ++p) {
      k_.params[p].needs_grad = false;
      if (!f_.params[p].needs_grad) continue;
      Param d = f_.params[p];
      d.name += "_dot";
      d.needs_grad = false;
      d.read_only = false;
      dot_[p] = static_cast<uint32_t>(k_.params.size());
      k_.params.push_back(std::move(d));
    }
    for (const Task& t : f_.tasks) {
      Task jt = t;
      jt.body.stmts.clear();
      tan_.clear();
      rw_.in(jt.body, [&] { block(t.body); });
      k_.tasks.push_back(std::move(jt));
    }
    VKAD_TRY(verify_output(k_, target,
                           "the JVP of kernel '" + f_.name + "' needs what the device lacks",
                           "forward mode of kernel '" + f_.name +
                               "' produced a kernel that does not verify (a bug in vkad)"));
    return std::move(k_);
  }

  // PartialBuilder: what the derivative rules emit into the JVP.
  ValueId op(Op o, DType t, std::vector<ValueId> args) override {
    return rw_.op(o, t, std::move(args));
  }
  ValueId constant(DType t, double v) override { return rw_.constant(t, v); }

 private:
  ValueId tangent(ValueId v) const {
    auto it = tan_.find(v);
    return it == tan_.end() ? kNoValue : it->second;
  }
  ValueId tangent_or_zero(ValueId v, DType t) {
    ValueId d = tangent(v);
    return d != kNoValue ? d : constant(t, 0);
  }
  // The tangent of `s`'s result from the rule table: the sum of each partial seeded with its
  // operand's tangent (operands without one contribute nothing).
  ValueId from_rules(const Stmt& s, const std::unordered_map<ValueId, DType>& types) {
    const DerivativeRule* rule = derivative_rule(s.op);
    if (!rule) return kNoValue;
    PartialArgs a{};
    a.type = s.type;
    a.result = s.result;
    for (size_t k = 0; k < s.args.size() && k < 3; ++k) {
      a.arg[k] = s.args[k];
      auto it = types.find(s.args[k]);
      a.arg_type[k] = it == types.end() ? s.type : it->second;
    }
    ValueId sum = kNoValue;
    for (size_t k = 0; k < s.args.size() && k < 3; ++k) {
      ValueId d = tangent(s.args[k]);
      if (d == kNoValue || !rule->partial[k].emit) continue;
      a.g = d;
      ValueId part = rule->partial[k].emit(*this, a);
      sum = sum == kNoValue ? part : op(Op::kAdd, s.type, {sum, part});
    }
    return sum;
  }

  void block(const Block& b) {
    for (const Stmt& s : b.stmts) stmt(s);
  }

  void stmt(const Stmt& s) {
    LocationScope at(rw_, s.loc);
    if (s.result != kNoValue) types_[s.result] = s.type;
    // The primal statement, with its blocks rebuilt (tangents interleave with the bodies).
    Stmt copy = s;
    for (Block& c : copy.blocks) c.stmts.clear();
    rw_.insert(std::move(copy));
    if (!s.blocks.empty()) {
      Stmt& built = rw_.block().stmts.back();  // stable: the loop fills its own blocks
      for (size_t i = 0; i < s.blocks.size(); ++i) {
        rw_.in(built.blocks[i], [&] { block(s.blocks[i]); });
      }
      return;
    }
    switch (op_info(s.op).family) {
      case OpFamily::kLeaf:
        if (s.op == Op::kArg) return arg_tangent(s);
        return rule_tangent(s);
      case OpFamily::kCast: return cast_tangent(s);
      case OpFamily::kLocal: return local_tangent(s);
      case OpFamily::kArray: return array_tangent(s);
      // Differentiable ops by their derivative rule; the rest (comparisons, control flow,
      // adstacks) have no rule and so no tangent.
      case OpFamily::kUnary:
      case OpFamily::kBinary:
      case OpFamily::kCompare:
      case OpFamily::kSelect:
      case OpFamily::kControl:
      case OpFamily::kStack: return rule_tangent(s);
    }
  }
  void rule_tangent(const Stmt& s) {
    if (s.result == kNoValue || !is_float(s.type)) return;
    if (ValueId d = from_rules(s, types_); d != kNoValue) tan_[s.result] = d;
  }
  // A scalar parameter's tangent is its tangent parameter.
  void arg_tangent(const Stmt& s) {
    if (dot_[s.param] == UINT32_MAX) return;
    tan_[s.result] = rw_.arg(s.type, dot_[s.param]);
  }
  // Only float -> float carries a tangent (an integer or bool has none).
  void cast_tangent(const Stmt& s) {
    ValueId d = tangent(s.args[0]);
    if (d == kNoValue || !is_float(s.type)) return;
    tan_[s.result] = types_.at(s.args[0]) == s.type ? d : op(Op::kCast, s.type, {d});
  }
  // A float local has a tangent local, loaded and stored alongside it.
  void local_tangent(const Stmt& s) {
    switch (local_op(s.op)) {
      case LocalOp::kAlloca:
        if (is_float(s.type)) tan_[s.result] = op(Op::kAlloca, s.type, {});  // zero
        return;
      case LocalOp::kLoadLocal: {
        ValueId tl = tangent(s.args[0]);
        if (tl != kNoValue) tan_[s.result] = op(Op::kLoadLocal, s.type, {tl});
        return;
      }
      case LocalOp::kStoreLocal: {
        ValueId tl = tangent(s.args[0]);
        if (tl == kNoValue) return;
        rw_.store_local(tl, tangent_or_zero(s.args[1], types_.at(s.args[1])));
        return;
      }
      case LocalOp::kSharedAlloc:  // make_jvp refuses shared arrays
      case LocalOp::kLoadShared:
      case LocalOp::kStoreShared: return;
    }
  }
  // An ndarray with a tangent array: loads read it at the same indices, stores and atomic adds
  // write the value's tangent there.
  void array_tangent(const Stmt& s) {
    const uint32_t dp = dot_[s.param];
    if (dp == UINT32_MAX) return;
    switch (array_op(s.op)) {
      case ArrayOp::kLoad: {
        Stmt d = s;
        d.param = dp;
        tan_[s.result] = rw_.emit(std::move(d));
        return;
      }
      case ArrayOp::kStore:
      case ArrayOp::kAtomicAdd: {
        ValueId d = tangent(s.args.back());
        if (d == kNoValue && s.op == Op::kAtomicAdd) return;  // adds zero
        Stmt st = s;
        st.param = dp;
        st.args.back() = d != kNoValue ? d : constant(f_.params[s.param].dtype, 0);
        rw_.emit(std::move(st));
        return;
      }
      case ArrayOp::kAtomicMax: return;  // integers only: no tangent
    }
  }

  const Kernel& f_;
  Kernel k_;
  Rewriter rw_{k_};            // writes k_'s tasks
  std::vector<uint32_t> dot_;  // forward param -> its tangent param (UINT32_MAX: none)
  std::unordered_map<ValueId, ValueId> tan_;  // forward value or local -> its tangent
  std::unordered_map<ValueId, DType> types_;
};

}  // namespace

Result<Kernel> make_jvp(const Kernel& forward, const Target& target) {
  for (const Task& t : forward.tasks) {
    if (contains_op(t.body, Op::kSharedAlloc)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "make_jvp '" + forward.name + "', task '" + t.name +
                            "': shared arrays cannot be differentiated");
    }
  }
  ForwardMode fm(forward);
  return fm.run(target);
}

}  // namespace vkad::codegen
