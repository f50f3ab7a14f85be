// vkad::TapeHazards — the check that keeps a tape's gradients from being silently wrong: it
// refuses a launch that overwrites what an earlier launch of the same recording needs at
// backward. vkad::Tape (C++ and, through it, C) and the Python binding's tape each hold one, so
// all three front doors refuse the same launches with the same message.
//
// Why. Backward launches each recorded forward's adjoint with the forward's own arguments, on
// the arrays as they are when backward runs. For recorded launches i < j and an array A, the
// gradients are wrong, with no error, when
//  - launch j writes (store, atomic_add, atomic_max) an element of A that launch i reads (load):
//    i's adjoint would read the new value (DiffTaichi's diffmpm reusing one `grid` per substep);
//  - launch j overwrites (store, atomic_max) an element of A that launch i wrote through a
//    differentiated (grad) parameter: the adjoint of a store leaves its seed in A's gradient
//    (autodiff/reverse_mode.h), so i's adjoint would also credit its inputs with the gradient of
//    the value j wrote. An atomic_add after a write (a loss accumulated by many launches) adds
//    to it and is fine.
// Launch j's own read-before-write of one parameter is make_adjoint's to prove
// (disjoint_access.h); two parameters of launch j bound to one array are this check's: the same
// rule between them (check_aliasing), since make_adjoint takes distinct parameters to be
// distinct arrays.
//
// Rows. codegen::kernel_access (ir/launch_access.h) lists, per ndarray parameter, each
// access and, per axis, its index when it is launch-uniform; check() evaluates those with the
// launch's scalar arguments and array shapes. Where a write and an earlier access have
// launch-uniform indices on a common axis and the rows differ, they cannot overlap: launch f
// reading row f and writing row f + 1 of one array (DiffTaichi's time axis) is accepted over any
// number of launches. Otherwise (an index that depends on the thread, a loop or data) they are
// taken to overlap.
//
// Cost. Per array touched, per axis: the rows read so far (a table indexed by the row, a hash
// map past 65,536) or "rows not known"; likewise for the differentiated writes. check() is
// O(accesses of the launch x rank) look-ups; record() adds one entry per new row. Array
// identity is the handle (never reused).
//
// Contract: check() changes nothing; record() commits the launch check() last accepted (call it
// once the launch was made). reset() forgets everything (a new recording).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/session.h"
#include "ir/launch_access.h"

namespace vkad {

class TapeHazards {
 public:
  TapeHazards() = default;
  // A copy holds the record, not a pending check (whose evaluation points into the source's
  // records): record() commits nothing until the next check().
  TapeHazards(const TapeHazards& o) : arrays_(o.arrays_), kernels_(o.kernels_) {}
  TapeHazards& operator=(const TapeHazards& o) {
    if (this != &o) {
      arrays_ = o.arrays_;
      kernels_ = o.kernels_;
      pending_ = nullptr;
      evaluated_.clear();
    }
    return *this;
  }
  TapeHazards(TapeHazards&&) = default;  // map nodes move with the map: pointers stay valid
  TapeHazards& operator=(TapeHazards&&) = default;
  // kInvalidArgument when a launch of `access`'s kernel with `args` (the forward's arguments)
  // would overwrite what a launch recorded earlier read, or wrote through a differentiated
  // parameter. The message names both launches (their index in the recording and kernel), the
  // array (name and handle), the two parameters, the row and axis where known, why that gives
  // wrong gradients, and what to do (docs/tape.md), e.g.
  //   "launch 3 ('p2g') writes ndarray 'grid' (1:5), parameter 'grid', at rows that depend on
  //    the thread, a loop or data; launch 2 ('g2p') read it (parameter 'grid') ..."
  // `session` gives array shapes (for indices that use shape()) and names (for the message).
  Status check(const Session& session, std::shared_ptr<const codegen::KernelAccess> access,
               std::span<const Arg> args);
  // check() with array extents from `extent` instead of a session, and no message: what a
  // thread that may not call into the session runs (the Python binding checks a step loop's
  // launches beside the caller's work). True when accepted (record() then commits it); where
  // it is not, check() with the session gives the message.
  using Extent = std::function<std::optional<uint32_t>(NdArrayHandle array, uint32_t axis)>;
  bool accepts(const Extent& extent, std::shared_ptr<const codegen::KernelAccess> access,
               std::span<const Arg> args);
  // The part of check() that looks at the launch alone: kInvalidArgument when two of its
  // parameters are bound to one array and one writes rows the other reads (or overwrites rows
  // the other writes through a differentiated parameter) -- an in-place launch such as
  // `b[i] = sin(a[i])` with a = b, whose adjoint would read the values the launch stored where
  // it needs those it loaded. Rows told apart by launch-uniform indices (read row f, write row
  // f + 1) are accepted. The message names both parameters and says to pass a separate output.
  // check() runs it too; a checkpointed tape, which does not keep a record, runs this alone.
  static Status check_aliasing(const Session& session, const codegen::KernelAccess& access,
                               std::span<const Arg> args);
  // Adds the launch check() last accepted to the recording.
  void record();
  void reset();
  size_t launches() const { return kernels_.size(); }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  // Which launch (index in the recording) touched an element first, and through which
  // parameter of its kernel.
  struct By {
    uint32_t launch = kNone;
    uint32_t param = 0;
  };
  // Rows below kDenseRows are kept in a vector indexed by the row (a time axis's rows are
  // 0..steps: a tape records ~10^4 launches, and a hash node per row was most of record()'s
  // cost); larger ones in a hash map.
  static constexpr uint32_t kDenseRows = 1u << 16;
  struct AxisRows {
    By unknown;                               // first touch at rows not known on this axis
    std::vector<By> dense;                    // row -> first touch there (launch kNone: none)
    std::unordered_map<uint32_t, By> sparse;  // rows >= kDenseRows
    const By* find(uint32_t row) const {
      if (row < dense.size()) return dense[row].launch == kNone ? nullptr : &dense[row];
      if (row < kDenseRows) return nullptr;
      auto it = sparse.find(row);
      return it == sparse.end() ? nullptr : &it->second;
    }
    void add(uint32_t row, By by) {  // keeps the first touch
      if (row >= kDenseRows) {
        sparse.emplace(row, by);
        return;
      }
      if (row >= dense.size()) dense.resize(std::max<size_t>(row + 1, 2 * dense.size()));
      if (dense[row].launch == kNone) dense[row] = by;
    }
  };
  struct Touched {
    By first;                    // first touch at all; launch == kNone: none
    std::vector<AxisRows> axes;  // per axis of the array
  };
  struct ArrayRecord {
    Touched read;     // loads
    Touched written;  // writes through differentiated parameters
  };
  // A launch's access, evaluated: rows_[row_begin + axis] is the row or kUnknownRow.
  struct Evaluated {
    uint32_t param_slot = 0, access = 0, row_begin = 0;
    ArrayRecord* rec = nullptr;  // the array's record check() found (record() adds one if none)
  };
  static constexpr int64_t kUnknownRow = -1;

  // Fills evaluated_ / rows_ (with rec null) with every access of `k` at `args`.
  void evaluate(const Extent& extent, const codegen::KernelAccess& k, std::span<const Arg> args);
  // After evaluate(): a write and an access of another parameter bound to the same array that
  // may overlap (alias_pair_, write first), or null.
  const Evaluated* alias(const codegen::KernelAccess& k, std::span<const Arg> args);
  std::string alias_conflict(const Session& session, const codegen::KernelAccess& k,
                             std::span<const Arg> args, const Evaluated& write,
                             const Evaluated& other) const;
  Status check_with(const Extent& extent, const Session* session,
                    std::shared_ptr<const codegen::KernelAccess> access, std::span<const Arg> args);
  // The earlier touch that a write at `rows` may overlap in `t`, or {kNone}; `axis` / `row`
  // get where it was found (axis UINT32_MAX: no row known).
  By overlap(const Touched& t, const int64_t* rows, size_t rank, uint32_t* axis) const;
  static void add(Touched& t, const int64_t* rows, size_t rank, By by);
  std::string conflict(const Session& session, const codegen::KernelAccess& access,
                       std::span<const Arg> args, const Evaluated& e, By earlier, uint32_t axis,
                       bool overwrite_of_write) const;

  std::unordered_map<uint64_t, ArrayRecord> arrays_;  // by array handle id
  // The kernel of each recorded launch (messages name it).
  std::vector<std::shared_ptr<const codegen::KernelAccess>> kernels_;
  // check()'s result, which record() commits.
  std::shared_ptr<const codegen::KernelAccess> pending_;
  std::vector<Arg> pending_args_;
  std::vector<Evaluated> evaluated_;
  std::vector<int64_t> rows_;
  std::vector<int64_t> expr_values_;
  Evaluated alias_pair_[2];
};

}  // namespace vkad
