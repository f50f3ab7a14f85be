#include "graph/launch_fusion.h"

#include <algorithm>
#include <bit>
#include <map>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "ir/launch_access.h"

namespace vkad::codegen {

namespace {

// What one kernel does to each of its ndarray parameters.
struct ParamUse {
  bool read = false, written = false;
  bool pointwise = true;  // every access is to an element the invocation owns
  int axis = -1;          // the axis it owns along (the last access's)
};

struct Summary {
  bool ok = true;  // fusible
  // May run beside launches of another range (under a guard of its own): no workgroup
  // barrier or shared memory, which need every invocation of the workgroup to take part, and
  // no print or assert, whose reports name the launch they come from (a run of several ranges
  // joins launches of unrelated origins: a tape entry, a loop step).
  bool side = true;
  std::vector<ParamUse> use;
};

// The axis on which an access with these indices touches only what its invocation owns: one
// index is the task index and every other one launch-uniform (a row the launch's arguments
// decide, a vector's component), so invocation t touches only elements whose coordinate on
// that axis is t. -1 when there is none.
int owned_axis(std::span<const ValueId> indices, ValueId index,
               const std::unordered_set<ValueId>& uniform) {
  int axis = -1;
  for (size_t d = 0; d < indices.size(); ++d) {
    if (indices[d] == index && axis < 0) {
      axis = static_cast<int>(d);
    } else if (!uniform.count(indices[d])) {
      return -1;
    }
  }
  return axis;
}

void scan(const Block& b, ValueId index, const std::unordered_set<ValueId>& uniform, Summary& s) {
  for (const Stmt& st : b.stmts) {
    if (op_info(st.op).family == OpFamily::kStack) {
      s.ok = false;  // adstacks bind the runtime's heaps and size them per launch
      return;
    }
    if (accesses_array(st.op) && st.param < s.use.size()) {
      ParamUse& u = s.use[st.param];
      const bool store = st.op != Op::kLoad;
      (store ? u.written : u.read) = true;
      const size_t indices = st.args.size() - (store ? 1 : 0);
      const int axis =
          owned_axis(std::span<const ValueId>(st.args.data(), indices), index, uniform);
      // An atomic on an owned element is one invocation's read-modify-write like any other.
      // Every access must own along the same axis (x[f, i] and x[i, f] would meet).
      if (axis < 0 || (u.axis >= 0 && u.axis != axis)) u.pointwise = false;
      u.axis = axis;
    }
    if (st.has_cap) s.ok = false;  // a stated trip bound may read scalars: kept out for now
    if (st.op == Op::kBarrier || st.op == Op::kSharedAlloc || st.op == Op::kLoadShared ||
        st.op == Op::kStoreShared || st.op == Op::kPrint || st.op == Op::kAssert) {
      s.side = false;
    }
    for (const Block& c : st.blocks) scan(c, index, uniform, s);
    if (!s.ok) return;
  }
}

bool reads_scalars(const SizeExpr& e) {
  if (e.kind == SizeExpr::Kind::kScalar || e.kind == SizeExpr::Kind::kNegScalar) return true;
  for (const SizeExpr& o : e.operands) {
    if (reads_scalars(o)) return true;
  }
  return false;
}

Summary summarize(const Kernel& k) {
  Summary s;
  s.use.resize(k.params.size());
  if (k.tasks.size() != 1) {
    s.ok = false;
    return s;
  }
  const Task& t = k.tasks[0];
  bool scalar_range = t.begin.kind == RangeBound::Kind::kScalarParam ||
                      t.end.kind == RangeBound::Kind::kScalarParam;
  for (const TaskDim& d : t.dims) {
    scalar_range = scalar_range || reads_scalars(d.begin) || reads_scalars(d.end);
  }
  if (t.serial || t.index == kNoValue || scalar_range) {
    s.ok = false;
    return s;
  }
  // An N-d task's invocations share each coordinate with others (x[i] is touched by every
  // (i, j)): none of its accesses is pointwise, so it fuses only where rows keep members apart.
  scan(t.body, t.dims.empty() ? t.index : kNoValue, launch_uniform_values(k), s);
  return s;
}

void remap_size(SizeExpr& e, const std::vector<uint32_t>& pm) {
  if (e.kind == SizeExpr::Kind::kScalar || e.kind == SizeExpr::Kind::kNegScalar ||
      e.kind == SizeExpr::Kind::kDim) {
    e.param = pm[e.param];
  }
  for (SizeExpr& o : e.operands) remap_size(o, pm);
}

// Per array: which members touch it and whether every touch is pointwise, or at known rows
// that no two members share. `boxes`: the run's ranges (FusionRun's boxes) whose members touch
// it, one bit each: pointwise means nothing between members of two ranges (the same index is
// another element), so a written array touched from two of them must be kept apart by rows.
struct ArrayUse {
  uint32_t members = 0;
  size_t last_member = SIZE_MAX;
  bool written = false, pointwise = true;
  int axis = -1;  // the axis every member owns along (pointwise)
  DType dtype = DType::kF32;
  uint32_t rank = 0;
  bool rows_disjoint = true;
  uint32_t boxes = 0;
  std::vector<std::pair<size_t, int64_t>> rows;  // (member, row) of every touch
  bool across() const { return std::popcount(boxes) > 1; }
  bool safe() const {
    return !written ||
           ((members < 2 || pointwise || rows_disjoint) && (!across() || rows_disjoint));
  }
  bool by_rows() const {
    return written && members > 1 && (!pointwise || across()) && rows_disjoint;
  }
};

// Notes that member `m` touches the array at `row`: another member at the same row, or an
// unknown row, ends what rows can prove.
void note_row(ArrayUse& a, size_t m, int64_t row) {
  if (row == FusionLaunch::kAnyRow) {
    a.rows_disjoint = false;
    return;
  }
  for (const auto& [member, r] : a.rows) {
    if (member != m && r == row) a.rows_disjoint = false;
  }
  a.rows.emplace_back(m, row);
}

// What admit_member changed of one table entry, to take a refused member back out without
// copying the table for every candidate (a graph's fusion tries every launch of a step loop).
struct Undo {
  uint64_t id = 0;
  bool fresh = false;  // the entry was made: erase it
  uint32_t members = 0;
  size_t last_member = SIZE_MAX, rows = 0;
  bool written = false, pointwise = true, rows_disjoint = true;
  uint32_t boxes = 0;
};

void take_back(std::vector<Undo>& undo, std::unordered_map<uint64_t, ArrayUse>& table) {
  for (auto u = undo.rbegin(); u != undo.rend(); ++u) {
    if (u->fresh) {
      table.erase(u->id);
      continue;
    }
    ArrayUse& a = table.at(u->id);
    a.members = u->members;
    a.last_member = u->last_member;
    a.written = u->written;
    a.pointwise = u->pointwise;
    a.rows_disjoint = u->rows_disjoint;
    a.boxes = u->boxes;
    a.rows.resize(u->rows);
  }
  undo.clear();
}

// Adds member `m` (launch `l`, its kernel's summary `sum`, of the run's range `box`) to the
// run's array table; false when that makes an array unsafe (written by one member and touched
// by another other than pointwise along one axis within one range, or at rows no other member
// touches) or one array is seen as two types. Every entry it touches is noted in `undo` first:
// take_back() then restores the table as it was.
bool admit_member(const FusionLaunch& l, size_t m, uint32_t box, const Summary& sum,
                  std::unordered_map<uint64_t, ArrayUse>& table, std::vector<Undo>& undo) {
  const Kernel& k = *l.kernel;
  for (size_t p = 0; p < k.params.size(); ++p) {
    if (k.params[p].kind != ParamKind::kNdArray) continue;
    const ParamUse& u = sum.use[p];
    auto [it, fresh] = table.try_emplace(l.arrays[p]);
    ArrayUse& a = it->second;
    undo.push_back({l.arrays[p], fresh, a.members, a.last_member, a.rows.size(), a.written,
                    a.pointwise, a.rows_disjoint, a.boxes});
    if (fresh) {
      a.dtype = k.params[p].dtype;
      a.rank = k.params[p].rank;
      a.axis = u.axis;
    } else if (a.dtype != k.params[p].dtype || a.rank != k.params[p].rank) {
      return false;
    }
    if (a.last_member != m) {
      ++a.members;
      a.last_member = m;
    }
    a.written = a.written || u.written;
    a.pointwise = a.pointwise && u.pointwise && a.axis == u.axis;
    if (u.read || u.written) a.boxes |= 1u << box;
    if (u.read || u.written) {
      note_row(a, m, l.rows.empty() || a.rank < 2 ? FusionLaunch::kAnyRow : l.rows[p]);
    }
    if (!a.safe()) return false;
  }
  return true;
}

}  // namespace

namespace {

// The number of invocations of launch `l`'s task (its range, or its box's points), saturated
// at INT64_MAX (three extents below 2^31 multiply past it).
int64_t task_size(const FusionLaunch& l) {
  if (l.dims.empty()) return std::max<int64_t>(0, l.end - l.begin);
  int64_t n = 1;
  for (const auto& [lo, hi] : l.dims) {
    if (__builtin_mul_overflow(n, std::max<int64_t>(0, hi - lo), &n)) return INT64_MAX;
  }
  return n;
}

}  // namespace

bool same_box(const FusionLaunch& a, const FusionLaunch& b) {
  return a.begin == b.begin && a.end == b.end && a.dims == b.dims;
}

bool fusible(const Kernel& k) { return summarize(k).ok; }

namespace {

// One run at a time: its members' array table, their ranges, and whether the next launch may
// join.
class RunBuilder {
 public:
  RunBuilder(std::span<const FusionLaunch> launches, uint32_t max_arrays, uint32_t max_launches,
             uint32_t max_ranges)
      : launches_(launches),
        max_arrays_(max_arrays),
        max_launches_(max_launches),
        max_ranges_(std::clamp<uint32_t>(max_ranges, 1, kMaxRunBoxes)) {
    // One summary per kernel (a step loop launches a few kernels thousands of times).
    sum_of_.reserve(launches.size());
    for (const FusionLaunch& l : launches) {
      auto it = by_kernel_.find(l.kernel);
      if (it == by_kernel_.end()) it = by_kernel_.emplace(l.kernel, summarize(*l.kernel)).first;
      sum_of_.push_back(&it->second);
    }
  }

  // The run from launch i: as many launches as may join it.
  FusionRun run_from(size_t i) {
    FusionRun run{i, 1};
    boxes_.assign(1, &launches_[i]);
    arrays_.clear();
    if (!sums(i).ok || !admit(i, 0)) return run;
    nd_ = launches_[i].dims.empty() ? 0 : 1;
    side_ = sums(i).side;
    for (size_t j = i + 1; j < launches_.size() && run.count < max_launches_ && join(j, i); ++j)
      ++run.count;
    return run;
  }
  // Whether the run just built is safe only because of rows.
  bool by_rows() const {
    return std::any_of(arrays_.begin(), arrays_.end(),
                       [](const auto& entry) { return entry.second.by_rows(); });
  }

 private:
  const Summary& sums(size_t i) const { return *sum_of_[i]; }
  // Member m of range `box` into the table; refused (false), the table is as it was.
  bool admit(size_t m, uint32_t box) {
    undo_.clear();
    if (admit_member(launches_[m], m, box, sums(m), arrays_, undo_) &&
        arrays_.size() <= max_arrays_)
      return true;
    take_back(undo_, arrays_);
    return false;
  }
  // Launch j into the run that starts at `first`; false (nothing changed) where it may not.
  bool join(size_t j, size_t first) {
    const FusionLaunch& l = launches_[j];
    if (!sums(j).ok ||
        l.kernel->tasks[0].local_size != launches_[first].kernel->tasks[0].local_size)
      return false;
    if (!l.dims.empty() && nd_ >= kMaxNdMembers) return false;
    size_t box = 0;
    while (box < boxes_.size() && !same_box(*boxes_[box], l)) ++box;
    const bool fresh = box == boxes_.size();
    // Another range: every member, this one too, runs under a guard of its range, in a 1-d
    // task of i32 indices (one past 2^31 invocations runs alone, as the runtime allows it).
    if ((fresh || boxes_.size() > 1) && !(side_ && sums(j).side)) return false;
    if (fresh && (boxes_.size() >= max_ranges_ || task_size(l) > INT32_MAX ||
                  std::any_of(boxes_.begin(), boxes_.end(),
                              [](const FusionLaunch* b) { return task_size(*b) > INT32_MAX; })))
      return false;
    if (fresh) boxes_.push_back(&l);
    if (!admit(j, static_cast<uint32_t>(box))) {
      if (fresh) boxes_.pop_back();
      return false;
    }
    side_ = side_ && sums(j).side;
    nd_ += l.dims.empty() ? 0 : 1;
    return true;
  }

  std::span<const FusionLaunch> launches_;
  uint32_t max_arrays_, max_launches_, max_ranges_;
  std::unordered_map<const Kernel*, Summary> by_kernel_;
  std::vector<const Summary*> sum_of_;
  std::unordered_map<uint64_t, ArrayUse> arrays_;
  std::vector<Undo> undo_;
  std::vector<const FusionLaunch*> boxes_;  // the run's ranges: a launch of each
  uint32_t nd_ = 0;                         // N-d members
  bool side_ = true;                        // every member may run beside another range
};

}  // namespace

std::vector<FusionRun> fusion_groups(std::span<const FusionLaunch> launches, uint32_t max_arrays,
                                     uint32_t max_launches, bool* rows_used, uint32_t max_ranges) {
  std::vector<FusionRun> runs;
  RunBuilder b(launches, max_arrays, max_launches, max_ranges);
  for (size_t i = 0; i < launches.size();) {
    const FusionRun run = b.run_from(i);
    if (run.count > 1 && rows_used) *rows_used = *rows_used || b.by_rows();
    runs.push_back(run);
    i += run.count;
  }
  return runs;
}

namespace {

// Parameters `b` accesses (loads too when `loads`), at any depth.
void accessed_params(const Block& b, bool loads, std::vector<uint32_t>& out) {
  for (const Stmt& s : b.stmts) {
    if (s.op == Op::kStore || s.op == Op::kAtomicAdd || s.op == Op::kAtomicMax ||
        (loads && s.op == Op::kLoad)) {
      out.push_back(s.param);
    }
    for (const Block& c : s.blocks) accessed_params(c, loads, out);
  }
}

// A value of `t` equal to 0, for a load of an array known to hold zeros.
void make_zero(Stmt& s) {
  const ValueId result = s.result;
  const DType t = s.type;
  s = Stmt{};
  s.op = Op::kConst;
  s.result = result;
  s.type = t;
}

}  // namespace

ValueId MemberCopier::value(ValueId v) const {
  if (v == kNoValue) return v;
  if (v == old_index_) return new_index;
  auto it = subst_.find(v);
  return it == subst_.end() ? kNoValue : it->second;
}

Stmt MemberCopier::copy(const Stmt& src) {
  Stmt s = src;
  for (ValueId& a : s.args) a = value(a);
  if (src.result != kNoValue) s.result = subst_[src.result] = into_.fresh();
  if (s.op == Op::kArg || s.op == Op::kShape || accesses_array(s.op)) s.param = pm_[s.param];
  if (s.has_cap) remap_size(s.cap, pm_);
  for (size_t b = 0; b < src.blocks.size(); ++b) {
    s.blocks[b].stmts.clear();
    copy_block(src.blocks[b], s.blocks[b]);
  }
  return s;
}

void MemberCopier::copy_block(const Block& from, Block& to) {
  for (const Stmt& src : from.stmts) {
    if (src.op == Op::kArg && param_values_) {
      auto it = param_values_->find(src.param);
      if (it != param_values_->end()) {
        subst_[src.result] = it->second;
        continue;
      }
    }
    to.stmts.push_back(copy(src));
  }
}

uint32_t merged_param(Kernel& f, std::map<uint64_t, uint32_t>& array_param, const Param& kp,
                      uint64_t array, size_t member) {
  if (kp.kind == ParamKind::kNdArray) {
    auto [it, fresh] = array_param.try_emplace(array, static_cast<uint32_t>(f.params.size()));
    if (!fresh) return it->second;
  }
  Param np = kp;
  np.name = "l" + std::to_string(member) + "_" + kp.name;
  np.needs_grad = false;
  np.read_only = false;  // another member may write the array this one only reads
  f.params.push_back(std::move(np));
  return static_cast<uint32_t>(f.params.size() - 1);
}

namespace {

// What the fused body knows of its arrays as it is assembled member by member. `fwd[param]`:
// the value the body last stored at [index] of the array, at its top level; a later top-level
// load of it at [index] is that value. Safe because every member touching a shared written
// array does so only at [index] (fusion_groups). Arrays known to hold zeros when the run
// starts (`zero`), until the body first touches them: a top-level load at [index] is 0; a
// top-level store at [index] overwrites the invocation's element (`kStored`: every element,
// when the range covers the array); any other access ends what is known.
class BodyFacts {
 public:
  enum class Zero : uint8_t { kZero, kStored, kUnknown };
  BodyFacts(Kernel& f, ValueId index, std::span<const uint64_t> zero_arrays,
            const std::map<uint64_t, uint32_t>& array_param, std::vector<bool> add_as_store)
      : f_(f), index_(index), add_as_store_(std::move(add_as_store)) {
    for (uint64_t id : zero_arrays) {
      auto it = array_param.find(id);
      if (it != array_param.end()) zero_[it->second] = Zero::kZero;
    }
  }
  // Appends the copy `s` of a member's top-level statement to `body`, or drops it where it is
  // a load of a value the body already has (`c` then maps its result to that value).
  void append(Stmt s, ValueId src_result, MemberCopier& c, Block& body) {
    if (s.op == Op::kAtomicAdd && s.args.size() == 2 && s.args[0] == index_ &&
        s.param < add_as_store_.size() && add_as_store_[s.param]) {
      // The element's value (forwarded, a known zero, or loaded), plus the addend, stored: a
      // later load of it is then forwarded.
      const DType type = f_.params[s.param].dtype;
      ValueId held;
      auto it = fwd_.find(s.param);
      if (it != fwd_.end()) {
        held = it->second;
      } else {
        Stmt load;
        load.op = Op::kLoad;
        load.type = type;
        load.param = s.param;
        load.args = {index_};
        load.result = held = f_.fresh();
        auto z = zero_.find(s.param);
        if (z != zero_.end() && z->second == Zero::kZero) make_zero(load);
        body.stmts.push_back(std::move(load));
      }
      Stmt add;
      add.op = Op::kAdd;
      add.type = type;
      add.args = {held, s.args[1]};
      add.result = f_.fresh();
      Stmt store;
      store.op = Op::kStore;
      store.param = s.param;
      store.args = {index_, add.result};
      body.stmts.push_back(std::move(add));
      s = std::move(store);
    }
    const bool indexed_load = s.op == Op::kLoad && s.args.size() == 1 && s.args[0] == index_;
    if (indexed_load) {
      auto it = fwd_.find(s.param);
      if (it != fwd_.end()) {
        c.substitute(src_result, it->second);
        return;
      }
      auto z = zero_.find(s.param);
      if (z != zero_.end() && z->second == Zero::kZero) make_zero(s);
    }
    std::vector<uint32_t> nested;
    for (const Block& b : s.blocks) accessed_params(b, true, nested);
    for (uint32_t p : nested) {
      fwd_.erase(p);  // erasing for a nested load too is merely conservative
      touch(p, Zero::kUnknown);
    }
    if (s.op == Op::kStore && s.args.size() == 2 && s.args[0] == index_) {
      fwd_[s.param] = s.args[1];
      touch(s.param, Zero::kStored);
    } else if (accesses_array(s.op) && !indexed_load) {
      if (s.op != Op::kLoad) fwd_.erase(s.param);
      touch(s.param, Zero::kUnknown);
    }
    body.stmts.push_back(std::move(s));
  }
  // The arrays every invocation overwrote at [index] before anything else touched them.
  std::vector<uint64_t> overwritten(const std::map<uint64_t, uint32_t>& array_param) const {
    std::vector<uint64_t> out;
    for (const auto& [id, p] : array_param) {
      auto z = zero_.find(p);
      if (z != zero_.end() && z->second == Zero::kStored) out.push_back(id);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  void touch(uint32_t p, Zero to) {
    auto it = zero_.find(p);
    if (it != zero_.end() && it->second == Zero::kZero) it->second = to;
  }
  Kernel& f_;  // the fused kernel: its parameters' types, fresh ids
  ValueId index_;
  std::vector<bool> add_as_store_;  // by fused parameter: atomic adds at [index] stored
  std::unordered_map<uint32_t, ValueId> fwd_;
  std::unordered_map<uint32_t, Zero> zero_;
};

// By fused parameter: whether the run's atomic adds into the array may be a load, an add and
// a store. Where a member reads the array the run adds into, the fused launch reads it too: a
// graph then runs it with a barrier before and after it against every other launch touching
// the array (graph_schedule.h: a read conflicts with an add), so only its own invocations
// change the array meanwhile; where every access of the run is at [index], at the top level
// of a member's body, each element is one invocation's. The store then lets a later member's
// load take the sum from the body (BodyFacts) instead of from memory after an atomic (an
// adjoint's gradient added by one step's adjoint and read by the next one's).
std::vector<bool> adds_as_stores(std::span<const FusionLaunch> run,
                                 const std::vector<std::vector<uint32_t>>& param_map,
                                 const Kernel& f) {
  std::vector<bool> own(f.params.size(), true), loaded(f.params.size(), false),
      added(f.params.size(), false);
  for (size_t m = 0; m < run.size(); ++m) {
    const Task& kt = run[m].kernel->tasks[0];
    const std::vector<uint32_t>& pm = param_map[m];
    for (const Stmt& s : kt.body.stmts) {
      std::vector<uint32_t> nested;
      for (const Block& b : s.blocks) accessed_params(b, true, nested);
      for (uint32_t p : nested) own[pm[p]] = false;
      if (!accesses_array(s.op)) continue;
      const size_t indices = s.args.size() - (s.op == Op::kLoad ? 0 : 1);
      if (indices != 1 || s.args[0] != kt.index) own[pm[s.param]] = false;
      if (s.op == Op::kLoad) loaded[pm[s.param]] = true;
      if (s.op == Op::kAtomicAdd) added[pm[s.param]] = true;
      if (s.op == Op::kAtomicMax) own[pm[s.param]] = false;
    }
  }
  std::vector<bool> out(f.params.size(), false);
  for (size_t p = 0; p < out.size(); ++p) out[p] = own[p] && loaded[p] && added[p];
  return out;
}

// Loads at [index] of arrays no member writes go first: the invocation then has them all in
// flight at once instead of one member's after the previous member's stores (a driver cannot
// move a load above a store to another binding that might alias it).
void hoist_read_only_loads(Task& t) {
  std::vector<uint32_t> written;
  accessed_params(t.body, false, written);
  std::vector<Stmt> hoisted, rest;
  for (Stmt& s : t.body.stmts) {
    const bool read_only_load = s.op == Op::kLoad && s.args.size() == 1 && s.args[0] == t.index &&
                                std::find(written.begin(), written.end(), s.param) == written.end();
    (read_only_load ? hoisted : rest).push_back(std::move(s));
  }
  t.body.stmts = std::move(hoisted);
  for (Stmt& s : rest) t.body.stmts.push_back(std::move(s));
}

// The fused task's shell: the first member's range (an N-d task's box) and workgroup size,
// its bounds' array parameters renamed through `pm`.
Task fused_task(const Task& t0, const std::vector<uint32_t>& pm, Kernel& f) {
  Task t;
  t.name = "fused";
  t.local_size = t0.local_size;
  t.begin = t0.begin;
  t.end = t0.end;
  if (t.begin.kind == RangeBound::Kind::kArrayDim) t.begin.param = pm[t.begin.param];
  if (t.end.kind == RangeBound::Kind::kArrayDim) t.end.param = pm[t.end.param];
  t.index = f.fresh();
  for (size_t d = 0; d < t0.dims.size(); ++d) {
    TaskDim& nd = t.dims.emplace_back(t0.dims[d]);
    remap_size(nd.begin, pm);
    remap_size(nd.end, pm);
    nd.index = d == 0 ? t.index : f.fresh();
  }
  return t;
}

// The number of invocations of launch `l`'s task (its range, or its box's points).

// Appends `s` to `b`, returning its result.
ValueId emit(Kernel& f, Block& b, Stmt s) {
  if (op_info(s.op).has_result) s.result = f.fresh();
  const ValueId r = s.result;
  b.stmts.push_back(std::move(s));
  return r;
}

ValueId emit_i32(Kernel& f, Block& b, int64_t v) {
  Stmt s;
  s.op = Op::kConst;
  s.type = DType::kI32;
  s.iimm = v;
  s.fimm = static_cast<double>(v);
  return emit(f, b, std::move(s));
}

ValueId emit_binary(Kernel& f, Block& b, Op op, ValueId x, ValueId y) {
  Stmt s;
  s.op = op;
  s.type = op_info(op).family == OpFamily::kCompare ? DType::kBool : DType::kI32;
  s.args = {x, y};
  return emit(f, b, std::move(s));
}

// `fuse_launches` for a run of several ranges (fusion_groups): one 1-d task of the largest
// range's size; per range, in order of first appearance, its members under `index < size`
// (no guard for the largest), their task indices rebuilt from the index -- `begin + index`, or
// an N-d box's coordinates row-major -- and assembled as a run of their own (forwarding and
// known zeros within the range; the caller's zero arrays only for the first member's range,
// the one they were found for).
Status fuse_side_by_side(std::span<const FusionLaunch> run, std::span<const uint64_t> zero_arrays,
                         const std::map<uint64_t, uint32_t>& array_param, FusedKernel& out) {
  Kernel& f = out.kernel;
  std::vector<std::vector<size_t>> by_box;  // members, grouped by range in order of appearance
  for (size_t m = 0; m < run.size(); ++m) {
    auto it = std::find_if(by_box.begin(), by_box.end(), [&](const std::vector<size_t>& g) {
      return same_box(run[g[0]], run[m]);
    });
    if (it == by_box.end()) {
      by_box.push_back({m});
    } else {
      it->push_back(m);
    }
  }
  int64_t most = 0;
  for (const std::vector<size_t>& g : by_box) most = std::max(most, task_size(run[g[0]]));
  if (most > INT32_MAX) {
    return make_error(ErrorCode::kInvalidArgument, "fuse_launches: a range past 2^31 invocations");
  }
  Task t;
  t.name = "fused";
  t.local_size = run[0].kernel->tasks[0].local_size;
  t.begin = RangeBound::constant(0);
  t.end = RangeBound::constant(most);
  t.index = f.fresh();
  for (size_t g = 0; g < by_box.size(); ++g) {
    const FusionLaunch& box = run[by_box[g][0]];
    const int64_t size = task_size(box);
    Block* into = &t.body;
    Stmt guard;
    if (size < most) {
      guard.op = Op::kIf;
      guard.type = DType::kBool;
      guard.args = {emit_binary(f, t.body, Op::kLt, t.index, emit_i32(f, t.body, size))};
      guard.blocks.resize(2);
      into = &guard.blocks[0];
    }
    // The range's task indices from the fused index.
    std::vector<ValueId> index;
    if (box.dims.empty()) {
      index.push_back(
          box.begin == 0 ? t.index
                         : emit_binary(f, *into, Op::kAdd, t.index, emit_i32(f, *into, box.begin)));
    } else {
      index.resize(box.dims.size());
      ValueId rest = t.index;
      for (size_t d = box.dims.size(); d-- > 0;) {
        const auto [lo, hi] = box.dims[d];
        ValueId coord = rest;
        if (d > 0) {
          const ValueId extent = emit_i32(f, *into, hi - lo);
          coord = emit_binary(f, *into, Op::kMod, rest, extent);
          rest = emit_binary(f, *into, Op::kFloorDiv, rest, extent);
        }
        index[d] = lo == 0 ? coord : emit_binary(f, *into, Op::kAdd, coord, emit_i32(f, *into, lo));
      }
    }
    std::vector<FusionLaunch> members;
    std::vector<std::vector<uint32_t>> maps;
    for (size_t m : by_box[g]) {
      members.push_back(run[m]);
      maps.push_back(out.param_map[m]);
    }
    const bool nd = !box.dims.empty();
    BodyFacts facts(f, nd ? kNoValue : index[0],
                    nd || g > 0 ? std::span<const uint64_t>() : zero_arrays, array_param,
                    nd ? std::vector<bool>() : adds_as_stores(members, maps, f));
    for (size_t m : by_box[g]) {
      const Task& kt = run[m].kernel->tasks[0];
      MemberCopier c(f, kt.index, out.param_map[m]);
      c.new_index = index[0];
      for (size_t d = 1; d < kt.dims.size(); ++d) c.substitute(kt.dims[d].index, index[d]);
      for (const Stmt& src : kt.body.stmts) facts.append(c.copy(src), src.result, c, *into);
    }
    if (g == 0) out.overwritten = facts.overwritten(array_param);
    if (size < most) t.body.stmts.push_back(std::move(guard));
  }
  f.tasks.push_back(std::move(t));
  return {};
}

}  // namespace

Result<FusedKernel> fuse_launches(std::span<const FusionLaunch> run, const std::string& name,
                                  std::span<const uint64_t> zero_arrays) {
  if (run.empty()) return make_error(ErrorCode::kInvalidArgument, "fuse_launches: no launch");
  FusedKernel out;
  Kernel& f = out.kernel;
  f.name = name;
  std::map<uint64_t, uint32_t> array_param;  // array identity -> fused parameter
  for (size_t m = 0; m < run.size(); ++m) {
    const Kernel& k = *run[m].kernel;
    if (!fusible(k)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "fuse_launches: kernel '" + k.name + "' cannot be fused");
    }
    if (k.tasks[0].dims.size() != run[m].dims.size()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "fuse_launches: member " + std::to_string(m) + " (kernel '" + k.name +
                            "') has a box of another rank than its task's");
    }
    std::vector<uint32_t>& pm = out.param_map.emplace_back(k.params.size());
    for (size_t p = 0; p < k.params.size(); ++p) {
      pm[p] = merged_param(f, array_param, k.params[p], run[m].arrays[p], m);
    }
  }
  for (size_t m = 1; m < run.size(); ++m) {
    if (!same_box(run[m], run[0])) {
      VKAD_TRY(fuse_side_by_side(run, zero_arrays, array_param, out));
      return out;
    }
  }
  Task t = fused_task(run[0].kernel->tasks[0], out.param_map[0], f);
  // An N-d body forwards and knows zeros of nothing: its [index] is not one invocation's.
  const bool nd = !t.dims.empty();
  BodyFacts facts(f, nd ? kNoValue : t.index, nd ? std::span<const uint64_t>() : zero_arrays,
                  array_param, nd ? std::vector<bool>() : adds_as_stores(run, out.param_map, f));
  for (size_t m = 0; m < run.size(); ++m) {
    const Task& kt = run[m].kernel->tasks[0];
    MemberCopier c(f, kt.index, out.param_map[m]);
    c.new_index = t.index;
    for (size_t d = 1; d < kt.dims.size() && d < t.dims.size(); ++d) {
      c.substitute(kt.dims[d].index, t.dims[d].index);
    }
    for (const Stmt& src : kt.body.stmts) facts.append(c.copy(src), src.result, c, t.body);
  }
  out.overwritten = facts.overwritten(array_param);
  hoist_read_only_loads(t);
  f.tasks.push_back(std::move(t));
  return out;
}

}  // namespace vkad::codegen
