#include "autodiff/trip_counter.h"

#include <map>
#include <string>
#include <unordered_map>

#include "abi/kernel_abi.h"
#include "ir/rewriter.h"

namespace vkad::codegen {

namespace {

// The trips parameter both kernels append last: "trips", or "trips_<n>" where a parameter of
// `params` has that name (a kernel that counts its own trips into an array called trips).
Param trips_param(const std::vector<Param>& params) {
  Param trips;
  trips.name = "trips";
  auto taken = [&](const std::string& name) {
    for (const Param& p : params) {
      if (p.name == name) return true;
    }
    return false;
  };
  for (int n = 1; taken(trips.name); ++n) trips.name = "trips_" + std::to_string(n);
  trips.kind = ParamKind::kNdArray;
  trips.dtype = DType::kI32;
  trips.rank = 1;
  return trips;
}

// Adds trip recording to a task of `k` (whose parameter `trips` is the trips array; new ids
// from k): a local per counted loop the task holds (`slot`: loop result id -> its index in
// `loops`), raised before each for loop by `end - begin` and in each while loop's body by
// `i + 1`, and atomic_max-ed into its slot at the end of the body (trip_counter.h). With
// `drop_writes` the task's stores and atomic adds go (the counter's replay); without, every
// statement stays where it was, so the task computes what it computed.
class TripRecorder {
 public:
  TripRecorder(Kernel& k, const std::unordered_map<ValueId, uint32_t>& slot, bool drop_writes)
      : k_(k), rw_(k), slot_(slot), drop_writes_(drop_writes) {}

  // Returns whether `t` holds a counted loop (it is left unchanged if not).
  bool run(Task& t, uint32_t trips, uint32_t slot_run) {
    walk(t.body);
    if (maxima_.empty()) return false;
    std::vector<Stmt> top, tail;
    for (const auto& [j, M] : maxima_) {
      Stmt a = rw_.make(Op::kAlloca, DType::kI32, {});
      a.result = M;
      top.push_back(a);
      store_maximum(t.index, j, M, trips, slot_run, tail);
    }
    t.body.stmts.insert(t.body.stmts.begin(), top.begin(), top.end());
    for (Stmt& x : tail) t.body.stmts.push_back(std::move(x));
    return true;
  }

 private:
  ValueId konst(int64_t v, std::vector<Stmt>& out) {
    return Rewriter::append(out, rw_.make_int(DType::kI32, v));
  }
  // M = max(M, n)
  void raise(ValueId M, ValueId n, std::vector<Stmt>& out) {
    Stmt l = rw_.make(Op::kLoadLocal, DType::kI32, {M});
    Stmt m = rw_.make(Op::kMax, DType::kI32, {l.result, n});
    Stmt st = rw_.make(Op::kStoreLocal, DType::kF32, {M, m.result});
    out.push_back(l), out.push_back(m), out.push_back(st);
  }

  void walk(Block& b) {
    std::vector<Stmt> out;
    for (Stmt& s : b.stmts) {
      if (drop_writes_ && (s.op == Op::kStore || s.op == Op::kAtomicAdd)) continue;
      for (Block& sub : s.blocks) walk(sub);
      auto it = slot_.find(s.result);
      if ((s.op == Op::kFor || s.op == Op::kWhile) && it != slot_.end()) count(s, it->second, out);
      out.push_back(std::move(s));
    }
    b.stmts = std::move(out);
  }
  // Raises loop `s`'s maximum (trips index j): by `end - begin` before a for loop (into
  // `out`), by `i + 1` at the start of a while loop's body.
  void count(Stmt& s, uint32_t j, std::vector<Stmt>& out) {
    auto mx = maxima_.find(j);
    if (mx == maxima_.end()) mx = maxima_.emplace(j, k_.fresh()).first;
    const ValueId M = mx->second;
    if (s.op == Op::kFor) {
      Stmt d = rw_.make(Op::kSub, DType::kI32, {s.args[1], s.args[0]});
      out.push_back(d);
      raise(M, d.result, out);
      return;
    }
    std::vector<Stmt> head;
    ValueId one = konst(1, head);
    Stmt n = rw_.make(Op::kAdd, DType::kI32, {s.result, one});
    head.push_back(n);
    raise(M, n.result, head);
    Block& body = s.blocks[1];
    body.stmts.insert(body.stmts.begin(), head.begin(), head.end());
  }

  // atomic_max of local M into its slot of `trips`: j * kTripSlots + (index / slot_run) mod
  // kTripSlots. Threads spread over kTripSlots words instead of contending for one (the host
  // takes the max over them); runs of slot_run consecutive indices share a word, so that a
  // subgroup can combine its atomics into one (trip_counter.h).
  void store_maximum(ValueId index, uint32_t j, ValueId M, uint32_t trips, uint32_t slot_run,
                     std::vector<Stmt>& tail) {
    ValueId slots = konst(abi::kTripSlots, tail);
    ValueId run_of = index;
    if (slot_run > 1) {
      ValueId run = konst(slot_run, tail);
      Stmt q = rw_.make(Op::kDiv, DType::kI32, {index, run});
      tail.push_back(q);
      run_of = q.result;
    }
    Stmt lane = rw_.make(Op::kMod, DType::kI32, {run_of, slots});
    ValueId base = konst(static_cast<int64_t>(j) * abi::kTripSlots, tail);
    Stmt at_s = rw_.make(Op::kAdd, DType::kI32, {base, lane.result});
    ValueId at = at_s.result;
    tail.push_back(lane), tail.push_back(at_s);
    Stmt l = rw_.make(Op::kLoadLocal, DType::kI32, {M});
    Stmt am = rw_.make(Op::kAtomicMax, DType::kF32, {at, l.result});
    am.param = trips;
    tail.push_back(l), tail.push_back(am);
  }

  Kernel& k_;
  Rewriter rw_;  // makes the statements (fresh ids)
  const std::unordered_map<ValueId, uint32_t>& slot_;
  const bool drop_writes_;
  std::map<uint32_t, ValueId> maxima_;  // trips index -> its local in this task
};

// `f` with the trips parameter appended, each task recording its counted loops; `counter`:
// trip_counter_kernel's variant (no gradients, no writes, tasks without counted loops dropped),
// else counting_forward_kernel's (everything kept).
Kernel with_trips(const Kernel& f, const std::vector<ValueId>& loops, uint32_t slot_run,
                  bool counter) {
  Kernel c;
  c.name = f.name + (counter ? "_trip_count" : "_counting");
  c.params = f.params;
  if (counter) {
    for (Param& p : c.params) p.needs_grad = false;
  }
  const auto trips = static_cast<uint32_t>(c.params.size());
  c.params.push_back(trips_param(c.params));
  c.next_id = f.next_id;
  std::unordered_map<ValueId, uint32_t> slot;  // counted loop (its result id) -> trips index
  for (size_t j = 0; j < loops.size(); ++j) slot[loops[j]] = static_cast<uint32_t>(j);
  for (const Task& t : f.tasks) {
    Task ct = t;
    if (TripRecorder(c, slot, /*drop_writes=*/counter).run(ct, trips, slot_run) || !counter)
      c.tasks.push_back(std::move(ct));
  }
  return c;
}

}  // namespace

Kernel trip_counter_kernel(const Kernel& f, const std::vector<ValueId>& loops, uint32_t slot_run) {
  return with_trips(f, loops, slot_run, /*counter=*/true);
}

Kernel counting_forward_kernel(const Kernel& f, const std::vector<ValueId>& loops,
                               uint32_t slot_run) {
  return with_trips(f, loops, slot_run, /*counter=*/false);
}

}  // namespace vkad::codegen
