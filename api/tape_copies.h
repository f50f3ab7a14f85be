#pragma once
// What a checkpointing Tape (api/tape.h) copies: the arrays its launches overwrite, as they were
// at the start of each segment of each level of its plan (and at the recording's end), in slots
// keyed by (slot, form index) so that arrays alike in dtype and shape share them. Internal to
// api/: only tape.cpp includes it.
//
// Contract:
// - A slot's copy is made on first use, reused across recordings and backwards (a steady-state
//   iteration allocates nothing), and freed with the store.
// - Copies no recording uses become spares, reused first; `trim` frees spares while the copies
//   pass the budget, never one a captured graph launches with (`pin`).
// - `bytes()` is what every copy holds (Tape::checkpoint_bytes).

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "api/session.h"

namespace vkad {

class TapeCopies {
 public:
  using SlotKey = std::pair<uint64_t, uint64_t>;  // (slot, index among its written arrays)
  static constexpr int kEnd = -1;                 // the level of the recording's end state

  explicit TapeCopies(Session& session) : session_(&session) {}
  ~TapeCopies();  // frees every copy (deferred past in-flight uses by the runtime)
  TapeCopies(const TapeCopies&) = delete;
  TapeCopies& operator=(const TapeCopies&) = delete;

  // A recording's first launch: no slot used yet, levels 0 and 1 ready.
  void begin_recording();
  // Tape::reset: no level-0 segment holds arrays.
  void reset() { segment_arrays_.clear(); }
  // The levels a plan of `levels` needs.
  void ensure_levels(size_t levels);

  // The slot index of list[i]'s copy: its form's number << 32 | the arrays of that form before
  // it in `list`.
  Result<uint64_t> form_index(std::span<const uint64_t> list, size_t i);
  // The bytes of one array of form `form` (a form_index >> 32).
  uint64_t form_bytes(uint64_t form) const;
  // The bytes a deepest-level slot holds with the copies of a launch writing `writes`: a copy
  // per form and per array of that form, the most of each (`mult`, form -> arrays, kept over
  // the recording by the caller).
  Result<uint64_t> slot_bytes(std::span<const uint64_t> writes, std::map<uint64_t, uint64_t>* mult);
  // The copy of `array` for (slot, index) at `level` (kEnd: the end state's), made on first
  // use with the array's dtype and shape; marked used by this recording.
  Result<NdArrayHandle> slot(int level, uint64_t slot, uint64_t index, NdArrayHandle array);
  // A slot's copy that `slot` made.
  NdArrayHandle at(int level, SlotKey key) const;

  // Level 0 while recording: `writes` (a launch's written arrays) copied into the slots of
  // level-0 segment `segment`, each the first time the segment writes it.
  Status copy_segment_start(size_t segment, std::span<const uint64_t> writes);
  // Per level-0 segment: the arrays copied at its start.
  const std::vector<std::vector<uint64_t>>& segment_arrays() const { return segment_arrays_; }
  // Budget mode: every m level-0 segments into one; the copies the merge leaves over become
  // spares.
  void merge_level0(uint32_t m);

  // Where the runtime is capturing and `id` is one of the copies: kept until the store goes (a
  // captured graph launches with it from now on).
  void pin(uint64_t id);
  // After a backward: the slots the last recording and backward did not use become spares, and
  // spares are freed while the copies pass `budget` (all of them for 0), except pinned ones.
  void trim(uint64_t budget);
  uint64_t bytes() const { return bytes_; }

 private:
  std::map<SlotKey, NdArrayHandle>& pool(int level) {
    return level == kEnd ? end_ : levels_[static_cast<size_t>(level)];
  }
  void free(NdArrayHandle copy);  // frees a copy and counts its bytes out

  Session* session_;  // borrowed
  // Per level of the plan: (segment within its parent, array) -> that segment's start state;
  // the last level's by position in its segment. Level 0's are taken while recording.
  std::vector<std::map<SlotKey, NdArrayHandle>> levels_;
  std::map<SlotKey, NdArrayHandle> end_;               // (0, index) -> the recording's end state
  std::vector<std::vector<uint64_t>> segment_arrays_;  // per segment: arrays copied at its start
  std::vector<NdArrayHandle> spares_;                  // merged or trimmed away, reused first
  uint64_t bytes_ = 0;                                 // what every copy above holds
  std::unordered_map<uint64_t, uint64_t> sizes_;       // copy handle id -> its bytes
  // The slots the recording and its backward copied into (level, key): trim keeps these.
  std::set<std::pair<int, SlotKey>> used_;
  std::unordered_set<uint64_t> pinned_;  // copies a captured graph launches with
  // The forms (dtype, shape) of the arrays copied, by form_index's numbering.
  std::vector<std::pair<DType, std::vector<uint32_t>>> forms_;
};

}  // namespace vkad
