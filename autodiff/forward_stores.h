// forward-stores: a load of an ndarray element that the same invocation stored earlier in the
// same block becomes the stored value (store-to-load forwarding), before reverse mode.
//
// Why. DiffTaichi's billiards `advance` writes `v[t, i] = v[t - 1, i] + impulse[t, i]` and then
// reads `v[t, i]` back for `x[t, i] = x[t - 1, i] + dt * v[t, i]`. Reverse mode replays the
// forward after it ran, so a load of an element a store of the same launch may have replaced is
// refused (adjoint_plan.cpp: "is both read and written in task ..."). But this load reads what
// this invocation itself just stored: its value is the stored one, in the forward and in any
// replay, and its derivative with respect to that value is 1. Forwarding it leaves nothing that
// depends on the array's contents at replay, and the rule no longer sees a read of that row.
//
// What is forwarded. In one block, `store a[i0, ..], v` followed by `load a[j0, ..]` where
// every index j_k is the same value as i_k -- the same SSA value, or the same launch-uniform
// expression written twice (two `arg t`, two `const 1`, `sub` of such; compared by value
// numbering of pure integer and compare / select / cast statements over args, constants and
// shapes, and of any statement by its own id) -- with no write to `a` in between: no other
// store (its indices may name the same element), atomic_add or atomic_max of `a`, and no
// statement with blocks (a loop or branch) that writes `a` anywhere inside it, and no barrier.
// The load's uses then use `v`, and the load is removed. A load in a nested block (a branch,
// a loop body) is not forwarded from a store outside that block: conservative, and the form
// DiffTaichi's kernels take.
//
// Pure: the kernel in, the kernel out; changes nothing else. `k` must verify; the result
// verifies (v is defined before the store, which precedes the load in its block, so v dominates
// every use of the load).
#pragma once

#include <cstdint>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "ir/ir.h"
#include "ir/pass.h"

namespace vkad::codegen {

// Value numbering of the statements whose value is a function of their operands alone (the
// leaves const / arg / shape and the unary, binary, compare, select and cast families): two
// such statements with the same op, type, immediates and numbered operands compute the same
// value wherever both are in scope, so `arg t` written twice is one index. Every other value
// (a loop index, a load, a local's load) is its own number. What forward_stores and
// accumulate_stores (accumulations.h) compare indices by.
class ValueNumbers {
 public:
  explicit ValueNumbers(const Kernel& k);
  ValueId of(ValueId v) const {
    auto it = number_.find(v);
    return it == number_.end() ? v : it->second;
  }

 private:
  using Key = std::tuple<Op, DType, uint32_t, uint32_t, int64_t, uint64_t, std::vector<ValueId>>;
  void walk(const Block& b);
  std::map<Key, ValueId> first_;
  std::unordered_map<ValueId, ValueId> number_;
};

// The kernel with every load described above replaced by its stored value; `*forwarded`
// (optional) receives how many loads were.
Kernel forward_stores(Kernel k, uint32_t* forwarded = nullptr);

// "forward-stores": forward_stores as a pass (make_adjoint runs it after lower-jumps).
Pass forward_stores_pass();

}  // namespace vkad::codegen
