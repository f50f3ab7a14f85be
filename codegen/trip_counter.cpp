#include "codegen/trip_counter.h"

#include "abi/kernel_abi.h"

#include <functional>
#include <map>
#include <unordered_map>

namespace vkad::codegen {

Kernel trip_counter_kernel(const Kernel& f, const std::vector<ValueId>& loops, uint32_t slot_run) {
  Kernel c;
  c.name = f.name + "_trip_count";
  c.params = f.params;
  for (Param& p : c.params) p.needs_grad = false;
  Param trips;
  trips.name = "trips";
  trips.kind = ParamKind::kNdArray;
  trips.dtype = DType::kI32;
  trips.rank = 1;
  const uint32_t trips_param = static_cast<uint32_t>(c.params.size());
  c.params.push_back(trips);
  c.next_id = f.next_id;
  std::unordered_map<ValueId, uint32_t> slot;  // counted loop (its result id) -> trips index
  for (size_t j = 0; j < loops.size(); ++j) slot[loops[j]] = static_cast<uint32_t>(j);
  auto mk = [&c](Op op, DType t, std::vector<ValueId> args) {
    Stmt s;
    s.op = op;
    s.type = t;
    s.args = std::move(args);
    if (op_info(op).has_result) s.result = c.fresh();
    return s;
  };
  auto konst = [&](int64_t v, std::vector<Stmt>& out) {
    Stmt s = mk(Op::kConst, DType::kI32, {});
    s.iimm = v;
    s.fimm = static_cast<double>(v);
    out.push_back(s);
    return s.result;
  };
  // M = max(M, n)
  auto raise = [&](ValueId M, ValueId n, std::vector<Stmt>& out) {
    Stmt l = mk(Op::kLoadLocal, DType::kI32, {M});
    Stmt m = mk(Op::kMax, DType::kI32, {l.result, n});
    Stmt st = mk(Op::kStoreLocal, DType::kF32, {M, m.result});
    out.push_back(l), out.push_back(m), out.push_back(st);
  };
  for (const Task& t : f.tasks) {
    std::map<uint32_t, ValueId> maxima;  // trips index -> its local in this task
    std::function<void(Block&)> walk = [&](Block& b) {
      std::vector<Stmt> out;
      for (Stmt& s : b.stmts) {
        if (s.op == Op::kStore || s.op == Op::kAtomicAdd) continue;  // as the adjoint's replay
        for (Block& sub : s.blocks) walk(sub);
        auto it = slot.find(s.result);
        if ((s.op == Op::kFor || s.op == Op::kWhile) && it != slot.end()) {
          auto mx = maxima.find(it->second);
          if (mx == maxima.end()) mx = maxima.emplace(it->second, c.fresh()).first;
          const ValueId M = mx->second;
          if (s.op == Op::kFor) {
            Stmt d = mk(Op::kSub, DType::kI32, {s.args[1], s.args[0]});
            out.push_back(d);
            raise(M, d.result, out);
          } else {
            std::vector<Stmt> head;
            ValueId one = konst(1, head);
            Stmt n = mk(Op::kAdd, DType::kI32, {s.result, one});
            head.push_back(n);
            raise(M, n.result, head);
            Block& body = s.blocks[1];
            body.stmts.insert(body.stmts.begin(), head.begin(), head.end());
          }
        }
        out.push_back(std::move(s));
      }
      b.stmts = std::move(out);
    };
    Task ct = t;
    walk(ct.body);
    if (maxima.empty()) continue;
    std::vector<Stmt> top, tail;
    for (const auto& [j, M] : maxima) {
      Stmt a = mk(Op::kAlloca, DType::kI32, {});
      a.result = M;
      top.push_back(a);
      // Slot j * kTripSlots + (index / slot_run) mod kTripSlots: threads spread over
      // kTripSlots words instead of contending for one (the host takes the max over them);
      // runs of slot_run consecutive indices share a word, so that a subgroup can combine its
      // atomics into one (trip_counter.h).
      ValueId slots = konst(abi::kTripSlots, tail);
      ValueId run_of = ct.index;
      if (slot_run > 1) {
        ValueId run = konst(slot_run, tail);
        Stmt q = mk(Op::kDiv, DType::kI32, {ct.index, run});
        tail.push_back(q);
        run_of = q.result;
      }
      Stmt lane = mk(Op::kMod, DType::kI32, {run_of, slots});
      ValueId base = konst(static_cast<int64_t>(j) * abi::kTripSlots, tail);
      Stmt at_s = mk(Op::kAdd, DType::kI32, {base, lane.result});
      ValueId at = at_s.result;
      tail.push_back(lane), tail.push_back(at_s);
      Stmt l = mk(Op::kLoadLocal, DType::kI32, {M});
      Stmt am = mk(Op::kAtomicMax, DType::kF32, {at, l.result});
      am.param = trips_param;
      tail.push_back(l), tail.push_back(am);
    }
    ct.body.stmts.insert(ct.body.stmts.begin(), top.begin(), top.end());
    for (Stmt& x : tail) ct.body.stmts.push_back(std::move(x));
    c.tasks.push_back(std::move(ct));
  }
  return c;
}

}  // namespace vkad::codegen
