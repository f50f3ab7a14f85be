#include "graph/graph_schedule.h"

#include <algorithm>
#include <numeric>
#include <unordered_map>
#include <vector>

namespace vkad {

namespace {

using Kind = codegen::ArrayAccess::Kind;

// The kinds that conflict with any of `kinds`: a write conflicts with every access, a read with
// writes and atomic adds, an atomic add with writes and reads (two adds commute).
constexpr uint8_t conflicting(uint8_t kinds) {
  const uint8_t read = kind_bit(Kind::kRead), add = kind_bit(Kind::kAccumulate),
                write = kind_bit(Kind::kOverwrite);
  uint8_t out = 0;
  if (kinds & read) out |= add | write;
  if (kinds & add) out |= read | write;
  if (kinds & write) out |= read | add | write;
  return out;
}

// The highest level of an access of each kind (-1: none) in some set of accesses.
struct Marks {
  int64_t read = -1, add = -1, write = -1;
  void note(Kind k, int64_t level) {
    int64_t& m = k == Kind::kRead ? read : k == Kind::kAccumulate ? add : write;
    m = std::max(m, level);
  }
  void merge(const Marks& o) {
    read = std::max(read, o.read), add = std::max(add, o.add), write = std::max(write, o.write);
  }
  // The highest level among these that an access of kind `k` conflicts with (-1: none).
  int64_t conflict(Kind k) const {
    const uint8_t against = conflicting(kind_bit(k));
    int64_t level = -1;
    if (against & kind_bit(Kind::kRead)) level = std::max(level, read);
    if (against & kind_bit(Kind::kAccumulate)) level = std::max(level, add);
    if (against & kind_bit(Kind::kOverwrite)) level = std::max(level, write);
    return level;
  }
};

// Marks by known row. Rows are a step loop's time indices: dense and near each other, so a
// window of consecutive rows in a vector holds them (a default Marks is "no access", the same
// as a missing row), and a hash map only those far outside it. A graph's rework notes ~10^5
// rows; a hash node per row was the scheduler's main cost.
class RowMarks {
 public:
  const Marks* find(int64_t row) const {
    if (row >= base_ && row - base_ < static_cast<int64_t>(window_.size()))
      return &window_[static_cast<size_t>(row - base_)];
    auto it = far_.find(row);
    return it == far_.end() ? nullptr : &it->second;
  }
  Marks& at(int64_t row) {
    if (window_.empty()) {
      base_ = row;
      window_.resize(1);
    } else if (row < base_) {
      // Grown by as much again at the front: a loop walked backwards stays amortized O(1).
      const int64_t room = std::max<int64_t>(base_ - row, static_cast<int64_t>(window_.size()));
      if (static_cast<int64_t>(window_.size()) + room > kMaxWindow) return far_[row];
      window_.insert(window_.begin(), static_cast<size_t>(room), Marks{});
      base_ -= room;
    } else if (row - base_ >= static_cast<int64_t>(window_.size())) {
      if (row - base_ >= kMaxWindow) return far_[row];
      window_.resize(static_cast<size_t>(row - base_ + 1));
    }
    return window_[static_cast<size_t>(row - base_)];
  }

 private:
  static constexpr int64_t kMaxWindow = 1 << 16;
  int64_t base_ = 0;
  std::vector<Marks> window_;
  std::unordered_map<int64_t, Marks> far_;
};

// Every earlier access of one array: all of them, those at an unknown row, and by known row.
struct ArrayMarks {
  Marks all, any_row;
  RowMarks rows;
  int64_t conflict(const ScheduleAccess& a) const {
    if (a.row == ScheduleAccess::kAnyRow) return all.conflict(a.kind);
    Marks m = any_row;
    if (const Marks* r = rows.find(a.row)) m.merge(*r);
    return m.conflict(a.kind);
  }
  void note(const ScheduleAccess& a, int64_t level) {
    all.note(a.kind, level);
    (a.row == ScheduleAccess::kAnyRow ? any_row : rows.at(a.row)).note(a.kind, level);
  }
};

// What a set of launches touched, with the highest level of each access; a launch that may
// touch anything raises `floor`, which every later launch must be above.
struct Touched {
  std::unordered_map<uint64_t, ArrayMarks> arrays;
  int64_t floor = -1, top = -1;
  int64_t conflict(const ScheduleLaunch& l) const {
    if (!l.known) return top;
    int64_t level = floor;
    for (const ScheduleAccess& a : l.accesses) {
      auto it = arrays.find(a.array);
      if (it != arrays.end()) level = std::max(level, it->second.conflict(a));
    }
    return level;
  }
  void note(const ScheduleLaunch& l, int64_t level) {
    top = std::max(top, level);
    if (!l.known) floor = std::max(floor, level);
    for (const ScheduleAccess& a : l.accesses) arrays[a.array].note(a, level);
  }
};

}  // namespace

namespace {

// ASAP levels of `launches` taken in the order `at(0), at(1), ...`.
template <typename At>
std::vector<uint32_t> asap(size_t n, At at) {
  std::vector<uint32_t> levels(n);
  Touched touched;
  for (size_t i = 0; i < n; ++i) {
    const int64_t level = touched.conflict(at(i)) + 1;
    levels[i] = static_cast<uint32_t>(level);
    touched.note(at(i), level);
  }
  return levels;
}

}  // namespace

bool launches_conflict(const ScheduleLaunch& a, const ScheduleLaunch& b) {
  if (!a.known || !b.known) return true;
  for (const ScheduleAccess& x : a.accesses) {
    for (const ScheduleAccess& y : b.accesses) {
      if (x.array != y.array) continue;
      if (x.row != ScheduleAccess::kAnyRow && y.row != ScheduleAccess::kAnyRow && x.row != y.row)
        continue;
      if (conflicting(kind_bit(x.kind)) & kind_bit(y.kind)) return true;
    }
  }
  return false;
}

std::vector<uint32_t> schedule_levels(std::span<const ScheduleLaunch> launches) {
  const size_t n = launches.size();
  std::vector<uint32_t> levels =
      asap(n, [&](size_t i) -> const ScheduleLaunch& { return launches[i]; });
  // Sinks -- launches no later one conflicts with (their level counted from the end is 0) --
  // go to the last level: nothing waits for them, and where they were they would sit between
  // the launches of the chains (an adjoint's parameter gradients between its steps).
  const std::vector<uint32_t> from_end =
      asap(n, [&](size_t i) -> const ScheduleLaunch& { return launches[n - 1 - i]; });
  uint32_t last = 0;
  for (uint32_t l : levels) last = std::max(last, l);
  for (size_t i = 0; i < n; ++i) {
    if (from_end[n - 1 - i] == 0 && launches[i].known) levels[i] = last;
  }
  return levels;
}

std::vector<uint32_t> schedule_order(std::span<const uint32_t> levels,
                                     std::span<const ScheduleLaunch> launches) {
  std::vector<uint32_t> order(levels.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return levels[a] < levels[b]; });
  std::unordered_map<uint64_t, uint32_t> rank;  // shape -> its place within the level
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin;
    while (end < order.size() && levels[order[end]] == levels[order[begin]]) ++end;
    const uint64_t prev = begin > 0 ? launches[order[begin - 1]].shape : 0;
    // Launches of the shape placed last go first (a chain's next step may fuse with it); the
    // rest grouped by shape in order of first appearance: a level's launches are independent,
    // and those of one shape next to each other fuse (the sinks of a loop -- two kernels'
    // visible outputs per step -- alternated otherwise). One sort by rank.
    rank.clear();
    if (prev != 0) rank.emplace(prev, 0);
    for (size_t g = begin; g < end; ++g) {
      rank.try_emplace(launches[order[g]].shape, static_cast<uint32_t>(rank.size()));
    }
    std::stable_sort(order.begin() + static_cast<std::ptrdiff_t>(begin),
                     order.begin() + static_cast<std::ptrdiff_t>(end), [&](uint32_t a, uint32_t b) {
                       return rank.at(launches[a].shape) < rank.at(launches[b].shape);
                     });
    begin = end;
  }
  return order;
}

struct BarrierTracker::Pending {
  Touched touched;  // since the last barrier, every launch at level 0
  bool empty = true;
};

BarrierTracker::BarrierTracker() : pending_(std::make_unique<Pending>()) {}
BarrierTracker::~BarrierTracker() = default;

bool BarrierTracker::next(const ScheduleLaunch& l) {
  const bool barrier = !pending_->empty && pending_->touched.conflict(l) >= 0;
  if (barrier) pending_->touched = Touched{};
  pending_->touched.note(l, 0);
  pending_->empty = false;
  return barrier;
}

void BarrierTracker::clear() { *pending_ = Pending{}; }

bool ArrayBarrierTracker::next(std::span<const ArrayKinds> accesses, bool known) {
  bool barrier = any_ && (unknown_ || !known);
  for (size_t i = 0; i < accesses.size() && !barrier; ++i) {
    const uint8_t against = conflicting(accesses[i].kinds);
    for (const ArrayKinds& t : touched_) {
      if (t.array == accesses[i].array && (t.kinds & against) != 0) {
        barrier = true;
        break;
      }
    }
  }
  if (barrier) clear();
  any_ = true;
  unknown_ = unknown_ || !known;
  for (const ArrayKinds& a : accesses) {
    auto it = std::find_if(touched_.begin(), touched_.end(),
                           [&](const ArrayKinds& t) { return t.array == a.array; });
    if (it == touched_.end()) {
      touched_.push_back(a);
    } else {
      it->kinds |= a.kinds;
    }
  }
  return barrier;
}

void ArrayBarrierTracker::clear() {
  touched_.clear();
  any_ = false;
  unknown_ = false;
}

std::vector<bool> schedule_barriers(std::span<const ScheduleLaunch> in_order) {
  std::vector<bool> barrier(in_order.size(), false);
  BarrierTracker t;
  for (size_t i = 0; i < in_order.size(); ++i) barrier[i] = t.next(in_order[i]);
  return barrier;
}

}  // namespace vkad
