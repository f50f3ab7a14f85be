#include "api/tape_copies.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "graph/checkpoint_schedule.h"
#include "runtime/graphs.h"
#include "runtime/runtime.h"

namespace vkad {

TapeCopies::~TapeCopies() {
  for (auto& level : levels_) {
    for (auto& [key, copy] : level) (void)session_->free(copy);
  }
  for (auto& [key, copy] : end_) (void)session_->free(copy);
  for (NdArrayHandle copy : spares_) (void)session_->free(copy);
}

void TapeCopies::begin_recording() {
  used_.clear();
  if (levels_.empty()) {
    levels_.reserve(codegen::kMaxCheckpointLevels);
    levels_.resize(2);
  }
}

void TapeCopies::ensure_levels(size_t levels) {
  if (levels_.size() < levels) levels_.resize(levels);
}

Result<uint64_t> TapeCopies::form_index(std::span<const uint64_t> list, size_t i) {
  auto form_of = [&](uint64_t a) -> Result<uint64_t> {
    VKAD_ASSIGN_OR_RETURN(DType t, session_->dtype(NdArrayHandle{a}));
    VKAD_ASSIGN_OR_RETURN(std::vector<uint32_t> shape, session_->shape(NdArrayHandle{a}));
    for (size_t f = 0; f < forms_.size(); ++f) {
      if (forms_[f].first == t && forms_[f].second == shape) return f;
    }
    forms_.emplace_back(t, std::move(shape));
    return forms_.size() - 1;
  };
  VKAD_ASSIGN_OR_RETURN(uint64_t form, form_of(list[i]));
  uint64_t before = 0;
  for (size_t j = 0; j < i; ++j) {
    VKAD_ASSIGN_OR_RETURN(uint64_t f, form_of(list[j]));
    before += f == form;
  }
  return form << 32 | before;
}

uint64_t TapeCopies::form_bytes(uint64_t form) const {
  uint64_t bytes = runtime::dtype_bytes(forms_[form].first);
  for (uint32_t e : forms_[form].second) bytes *= e;
  return bytes;
}

Result<uint64_t> TapeCopies::slot_bytes(std::span<const uint64_t> writes,
                                        std::map<uint64_t, uint64_t>* mult) {
  // What the deepest level's slot for a launch holds: a copy per form and per array of that
  // form it writes (slot), the most of each over the recording.
  for (size_t w = 0; w < writes.size(); ++w) {
    VKAD_ASSIGN_OR_RETURN(uint64_t index, form_index(writes, w));
    uint64_t& m = (*mult)[index >> 32];
    m = std::max(m, (index & 0xffffffffu) + 1);
  }
  uint64_t total = 0;
  for (const auto& [form, m] : *mult) total += m * form_bytes(form);
  return total;
}

Result<NdArrayHandle> TapeCopies::slot(int level, uint64_t slot, uint64_t index,
                                       NdArrayHandle array) {
  VKAD_ASSIGN_OR_RETURN(DType t, session_->dtype(array));
  VKAD_ASSIGN_OR_RETURN(std::vector<uint32_t> shape, session_->shape(array));
  auto same_form = [&](NdArrayHandle c) {
    Result<DType> ct = session_->dtype(c);
    Result<std::vector<uint32_t>> cs = session_->shape(c);
    return ct.ok() && cs.ok() && *ct == t && *cs == shape;
  };
  // `index` is form_index's: a slot holds a copy per form (dtype and shape) and per array of
  // that form its segment writes, so a ring's arrays, alike in form, share the slots.
  std::map<SlotKey, NdArrayHandle>& p = pool(level);
  used_.insert({level, SlotKey{slot, index}});
  auto it = p.find({slot, index});
  if (it != p.end()) {
    if (same_form(it->second)) return it->second;
    spares_.push_back(it->second);
    p.erase(it);
  }
  for (size_t i = 0; i < spares_.size(); ++i) {  // a merged-away copy of the same form
    const NdArrayHandle c = spares_[i];
    if (same_form(c)) {
      spares_.erase(spares_.begin() + static_cast<std::ptrdiff_t>(i));
      p.emplace(SlotKey{slot, index}, c);
      return c;
    }
  }
  uint64_t bytes = runtime::dtype_bytes(t);
  for (uint32_t e : shape) bytes *= e;
  VKAD_ASSIGN_OR_RETURN(
      NdArrayHandle c, session_->ndarray(t, std::move(shape),
                                         "tape checkpoint of " + runtime::handle_string(array.id)));
  p.emplace(SlotKey{slot, index}, c);
  sizes_.emplace(c.id, bytes);
  bytes_ += bytes;
  return c;
}

NdArrayHandle TapeCopies::at(int level, SlotKey key) const {
  return level == kEnd ? end_.at(key) : levels_[static_cast<size_t>(level)].at(key);
}

Status TapeCopies::copy_segment_start(size_t segment, std::span<const uint64_t> writes) {
  if (segment_arrays_.size() <= segment) segment_arrays_.resize(segment + 1);
  std::vector<uint64_t>& at_start = segment_arrays_[segment];
  for (const uint64_t a : writes) {
    if (std::find(at_start.begin(), at_start.end(), a) != at_start.end()) continue;
    at_start.push_back(a);
    Result<uint64_t> index = form_index(at_start, at_start.size() - 1);
    Result<NdArrayHandle> c = index.ok() ? slot(0, segment, *index, NdArrayHandle{a})
                                         : Result<NdArrayHandle>(index.status());
    const Status st = c.ok() ? session_->copy(NdArrayHandle{a}, *c) : c.status();
    if (!st.ok()) {
      at_start.pop_back();
      return st;
    }
    pin(c->id);
  }
  return {};
}

void TapeCopies::merge_level0(uint32_t m) {
  std::vector<std::vector<uint64_t>> merged((segment_arrays_.size() + m - 1) / m);
  // The earliest segment's copy of an array is the merged segment's start state; a later
  // one's only where no earlier one wrote the array (it held the same value then).
  std::map<SlotKey, NdArrayHandle> merged_pool;
  std::map<SlotKey, NdArrayHandle> old = std::move(levels_[0]);
  for (size_t seg = 0; seg < segment_arrays_.size(); ++seg) {
    std::vector<uint64_t>& into = merged[seg / m];
    for (size_t index = 0; index < segment_arrays_[seg].size(); ++index) {
      const uint64_t a = segment_arrays_[seg][index];
      Result<uint64_t> was = form_index(segment_arrays_[seg], index);
      auto c = was.ok() ? old.find({seg, *was}) : old.end();
      if (c == old.end()) continue;
      const NdArrayHandle copy = c->second;
      old.erase(c);
      if (std::find(into.begin(), into.end(), a) != into.end()) {
        spares_.push_back(copy);
        continue;
      }
      into.push_back(a);
      Result<uint64_t> now = form_index(into, into.size() - 1);
      if (now.ok()) {
        merged_pool.emplace(SlotKey{seg / m, *now}, copy);
      } else {
        into.pop_back();
        spares_.push_back(copy);
      }
    }
  }
  for (auto& [key, copy] : old) spares_.push_back(copy);  // an earlier recording's slots
  segment_arrays_ = std::move(merged);
  levels_[0] = std::move(merged_pool);
  // Every level-0 slot left holds a start state of this recording.
  for (auto it = used_.begin(); it != used_.end();)
    it = it->first == 0 ? used_.erase(it) : std::next(it);
  for (const auto& [key, copy] : levels_[0]) used_.insert({0, key});
}

void TapeCopies::pin(uint64_t id) {
  if (sizes_.count(id) && session_->runtime().graphs().capturing()) pinned_.insert(id);
}

void TapeCopies::trim(uint64_t budget) {
  // What this recording and its backward did not copy into (an earlier plan's slots) is spare.
  // Inside a capture too: every copy a captured launch names is pinned (Tape::copy_array,
  // copy_segment_start, a fill's leaf copy) and is never freed below, and an earlier plan's
  // slots would otherwise stay beside this one's, past the budget.
  auto drop = [&](std::map<SlotKey, NdArrayHandle>& p, int level) {
    for (auto it = p.begin(); it != p.end();) {
      if (used_.count({level, it->first})) {
        ++it;
        continue;
      }
      spares_.push_back(it->second);
      it = p.erase(it);
    }
  };
  for (size_t level = 0; level < levels_.size(); ++level) {
    drop(levels_[level], static_cast<int>(level));
  }
  drop(end_, kEnd);
  // Spares the next backward takes again (a slot's copies of arrays of two forms) are kept
  // while a budget holds them: freeing them would make them again every iteration. Never one
  // a captured graph launches with (pinned_): freed with the store.
  std::vector<NdArrayHandle> kept;
  while (bytes_ > budget && !spares_.empty()) {
    const NdArrayHandle c = spares_.back();
    spares_.pop_back();
    if (pinned_.count(c.id)) {
      kept.push_back(c);
    } else {
      free(c);
    }
  }
  spares_.insert(spares_.end(), kept.begin(), kept.end());
}

void TapeCopies::free(NdArrayHandle copy) {
  auto it = sizes_.find(copy.id);
  if (it != sizes_.end()) {
    bytes_ -= it->second;
    sizes_.erase(it);
  }
  (void)session_->free(copy);
}

}  // namespace vkad
