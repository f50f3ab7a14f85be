#include "autodiff/in_place.h"

#include <string>
#include <unordered_set>

#include "autodiff/reverse_mode.h"
#include "ir/walk.h"

namespace vkad::codegen {

namespace {

// What one task does with one array: program positions of its loads and stores, and whether a
// loop holds both.
struct Uses {
  int64_t last_load = -1, first_store = -1;
  bool atomic = false, loop_holds_both = false, any = false;
};

void scan(const Block& b, uint32_t p, int64_t* pos, Uses* u) {
  for (const Stmt& s : b.stmts) {
    ++*pos;
    if (is_array_access(s) && s.param == p) {
      u->any = true;
      if (s.op == Op::kLoad) u->last_load = *pos;
      if (s.op == Op::kStore && u->first_store < 0) u->first_store = *pos;
      if (s.op == Op::kAtomicAdd || s.op == Op::kAtomicMax) u->atomic = true;
    }
    if ((s.op == Op::kFor || s.op == Op::kWhile) && accesses_param(s, p)) {
      Uses inner;
      int64_t ipos = 0;
      for (const Block& c : s.blocks) scan(c, p, &ipos, &inner);
      u->loop_holds_both = u->loop_holds_both || (inner.last_load >= 0 && inner.first_store >= 0);
    }
    for (const Block& c : s.blocks) scan(c, p, pos, u);
  }
}

bool one_iteration(const Task& t) {
  if (!t.dims.empty()) {
    for (const TaskDim& d : t.dims) {
      if (d.begin.kind != SizeExpr::Kind::kConst || d.end.kind != SizeExpr::Kind::kConst ||
          d.end.value - d.begin.value != 1) {
        return false;
      }
    }
    return true;
  }
  return t.begin.kind == RangeBound::Kind::kConstant && t.end.kind == RangeBound::Kind::kConstant &&
         t.end.value - t.begin.value == 1;
}

// Whether every access of `p` in the parallel task `t` indexes its leading axes by exactly the
// task's own indices, in order, and the rest by constants (a vector's or matrix's components,
// x[i, 0, 1]): each invocation then touches only its own row. owned_ndarrays asks for the task
// indices alone; this is the split's wider case (taichi's and warp's arrays of matrices).
bool owns_rows(const Task& t, uint32_t p) {
  std::unordered_set<ValueId> constants;
  for_each_stmt(t.body, [&](const Stmt& s) {
    if (s.op == Op::kConst) constants.insert(s.result);
  });
  const std::vector<ValueId> own = task_indices(t);
  bool ok = true;
  for_each_stmt(t.body, [&](const Stmt& s) {
    if (!ok || !is_array_access(s) || s.param != p) return;
    // A load's operands are its indices; a store's and an atomic's end with the value.
    const size_t n = s.op == Op::kLoad ? s.args.size() : s.args.size() - 1;
    if (n < own.size()) {
      ok = false;
      return;
    }
    for (size_t d = 0; d < n; ++d) {
      ok = ok && (d < own.size() ? s.args[d] == own[d] : constants.count(s.args[d]) != 0);
    }
  });
  return ok;
}

// Whether parameter `p` of `k` qualifies (in_place.h).
bool qualifies(const Kernel& k, uint32_t p) {
  const Task* holder = nullptr;
  Uses u;
  for (const Task& t : k.tasks) {
    Uses here;
    int64_t pos = 0;
    scan(t.body, p, &pos, &here);
    if (!here.any) continue;
    if (holder) return false;  // accessed in two tasks
    holder = &t;
    u = here;
  }
  if (!holder || u.atomic || u.loop_holds_both || u.last_load < 0 || u.first_store < 0) {
    return false;
  }
  if (u.last_load > u.first_store) return false;
  if (one_iteration(*holder)) return true;
  return !holder->serial && (owned_ndarrays(k, *holder)[p] || owns_rows(*holder, p));
}

void move_loads(Block& b, uint32_t from, uint32_t to) {
  for (Stmt& s : b.stmts) {
    if (s.op == Op::kLoad && s.param == from) s.param = to;
    for (Block& c : s.blocks) move_loads(c, from, to);
  }
}

}  // namespace

InPlaceSplit split_in_place(const Kernel& forward) {
  InPlaceSplit out;
  Kernel k = forward;
  for (uint32_t p = 0; p < forward.params.size(); ++p) {
    const Param& fp = forward.params[p];
    if (fp.kind != ParamKind::kNdArray || !fp.needs_grad || !qualifies(forward, p)) continue;
    Param before = fp;
    before.read_only = true;
    before.name = fp.name + "_before";
    auto taken = [&](const std::string& name) {
      for (const Param& q : k.params) {
        if (q.name == name) return true;
      }
      return false;
    };
    for (int n = 1; taken(before.name); ++n) before.name = fp.name + "_before_" + std::to_string(n);
    const auto index = static_cast<uint32_t>(k.params.size());
    k.params.push_back(before);
    for (Task& t : k.tasks) move_loads(t.body, p, index);
    out.arrays.push_back({p, index});
  }
  if (!out.arrays.empty()) out.kernel = std::move(k);
  return out;
}

namespace {

void move_param(Block& b, uint32_t from, uint32_t to) {
  for (Stmt& s : b.stmts) {
    if (is_array_access(s) && s.param == from) s.param = to;
    for (Block& c : s.blocks) move_param(c, from, to);
  }
}

}  // namespace

Status merge_copy_gradients(const InPlaceSplit& split, Kernel* adjoint) {
  const Kernel& f = split.kernel;
  std::vector<uint32_t> grad_of(f.params.size(), UINT32_MAX);
  auto next = static_cast<uint32_t>(f.params.size());
  for (uint32_t q = 0; q < f.params.size(); ++q) {
    if (f.params[q].needs_grad) grad_of[q] = next++;
  }
  const size_t keep = adjoint->params.size() - split.arrays.size();
  for (const InPlaceParam& a : split.arrays) {
    const uint32_t from = grad_of[a.before], to = grad_of[a.param];
    if (from == UINT32_MAX || to == UINT32_MAX || from < keep || from >= adjoint->params.size()) {
      return make_error(ErrorCode::kInternal,
                        "the adjoint of '" + f.name + "' does not end with the gradients of the " +
                            "copies of its arrays updated in place (a bug in vkad; please report "
                            "it with the kernel's text)");
    }
    for (Task& t : adjoint->tasks) move_param(t.body, from, to);
  }
  adjoint->params.resize(keep);
  return {};
}

}  // namespace vkad::codegen
