// The one way passes make statements: fresh result ids from the kernel being written, typed
// results, blocks for control flow, and insertion at the end of a block.
//
// Two ways to use it, often mixed:
//   - makers (`make*`) return a statement with a fresh result id (where its op has one) and
//     insert nothing: for passes that assemble statement lists themselves (jumps.cpp,
//     checkpoint.cpp); `append(out, s)` then adds one to a list and returns its id;
//   - emitters (`op`, `constant`, `for_`, `if_`, ...) append at the insertion point, the end of
//     the innermost block entered with `in(block, f)`: for passes that write a kernel
//     statement by statement (reverse mode, the KernelBuilder). `emit(s)` appends a copy of a
//     statement of another kernel with a fresh result id (its operands are the caller's to map).
//
// A Rewriter borrows the kernel whose ids it hands out (`Kernel::fresh`) and the blocks it
// inserts into: both must outlive it, and a block must not move (no push into the vector that
// holds its statement) while it is the insertion point.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ir/ir.h"

namespace vkad::codegen {

class Rewriter {
 public:
  explicit Rewriter(Kernel& k) : k_(k) {}

  Kernel& kernel() { return k_; }

  // The source location (Stmt::loc) stamped on every statement made from now on; a statement
  // copied with `emit` keeps its own. Passes set it to the location of the statement whose
  // replacement, adjoint or replay they write (LocationScope).
  uint32_t location() const { return loc_; }
  void set_location(uint32_t loc) { loc_ = loc; }

  // ---- makers
  Stmt make(Op op, DType type, std::vector<ValueId> args = {}) {
    Stmt s;
    s.op = op;
    s.type = type;
    s.args = std::move(args);
    if (op_info(op).has_result) s.result = k_.fresh();
    s.loc = loc_;
    return s;
  }
  // A constant of `type`: a float holds `v` (an f32 rounded to float); an integer or bool
  // holds it truncated toward zero (iimm), with fimm = v as the text parser sets it.
  Stmt make_const(DType type, double v) {
    Stmt s = make(Op::kConst, type);
    if (is_float(type)) {
      s.fimm = type == DType::kF32 ? static_cast<float>(v) : v;
    } else {
      s.iimm = static_cast<int64_t>(v);
      s.fimm = v;
    }
    return s;
  }
  // An integer or bool constant holding `v` exactly (make_const goes through a double).
  Stmt make_int(DType type, int64_t v) {
    Stmt s = make(Op::kConst, type);
    s.iimm = v;
    s.fimm = static_cast<double>(v);
    return s;
  }
  // `for %i in [b, e) [max_trip(cap)] { }`: i32, one empty body block.
  Stmt make_for(ValueId b, ValueId e, std::optional<SizeExpr> cap = std::nullopt) {
    Stmt s = make(Op::kFor, DType::kI32, {b, e});
    if (cap) {
      s.has_cap = true;
      s.cap = std::move(*cap);
    }
    s.blocks.resize(1);
    return s;
  }
  // `if cond { } else { }`.
  Stmt make_if(ValueId cond) {
    Stmt s = make(Op::kIf, DType::kBool, {cond});
    s.blocks.resize(2);
    return s;
  }
  // Appends `s` (as it is) to `out`; its result id.
  static ValueId append(std::vector<Stmt>& out, Stmt s) {
    out.push_back(std::move(s));
    return out.back().result;
  }
  // Appends `s` to `out` with a fresh result id (where its op has one); that id.
  ValueId emit(std::vector<Stmt>& out, Stmt s) {
    if (op_info(s.op).has_result) s.result = k_.fresh();
    if (s.loc == 0) s.loc = loc_;
    return append(out, std::move(s));
  }

  // ---- emitters (at the insertion point)
  template <typename F>
  void in(Block& b, F&& f) {
    at_.push_back(&b);
    f();
    at_.pop_back();
  }
  Block& block() { return *at_.back(); }
  // `s` as it is.
  ValueId insert(Stmt s) { return append(block().stmts, std::move(s)); }
  // `s` with a fresh result id (where its op has one).
  ValueId emit(Stmt s) { return emit(block().stmts, std::move(s)); }
  ValueId op(Op op, DType type, std::vector<ValueId> args) {
    return insert(make(op, type, std::move(args)));
  }
  ValueId constant(DType type, double v) { return insert(make_const(type, v)); }
  ValueId i32(int64_t v) { return insert(make_int(DType::kI32, v)); }
  // The value of scalar parameter `param` (`type`: its dtype).
  ValueId arg(DType type, uint32_t param) {
    Stmt s = make(Op::kArg, type);
    s.param = param;
    return insert(std::move(s));
  }
  // A load (`type`: the element's) or a store / atomic_add (args: indices, then the value) of
  // ndarray parameter `param`; a load's value.
  ValueId access(Op op, DType type, uint32_t param, std::vector<ValueId> args) {
    Stmt s = make(op, type, std::move(args));
    s.param = param;
    return insert(std::move(s));
  }
  ValueId load_local(ValueId local, DType type) { return op(Op::kLoadLocal, type, {local}); }
  void store_local(ValueId local, ValueId v) { op(Op::kStoreLocal, DType::kF32, {local, v}); }

  // `for idx in [b, e) [max_trip(cap)] { body(idx) }`; the loop's index.
  template <typename Body>
  ValueId for_(ValueId b, ValueId e, std::optional<SizeExpr> cap, Body&& body) {
    ValueId idx = insert(make_for(b, e, std::move(cap)));
    in(block().stmts.back().blocks[0], [&] { body(idx); });
    return idx;
  }
  // `while idx (test(idx)) { body(idx) }`; `test` returns the test value it emitted.
  template <typename Test, typename Body>
  ValueId while_(Test&& test, Body&& body) {
    Stmt loop = make(Op::kWhile, DType::kI32);
    loop.blocks.resize(2);
    ValueId idx = insert(std::move(loop));
    Stmt& st = block().stmts.back();  // stable: the callbacks fill its own blocks
    ValueId c = kNoValue;
    in(st.blocks[0], [&] { c = test(idx); });
    st.args = {c};
    in(st.blocks[1], [&] { body(idx); });
    return idx;
  }
  // `if cond { side(0) } else { side(1) }`.
  template <typename Side>
  void if_(ValueId cond, Side&& side) {
    insert(make_if(cond));
    Stmt& st = block().stmts.back();
    for (int i = 0; i < 2; ++i) in(st.blocks[i], [&] { side(i); });
  }

 private:
  Kernel& k_;
  std::vector<Block*> at_;
  uint32_t loc_ = 0;
};

// Sets a Rewriter's location for a scope: statements made inside it name `loc` where it has
// one (0 keeps the enclosing scope's, so a statement without a location does not unname the
// statement it is part of).
class LocationScope {
 public:
  LocationScope(Rewriter& rw, uint32_t loc) : rw_(rw), saved_(rw.location()) {
    if (loc != 0) rw.set_location(loc);
  }
  ~LocationScope() { rw_.set_location(saved_); }
  LocationScope(const LocationScope&) = delete;
  LocationScope& operator=(const LocationScope&) = delete;

 private:
  Rewriter& rw_;
  uint32_t saved_;
};

}  // namespace vkad::codegen
