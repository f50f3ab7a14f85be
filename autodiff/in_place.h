// Arrays a kernel updates in place -- x[I] = f(x[I], ...) -- made differentiable by reading a
// copy. Reverse mode refuses an array marked grad that one task both reads and writes: the
// adjoint runs after the forward and would read the values the stores replaced
// (taichi-dev/taichi#2505: Taichi read them and returned a wrong gradient). Where the reads of
// such an array see only what the array held before the launch, the kernel computes the same
// as one that reads a copy taken before the launch and writes the array: split_in_place makes
// that kernel, and a tape (api/tape.h) that keeps the copy can run its adjoint.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "ir/ir.h"

namespace vkad::codegen {

// One array split_in_place rewrote: forward parameter `param`'s loads now read parameter
// `before` (an ndarray of the same type and rank, marked grad and read-only, appended after the
// forward's parameters in this order), which the caller binds to a copy of the array taken
// before the launch, with the array's own gradient as its gradient.
struct InPlaceParam {
  uint32_t param = 0;
  uint32_t before = 0;
};

struct InPlaceSplit {
  Kernel kernel;                     // `forward` with the loads of each array moved to `before`
  std::vector<InPlaceParam> arrays;  // empty: nothing to split (kernel is then unset)
};

// The arrays of `forward` marked grad that a task both loads and stores (plain stores, no
// atomic add) and that qualify, and the kernel reading their copies. An array qualifies when
//  - one task holds every access of it;
//  - in program order every load of it comes before every store to it, and no loop holds both
//    a load and a store of it (a later trip would read what an earlier one stored);
//  - each element is touched by one invocation: the task runs one iteration (a constant range
//    of one), or it is parallel and indexes the array exactly by its own indices
//    (owned_ndarrays), or by its own indices then constants (a row of components: x[i, 0, 1]).
// The adjoint of the returned kernel must clear the seeds its stores to each `param` read
// (AdjointOptions::clear_seeds_of): the copy's gradient is the array's gradient array, so a
// store's adjoint reads the element's seed (the new value's) and zeroes it before the loads'
// adjoints add the old value's gradient there -- in one invocation, in reverse order.
// An array that fails a condition is left as it is (reverse mode then refuses it, saying why).
InPlaceSplit split_in_place(const Kernel& forward);

// make_adjoint's adjoint of split.kernel (its parameters, then one gradient per parameter marked
// grad, in order) with each copy's gradient made its array's: the copies' gradient parameters
// (the last ones) go, and what the adjoint adds into them goes into the arrays' gradients. One
// binding for the two, so the order of the seed's clear and the old value's add is the
// invocation's program order (two bindings of one buffer are not known to alias in SPIR-V).
// The adjoint's parameters are then split.kernel's, then the forward's gradients.
// kInternal where the copies' gradients are not the adjoint's last parameters.
Status merge_copy_gradients(const InPlaceSplit& split, Kernel* adjoint);

}  // namespace vkad::codegen
