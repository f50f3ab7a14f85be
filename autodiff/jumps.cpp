#include "autodiff/jumps.h"

#include <utility>

#include "ir/rewriter.h"
#include "ir/verifier.h"

namespace vkad::codegen {

namespace {

bool is_jump(const Stmt& s) { return s.op == Op::kBreak || s.op == Op::kContinue; }

// Whether `b` holds a jump to the loop whose body it is (through branches, not inner loops).
bool jumps_in(const Block& b, Op which) {
  for (const Stmt& s : b.stmts) {
    if (s.op == which) return true;
    if (s.op == Op::kIf) {
      for (const Block& c : s.blocks) {
        if (jumps_in(c, which)) return true;
      }
    }
  }
  return false;
}
bool any_jump(const Block& b) { return jumps_in(b, Op::kBreak) || jumps_in(b, Op::kContinue); }

class Lowerer {
 public:
  explicit Lowerer(Kernel& k) : rw_(k) {}

  void block(Block& b) {
    std::vector<Stmt> out;
    for (Stmt& s : b.stmts) {
      if (s.op == Op::kFor || s.op == Op::kWhile) {
        loop(s, out);
        continue;
      }
      for (Block& c : s.blocks) block(c);
      out.push_back(std::move(s));
    }
    b.stmts = std::move(out);
  }

 private:
  Stmt mk(Op op, DType t, std::vector<ValueId> args) { return rw_.make(op, t, std::move(args)); }
  // Appends `store_local local, true` to out.
  void set_true(ValueId local, std::vector<Stmt>& out) {
    ValueId v = Rewriter::append(out, rw_.make_const(DType::kBool, 1));
    out.push_back(mk(Op::kStoreLocal, DType::kF32, {local, v}));
  }
  // Appends `%n = not (load_local local)` to out; returns %n.
  ValueId not_local(ValueId local, std::vector<Stmt>& out) {
    ValueId lv = Rewriter::append(out, mk(Op::kLoadLocal, DType::kBool, {local}));
    return Rewriter::append(out, mk(Op::kNot, DType::kBool, {lv}));
  }
  // Appends `if cond { then }` to out.
  void guarded(ValueId cond, Block then, std::vector<Stmt>& out) {
    Stmt br = rw_.make_if(cond);
    br.blocks[0] = std::move(then);
    out.push_back(std::move(br));
  }

  void loop(Stmt& s, std::vector<Stmt>& out) {
    Block& body = s.blocks[s.op == Op::kFor ? 0 : 1];
    block(body);  // inner loops first: what jumps remain in `body` are this loop's
    bool brk = jumps_in(body, Op::kBreak);
    if (!brk && !jumps_in(body, Op::kContinue)) {
      out.push_back(std::move(s));
      return;
    }
    ValueId broke = kNoValue;
    if (brk) {
      Stmt a = mk(Op::kAlloca, DType::kBool, {});
      broke = a.result;
      out.push_back(std::move(a));
    }
    Stmt skip_alloca = mk(Op::kAlloca, DType::kBool, {});
    ValueId skip = skip_alloca.result;
    guard(body, skip, broke);
    Block nb;
    nb.stmts.push_back(std::move(skip_alloca));
    if (brk && s.op == Op::kFor) {
      ValueId go = not_local(broke, nb.stmts);
      guarded(go, std::move(body), nb.stmts);
    } else {
      for (Stmt& x : body.stmts) nb.stmts.push_back(std::move(x));
    }
    body = std::move(nb);
    if (brk && s.op == Op::kWhile) {
      std::vector<Stmt>& test = s.blocks[0].stmts;
      ValueId go = not_local(broke, test);
      Stmt both = mk(Op::kAnd, DType::kBool, {s.args[0], go});
      s.args[0] = both.result;
      test.push_back(std::move(both));
    }
    out.push_back(std::move(s));
  }

  // Rewrites the jumps of `b` (a body of the loop being lowered, or a branch side in it) into
  // flag stores, and runs what follows a statement that may set `skip` under `if (!skip)`.
  void guard(Block& b, ValueId skip, ValueId broke) {
    std::vector<Stmt> out;
    for (size_t i = 0; i < b.stmts.size(); ++i) {
      Stmt& s = b.stmts[i];
      if (is_jump(s)) {  // the last statement of its block (verifier)
        if (s.op == Op::kBreak) set_true(broke, out);
        set_true(skip, out);
        break;
      }
      bool sets = s.op == Op::kIf && any_jump(s);
      if (s.op == Op::kIf) {
        for (Block& c : s.blocks) guard(c, skip, broke);
      }
      out.push_back(std::move(s));
      if (sets && i + 1 < b.stmts.size()) {
        Block rest;
        for (size_t j = i + 1; j < b.stmts.size(); ++j) rest.stmts.push_back(std::move(b.stmts[j]));
        guard(rest, skip, broke);
        ValueId go = not_local(skip, out);
        guarded(go, std::move(rest), out);
        break;
      }
    }
    b.stmts = std::move(out);
  }
  bool any_jump(const Stmt& s) const {
    for (const Block& c : s.blocks) {
      if (codegen::any_jump(c)) return true;
    }
    return false;
  }

  Rewriter rw_;  // ids from the kernel being lowered
};

}  // namespace

// With an explicit stack: make_adjoint asks this before the kernel is verified, so a kernel
// nested far past kMaxNestingDepth (built in memory) must not overflow the call stack here.
bool has_jumps(const Kernel& k) {
  std::vector<const Block*> work;
  for (const Task& t : k.tasks) work.push_back(&t.body);
  while (!work.empty()) {
    const Block* b = work.back();
    work.pop_back();
    for (const Stmt& s : b->stmts) {
      if (is_jump(s)) return true;
      for (const Block& c : s.blocks) work.push_back(&c);
    }
  }
  return false;
}

Kernel lower_jumps(Kernel k) {
  Lowerer l(k);
  for (Task& t : k.tasks) l.block(t.body);
  return k;
}

Pass lower_jumps_pass(const Target& target) {
  return {"lower-jumps", [target](Kernel k) -> Result<Kernel> {
            if (!has_jumps(k)) return k;
            Kernel lowered = lower_jumps(std::move(k));
            VKAD_TRY(verify(lowered, target));
            return lowered;
          }};
}

}  // namespace vkad::codegen
