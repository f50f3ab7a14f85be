// accumulate-stores: an element updated by adding to it, `x[I] = x[I] + v`, is differentiated
// as the atomic add it computes, `atomic_add x[I], v` -- in the kernel reverse mode is made
// from, never in the one the user launches.
//
// Why. `x[i] = x[i] + y[j]` in a loop (Taichi's `x[i] += y[j]`; a running sum kept in the
// array rather than in a local) reads and writes x in one task, and later iterations overwrite
// what earlier ones read, so reverse mode's rules refuse it (adjoint_plan.cpp: "is both read
// and written in task ...", check_overwrites: a store at one element in every iteration). Yet
// the update needs none of the values it overwrites: its derivative with respect to the old
// element is 1, with respect to v 1, so its adjoint is an atomic add's -- v's adjoint +=
// x_grad[I], x_grad unchanged -- whatever x held. Taichi issue 8356's load / store form
// (docs/conformance.md) is this.
//
// What is rewritten. For an ndarray parameter x of a float type, an *update* is, in one block:
// `%a = load x[I]`, then `%b = add %a, %v` (or `add %v, %a`) of x's type with %v not %a, then
// `store x[J], %b` with J's indices the same values as I's (ValueNumbers, forward_stores.h),
// %a used only by that add and %b only by that store, and no statement between the load and
// the store touching x (nested blocks included). x's updates become atomic adds (the load and
// the add dropped) where
//   - every access of x in the kernel is such an update or an atomic_add (no other load: no
//     value of x is read; no other store or atomic_max), and
//   - every task holding an update runs each element's updates in one invocation: a serial
//     task, or a parallel task that owns x (owned_ndarrays, reverse_mode.h: every access at the
//     task's own index), so the forward's read-modify-write is no race and computes exactly
//     what the atomic add would.
// Otherwise x is left as written (and reverse mode's rules decide, as before).
//
// Pure: the kernel in, the kernel out. `k` must verify; the result verifies (v is defined
// before the add, which precedes the store).
#pragma once

#include <cstdint>

#include "ir/ir.h"
#include "ir/pass.h"

namespace vkad::codegen {

// `k` with the updates described above as atomic adds; `*rewritten` (optional) receives how
// many were.
Kernel accumulations_as_atomic_adds(Kernel k, uint32_t* rewritten = nullptr);

// "accumulate-stores": accumulations_as_atomic_adds as a pass (make_adjoint and
// make_clearing_adjoint run it first after verify; make_adjoint_counted does not, because its
// counting forward replaces the user's forward launch and must be the kernel as written).
Pass accumulate_stores_pass();

}  // namespace vkad::codegen
