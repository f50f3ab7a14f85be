// Adstack storage planning: pure functions, no device. Given a task's stacks and a launch's
// arguments, where each stack lives in a thread's row of each heap, and how big the heaps are.
//
// Storage contract (the emitter and the runtime both follow it):
//   - three heaps, each a storage buffer bound after the ndarrays: f32 values, f64 values,
//     integers (i32/u32 as 32-bit words);
//   - each dispatched thread (global invocation id) owns one row per heap, `row_elems[h]`
//     elements long; tasks grid-stride, so heap size scales with dispatched threads;
//   - within a row, a float stack occupies [offset, offset + cap) for primal values and
//     [offset + cap, offset + 2 cap) for adjoints; an integer stack only its primal block;
//   - counts live in private memory; a push at count == cap writes nothing and flags
//     kErrorAdstackOverflow with the stack's index + 1 in the error word's upper bits.
// Capacities are at least 1, so a top-of-stack read on an empty stack stays inside the row.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "adstack/size_expr.h"
#include "rhi/status.h"

namespace vkad::adstack {

enum class Heap : uint8_t { kF32, kF64, kInt };
inline constexpr uint32_t kHeapCount = 3;
uint32_t heap_elem_bytes(Heap h);
const char* heap_name(Heap h);

struct StackDesc {
  std::string name;  // what an overflow report calls it (e.g. "%12 (carried f32 local %4)")
  Heap heap = Heap::kF32;
  SizeExpr capacity;
};

struct RowLayout {
  std::array<uint32_t, kHeapCount> row_elems{};
  std::vector<uint32_t> offset;    // per stack, in elements of its heap
  std::vector<uint32_t> capacity;  // per stack
};

// kInvalidArgument naming the stack when a capacity or a row does not fit 32-bit indexing.
Result<RowLayout> plan_row(std::span<const StackDesc> stacks, const SizeInputs& in);

// Args-buffer words a task with `n` stacks needs: the three row lengths, then (offset,
// capacity) per stack.
inline uint32_t args_words(size_t n) { return n ? 3 + 2 * static_cast<uint32_t>(n) : 0; }
// Word indices within a task's adstack words (the layout write_args produces).
inline uint32_t row_length_word(Heap h) { return static_cast<uint32_t>(h); }
inline uint32_t offset_word(uint32_t stack) { return 3 + 2 * stack; }
inline uint32_t capacity_word(uint32_t stack) { return 3 + 2 * stack + 1; }
void write_args(const RowLayout& row, uint32_t* words);

// Bytes of heap `h` needed for `threads` dispatched threads.
uint64_t heap_bytes(const RowLayout& row, Heap h, uint64_t threads);

}  // namespace vkad::adstack
