#include "adstack/adstack_layout.h"

#include <algorithm>
#include <bit>

namespace vkad::adstack {

uint32_t heap_elem_bytes(Heap h) { return h == Heap::kF64 ? 8 : 4; }

const char* heap_name(Heap h) {
  switch (h) {
    case Heap::kF32: return "f32";
    case Heap::kF64: return "f64";
    case Heap::kInt: return "int";
  }
  return "?";
}

const char* layout_name(Layout l) {
  return l == Layout::kSlotMajor ? "slot-major" : "thread-major";
}

bool has_adjoint_block(const StackDesc& s) { return s.heap != Heap::kInt && s.adjoint; }

Result<RowLayout> plan_row(std::span<const StackDesc> stacks, const SizeInputs& in) {
  RowLayout row;
  std::array<uint64_t, kHeapCount> used{};
  for (const StackDesc& s : stacks) {
    Result<int64_t> size = evaluate(s.capacity, in);
    if (!size.ok()) {
      return make_error(size.status().code(), "adstack " + s.name +
                                                  " capacity: " + size.status().message() +
                                                  "; lower the loop trip counts");
    }
    int64_t cap = std::max<int64_t>(*size, 1);
    uint64_t blocks = has_adjoint_block(s) ? 2 : 1;
    uint64_t& u = used[static_cast<size_t>(s.heap)];
    if (cap > INT32_MAX || u + blocks * static_cast<uint64_t>(cap) > INT32_MAX) {
      return make_error(ErrorCode::kInvalidArgument,
                        "adstack " + s.name + " needs capacity " + std::to_string(cap) +
                            ", which does not fit a 32-bit row; lower the loop trip counts");
    }
    row.offset.push_back(static_cast<uint32_t>(u));
    row.capacity.push_back(static_cast<uint32_t>(cap));
    u += blocks * static_cast<uint64_t>(cap);
  }
  for (size_t h = 0; h < kHeapCount; ++h) row.row_elems[h] = static_cast<uint32_t>(used[h]);
  return row;
}

void write_args(const RowLayout& row, uint32_t threads, uint32_t* w) {
  for (uint32_t h = 0; h < kHeapCount; ++h)
    w[row_length_word(static_cast<Heap>(h))] = row.row_elems[h];
  w[threads_word()] = threads;
  for (uint32_t s = 0; s < row.offset.size(); ++s) {
    w[offset_word(s)] = row.offset[s];
    w[capacity_word(s)] = row.capacity[s];
  }
}

uint64_t element_index(Layout layout, const RowLayout& row, std::span<const StackDesc> stacks,
                       uint32_t stack, uint32_t slot, bool adjoint, uint32_t thread,
                       uint32_t threads) {
  uint64_t pos = uint64_t{row.offset[stack]} + slot + (adjoint ? row.capacity[stack] : 0);
  if (layout == Layout::kSlotMajor) return pos * threads + thread;
  return uint64_t{thread} * row.row_elems[static_cast<size_t>(stacks[stack].heap)] + pos;
}

uint64_t heap_bytes(const RowLayout& row, Heap h, uint64_t threads) {
  uint64_t row_bytes = uint64_t{row.row_elems[static_cast<size_t>(h)]} * heap_elem_bytes(h);
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(threads, row_bytes, &bytes)) return UINT64_MAX;
  return bytes;
}

std::array<uint32_t, kHeapCount> private_lengths(const RowLayout& row, uint32_t min_length) {
  std::array<uint32_t, kHeapCount> len{};
  // row_elems <= INT32_MAX (plan_row), so the power of two fits 32 bits (min_length is capped
  // at 2^31 likewise).
  min_length = std::min<uint32_t>(min_length, 1u << 31);
  for (size_t h = 0; h < kHeapCount; ++h) {
    len[h] = row.row_elems[h] ? std::bit_ceil(std::max(row.row_elems[h], min_length)) : 1;
  }
  return len;
}

uint64_t private_bytes(const RowLayout& row, uint32_t min_length) {
  std::array<uint32_t, kHeapCount> len = private_lengths(row, min_length);
  uint64_t bytes = 0;
  for (size_t h = 0; h < kHeapCount; ++h) {
    if (row.row_elems[h]) bytes += uint64_t{len[h]} * heap_elem_bytes(static_cast<Heap>(h));
  }
  return bytes;
}

}  // namespace vkad::adstack
