// Adstack storage planning: pure functions, no device. Given a task's stacks and a launch's
// arguments, where each stack lives in each heap, and how big the heaps are.
//
// Storage contract (the emitter and the runtime both follow it):
//   - three heaps, each a storage buffer bound after the ndarrays: f32 values, f64 values,
//     integers (i32/u32 as 32-bit words);
//   - a heap holds `row_elems[h]` elements per dispatched thread (T = groups x local size of
//     the launch); tasks grid-stride, so heap size scales with dispatched threads;
//   - a stack with an adjoint block (has_adjoint_block: a float stack whose adjoint the kernel
//     reads or accumulates) occupies row positions [offset, offset + cap) for primal values and
//     [offset + cap, offset + 2 cap) for adjoints; any other stack only its primal block;
//   - row position r of thread t is element `t * row_elems[h] + r` in the thread-major layout
//     (each thread's row contiguous: best on CPU devices, one thread walks its own cache lines)
//     and `r * T + t` in the slot-major layout (slot k of all threads contiguous: on GPUs
//     neighbouring invocations of a subgroup touch neighbouring words, one transaction per
//     subgroup); element_index() is the reference for both;
//   - counts live in private memory; a push at count == cap writes nothing and flags
//     kErrorAdstackOverflow with the stack's index + 1 in the error word's upper bits.
// Capacities are at least 1, so a top-of-stack read on an empty stack stays inside the row.
//
// Storage tiers (chosen per launch by the runtime; docs/architecture.md, "Storage tiers"):
//   - heap: the rows above, in the three heap bindings;
//   - private: thread t's row of heap h is a Function-storage array of its own, of length
//     `private_length` (>= row_elems[h]); row position r is array index r (the thread-major row
//     without the thread's base). The heap bindings are still declared but never accessed.
// A module that supports both declares the specialization constants below and branches on
// kPrivateTierSpecId around every stack access (the driver folds the branch when it creates
// the pipeline), so one module serves both tiers; the runtime creates one pipeline per
// (tier, private lengths) and rounds lengths up to powers of two (private_lengths) so few
// variants exist. A module without kPrivateTierSpecId always runs in the heap tier.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "adstack/size_expr.h"
#include "base/status.h"

namespace vkad::adstack {

enum class Heap : uint8_t { kF32, kF64, kInt };
inline constexpr uint32_t kHeapCount = 3;
uint32_t heap_elem_bytes(Heap h);
const char* heap_name(Heap h);

// How a heap's elements are ordered across threads; a property of the compile target
// (codegen::Target::adstack_layout), invisible to the host apart from the args words.
enum class Layout : uint8_t { kThreadMajor, kSlotMajor };
const char* layout_name(Layout l);

struct StackDesc {
  std::string name;  // what an overflow report calls it (e.g. "%12 (carried f32 local %4)")
  Heap heap = Heap::kF32;
  SizeExpr capacity;
  // Whether the kernel reads or accumulates this stack's adjoint (stack_top_adj,
  // stack_acc_adj). Without such a use the stack gets no adjoint block and a push writes only
  // the primal; compile() sets it from the task body.
  bool adjoint = true;
};

struct RowLayout {
  std::array<uint32_t, kHeapCount> row_elems{};
  std::vector<uint32_t> offset;    // per stack, in elements of its heap
  std::vector<uint32_t> capacity;  // per stack
  bool operator==(const RowLayout&) const = default;
};

// kInvalidArgument naming the stack when a capacity or a row does not fit 32-bit indexing.
Result<RowLayout> plan_row(std::span<const StackDesc> stacks, const SizeInputs& in);

// Whether `s` has an adjoint block in its row (a float stack with `adjoint` set).
bool has_adjoint_block(const StackDesc& s);

// Args-buffer words a task with `n` stacks needs: the three row lengths, the dispatched
// thread count T, then (offset, capacity) per stack.
inline uint32_t args_words(size_t n) { return n ? 4 + 2 * static_cast<uint32_t>(n) : 0; }
// Word indices within a task's adstack words (the layout write_args produces).
inline uint32_t row_length_word(Heap h) { return static_cast<uint32_t>(h); }
inline uint32_t threads_word() { return 3; }
inline uint32_t offset_word(uint32_t stack) { return 4 + 2 * stack; }
inline uint32_t capacity_word(uint32_t stack) { return 4 + 2 * stack + 1; }
// `threads`: the launch's dispatched threads of this task (groups x local size).
void write_args(const RowLayout& row, uint32_t threads, uint32_t* words);

// Element of stack `stack`'s heap holding slot `slot` (primal, or adjoint when `adjoint`) of
// thread `thread` out of `threads` dispatched, under `layout`. The emitter computes the same
// index on the device; this is its reference (and what the unit tests check).
uint64_t element_index(Layout layout, const RowLayout& row, std::span<const StackDesc> stacks,
                       uint32_t stack, uint32_t slot, bool adjoint, uint32_t thread,
                       uint32_t threads);

// Bytes of heap `h` needed for `threads` dispatched threads; UINT64_MAX when that is past
// 64 bits (a need no allocation meets, instead of a wrapped small one).
uint64_t heap_bytes(const RowLayout& row, Heap h, uint64_t threads);

// Specialization constants of the private tier: a bool (default false: heap tier) and, per
// heap the task uses, the u32 length of its private array (default 1).
inline constexpr uint32_t kPrivateTierSpecId = 0;
inline uint32_t private_length_spec_id(Heap h) { return 1 + static_cast<uint32_t>(h); }
// The private array lengths for `row`: each used heap's row_elems, at least `min_length`,
// rounded up to a power of two (1 for a heap with no stacks), so launches whose rows differ a
// little share a pipeline variant.
std::array<uint32_t, kHeapCount> private_lengths(const RowLayout& row, uint32_t min_length = 1);
// Bytes per thread those arrays take (heaps with no stacks count 0).
uint64_t private_bytes(const RowLayout& row, uint32_t min_length = 1);

}  // namespace vkad::adstack
