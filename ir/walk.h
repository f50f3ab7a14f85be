// The one walk over a block's statements: every statement, in order, before the statements of
// its own blocks (pre-order), at any depth. Passes that only need to see every statement (index
// the definitions, find an op, collect what a task reads) use it instead of writing the
// recursion again; a pass that needs the path or must stop early still writes its own.
#pragma once

#include "ir/ir.h"

namespace vkad::codegen {

// Calls `f(const Stmt&)` for every statement of `b` and of the blocks nested in it. Recursion
// depth is the nesting depth, which verify() and the parser bound (kMaxNestingDepth).
template <class F>
void for_each_stmt(const Block& b, F&& f) {
  for (const Stmt& s : b.stmts) {
    f(s);
    for (const Block& c : s.blocks) for_each_stmt(c, f);
  }
}

// The same over every task body of `k`.
template <class F>
void for_each_stmt(const Kernel& k, F&& f) {
  for (const Task& t : k.tasks) for_each_stmt(t.body, f);
}

// Whether `s` is a load, store, atomic_add or atomic_max of an ndarray parameter.
inline bool is_array_access(const Stmt& s) {
  return s.op == Op::kLoad || s.op == Op::kStore || s.op == Op::kAtomicAdd ||
         s.op == Op::kAtomicMax;
}

// Whether `s`, or a statement in its blocks, accesses ndarray parameter `p`.
inline bool accesses_param(const Stmt& s, uint32_t p) {
  if (is_array_access(s) && s.param == p) return true;
  for (const Block& b : s.blocks) {
    for (const Stmt& c : b.stmts) {
      if (accesses_param(c, p)) return true;
    }
  }
  return false;
}

}  // namespace vkad::codegen
