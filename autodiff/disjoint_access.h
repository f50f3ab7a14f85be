// Disjoint access: a proof that a kernel never writes an element of an ndarray that it reads
// before the write, so that a replay after the kernel (reverse mode's) reads what the kernel
// read. This is the DiffTaichi idiom: state read at step f and written at step f + 1 of one
// array, `x[f + 1, p] = x[f, p] + dt * v[f, p]`.
//
// Conflicting pairs. For ndarray parameter `param` of kernel `k`, a *conflicting pair* is a
// write (store, atomic_add or atomic_max) and a read (load) of `param` where the write's task
// is the read's task or a later one (in any order inside the task, any thread, any loop
// iteration or branch). A write in an earlier task than the read is no conflict: tasks are
// separated by barriers, so the read sees the written value, which is also what a replay after
// the kernel sees unless a conflicting write replaces it.
//
// What is proven. kDisjoint(axis): for every conflicting pair, the index operand on `axis` of
// the write and that of the read are both *launch-uniform* and differ by a non-zero constant
// modulo 2^32, so they name different elements of every launch (each access is bounds-checked
// per axis: docs/architecture.md, "Emission"; an out-of-bounds one touches nothing). A value is
// launch-uniform when it is computed only from integer constants, i32 / u32 / bool scalar
// parameters, shape() queries and integer arithmetic on them (add, sub, mul, neg, div, mod,
// floordiv, min, max, abs, and, or, not, comparisons, select, casts between i32 and u32): the
// same value in every invocation of a launch. Such values are normalised to `c + sum(k_i *
// t_i)` modulo 2^32, the terms t_i being parameters, shapes and any other launch-uniform
// expression taken whole (`f div 2` is one term, compared by structure), so `f + 1` vs `f`,
// `f + 1` vs `f - 1`, `(f div 2) + 1` vs `f div 2` and `2 * (f + 1)` vs `2 * f + 1` are all
// proven. Rings too: `mod(f + 1, 2)` vs `mod(f, 2)`, or any `mod(a + d, m)` vs `mod(a, m)` with
// m a constant power of two that does not divide d (the results are congruent to a + d and a
// modulo m; for m dividing 2^32 wrap-around keeps that): DiffTaichi's state in a ring of two
// rows, `x[(f + 1) % 2, p] = x[f % 2, p] + ...`. One axis must separate every conflicting pair.
//
// What it gives up on (kUnproven): a task index, a loop index, a mutable local, anything loaded
// from an ndarray, floating-point or i64 values anywhere in the index; two different parameters
// (`f` vs `g`: equal in some launch); a difference that is not a constant (`f` vs `2 * f`);
// a ring whose modulus is not a constant power of two (`f % 3`: wrap-around breaks the
// congruence) or divides the difference (`f % 2` vs `(f + 2) % 2`);
// separation that needs ranges rather than a constant difference (`x[f + p]`), or different
// axes for different pairs. Unproven is not "overlapping": only "not shown disjoint".
//
// kNoConflict: no conflicting pair (the array is not both read and written, or every write is
// in a task before every read).
//
// What it does not check: that each element is written at most once (stores on different
// paths, or by different threads, to one element): reverse mode's rule, not this proof's.
#pragma once

#include <cstdint>

#include "ir/ir.h"

namespace vkad::codegen {

struct DisjointAccess {
  enum class Kind { kNoConflict, kDisjoint, kUnproven };
  Kind kind = Kind::kUnproven;
  uint32_t axis = 0;  // kDisjoint: the first axis that separates every conflicting pair
};

// `param` must be an ndarray parameter of `k`, and `k` must verify (indices of its accesses
// are i32 or u32, one per axis). Pure: reads `k` only.
DisjointAccess disjoint_access(const Kernel& k, uint32_t param);

// Written before read: a proof that every load of ndarray parameter `param` reads an element no
// write of the kernel changes after that load, so a replay after the kernel (reverse mode's)
// reads what the load read -- a recurrence kept in the array itself, one element a step:
// `ewma[0] = x[0]; for i in [1, n): ewma[i] = a x[i] + (1 - a) ewma[i - 1]` (taichi#2425),
// `for i in [0, n): epsp[i + 1] = f(epsp[i])` (taichi#8802).
//
// What is proven. `param` is rank 1 and touched (loads and stores; no atomics) in one task only,
// a 1-d task of exactly one iteration (constant bounds, one apart: one invocation runs it,
// serial or not), in this order at its top
// level: stores at constant indices; one `for i in [b, e)` loop (ascending, one element per
// trip); loads at any index. Inside the loop, at any depth but not inside a nested loop (each
// access runs at most once a trip), every access is at i + c (the loop index itself, or it
// plus or minus an integer constant): the stores all at one offset cs, the loads at offsets
// below cs. Then a load in trip i reads element i + cl, which trip i + cl - cs wrote (or the
// stores before the loop, or nothing), and which no later trip writes (they write i' + cs >
// i + cl); the stores before the loop are at constants below b + cs (b a constant), so no trip
// overwrites them; and the loads after the loop run after every write. Each element is then
// written at most once by the loop (check_overwrites, adjoint_plan.h, sees to the rest).
//
// Gives up (false) on anything else: another rank, several tasks, a task of more than one
// iteration (its invocations, or its trips, would run the loop again), branches or loops around the
// accesses outside the one loop, indices other than i + constant, loads at or above the stores'
// offset, an atomic add.
bool written_before_read(const Kernel& k, uint32_t param);

}  // namespace vkad::codegen
