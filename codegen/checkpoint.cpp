#include "codegen/checkpoint.h"

#include <functional>
#include <unordered_map>
#include <utility>

namespace vkad::codegen {

namespace {

class Segmenter {
 public:
  Segmenter(Kernel& k, const std::unordered_set<ValueId>& loops, uint32_t segment)
      : k_(k), loops_(loops), segment_(segment) {}

  void block(Block& b) {
    std::vector<Stmt> out;
    out.reserve(b.stmts.size());
    for (Stmt& s : b.stmts) {
      for (Block& c : s.blocks) block(c);
      if (s.op == Op::kFor && !s.has_cap && loops_.count(s.result)) {
        split(std::move(s), out);
      } else {
        out.push_back(std::move(s));
      }
    }
    b.stmts = std::move(out);
  }

 private:
  ValueId add(std::vector<Stmt>& out, Op op, std::vector<ValueId> args) {
    Stmt s;
    s.op = op;
    s.type = DType::kI32;
    s.args = std::move(args);
    s.result = k_.fresh();
    out.push_back(std::move(s));
    return out.back().result;
  }
  ValueId constant(std::vector<Stmt>& out, int64_t v) {
    Stmt s;
    s.op = Op::kConst;
    s.type = DType::kI32;
    s.iimm = v;
    s.result = k_.fresh();
    out.push_back(std::move(s));
    return out.back().result;
  }

  void split(Stmt loop, std::vector<Stmt>& out) {
    const ValueId begin = loop.args[0], end = loop.args[1], index = loop.result;
    const int64_t K = segment_;
    // n = max(end - begin, 0): an empty or reversed range runs nothing. full = n / K segments of
    // exactly K iterations, then the remainder (fewer than K) -- unless n < 2K: then no segment
    // and all of it in the remainder, checkpointed every iteration as without segments (one
    // segment would only add a replay, and on the H200 the sin loop's adjoint at 16 steps took
    // 1.6x as long split). full = (n / K) * min(n / 2K, 1) keeps its range derivable.
    ValueId zero = constant(out, 0);
    ValueId n = add(out, Op::kMax, {add(out, Op::kSub, {end, begin}), zero});
    ValueId k = constant(out, K);
    ValueId any =
        add(out, Op::kMin, {add(out, Op::kDiv, {n, constant(out, 2 * K)}), constant(out, 1)});
    ValueId full = add(out, Op::kMul, {add(out, Op::kDiv, {n, k}), any});

    // for s in [0, full) { base = begin + s*K; for jj in [0, K) { index = base + jj; body } }
    // The segment's loop has constant bounds: the driver can unroll it, and its stacks (K
    // entries) are then indexed by constants.
    Stmt outer = for_stmt(zero, full);
    std::vector<Stmt>& ob = outer.blocks[0].stmts;
    ValueId base = add(ob, Op::kAdd, {begin, add(ob, Op::kMul, {outer.result, k})});
    Stmt inner = for_stmt(zero, k);
    Stmt idx;
    idx.op = Op::kAdd;
    idx.type = DType::kI32;
    idx.result = index;
    idx.args = {base, inner.result};
    std::vector<Stmt>& ib = inner.blocks[0].stmts;
    ib.push_back(std::move(idx));
    Block body = std::move(loop.blocks[0]);
    std::unordered_map<ValueId, ValueId> renamed;
    Block copy = clone(body, renamed);  // the remainder's body, before `body` moves
    for (Stmt& st : body.stmts) ib.push_back(std::move(st));
    ob.push_back(std::move(inner));
    out.push_back(std::move(outer));

    // for index' in [begin + full*K, end) max_trip(2K - 1) { body' }: fewer than K iterations
    // after segments, fewer than 2K without.
    ValueId rest = add(out, Op::kAdd, {begin, add(out, Op::kMul, {full, k})});
    Stmt tail = for_stmt(rest, end);
    tail.has_cap = true;
    tail.cap = SizeExpr::constant(2 * K - 1);
    renamed[index] = tail.result;
    remap(copy, renamed);
    tail.blocks[0] = std::move(copy);
    out.push_back(std::move(tail));
  }

  Stmt for_stmt(ValueId b, ValueId e) {
    Stmt f;
    f.op = Op::kFor;
    f.type = DType::kI32;
    f.result = k_.fresh();
    f.args = {b, e};
    f.blocks.resize(1);
    return f;
  }

  // A copy of `b` whose every defined id (values, locals, loop indices, at any depth) is fresh;
  // `renamed` maps old to new. Operands are remapped by remap() once every definition is known.
  Block clone(const Block& b, std::unordered_map<ValueId, ValueId>& renamed) {
    Block c = b;
    std::function<void(Block&)> fresh = [&](Block& blk) {
      for (Stmt& st : blk.stmts) {
        if (st.result != kNoValue) st.result = renamed[st.result] = k_.fresh();
        for (Block& sub : st.blocks) fresh(sub);
      }
    };
    fresh(c);
    return c;
  }
  static void remap(Block& b, const std::unordered_map<ValueId, ValueId>& renamed) {
    for (Stmt& st : b.stmts) {
      for (ValueId& a : st.args) {
        auto it = renamed.find(a);
        if (it != renamed.end()) a = it->second;
      }
      for (Block& sub : st.blocks) remap(sub, renamed);
    }
  }

  Kernel& k_;
  const std::unordered_set<ValueId>& loops_;
  uint32_t segment_;
};

}  // namespace

Kernel segment_loops(const Kernel& k, const std::unordered_set<ValueId>& loops, uint32_t segment) {
  Kernel out = k;
  if (segment < 2 || loops.empty()) return out;
  Segmenter s(out, loops, segment);
  for (Task& t : out.tasks) s.block(t.body);
  return out;
}

}  // namespace vkad::codegen
