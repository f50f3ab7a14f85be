#include "autodiff/checkpoint.h"

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <utility>

#include "ir/rewriter.h"

namespace vkad::codegen {

namespace {

class Segmenter {
 public:
  Segmenter(Kernel& k, const std::unordered_map<ValueId, uint32_t>& loops, uint32_t segment)
      : rw_(k), loops_(loops), segment_(segment) {}

  void block(Block& b) {
    std::vector<Stmt> out;
    out.reserve(b.stmts.size());
    for (Stmt& s : b.stmts) {
      for (Block& c : s.blocks) block(c);
      auto w = s.op == Op::kFor && !s.has_cap ? loops_.find(s.result) : loops_.end();
      if (w != loops_.end()) {
        split(std::move(s), std::max<int64_t>(w->second, 2 * int64_t{segment_} - 1), out);
      } else {
        out.push_back(std::move(s));
      }
    }
    b.stmts = std::move(out);
  }

 private:
  ValueId add(std::vector<Stmt>& out, Op op, std::vector<ValueId> args, DType type = DType::kI32) {
    return Rewriter::append(out, rw_.make(op, type, std::move(args)));
  }
  ValueId constant(std::vector<Stmt>& out, int64_t v) {
    Stmt c = rw_.make(Op::kConst, DType::kI32);
    c.iimm = v;
    return Rewriter::append(out, std::move(c));
  }

  void split(Stmt loop, int64_t whole, std::vector<Stmt>& out) {
    const ValueId begin = loop.args[0], end = loop.args[1], index = loop.result;
    const int64_t K = segment_;
    // n = max(end - begin, 0): an empty or reversed range runs nothing, on the whole path.
    ValueId zero = constant(out, 0);
    ValueId n = add(out, Op::kMax, {add(out, Op::kSub, {end, begin}), zero});
    Stmt branch = rw_.make_if(add(out, Op::kLe, {n, constant(out, whole)}, DType::kBool));

    Block body = std::move(loop.blocks[0]);
    // if (n <= W) for index' in [begin, end) max_trip(W) { body' }
    branch.blocks[0].stmts.push_back(copy_loop(body, index, begin, end, whole));

    // else: full = n / K segments (n > W >= 2K - 1, so at least two), each
    // for s in [0, full) { base = begin + s*K; for jj in [0, K) { index = base + jj; body } }
    // The segment's loop has constant bounds: the driver can unroll it, and its stacks (K
    // entries) are then indexed by constants.
    std::vector<Stmt>& eb = branch.blocks[1].stmts;
    ValueId k = constant(eb, K);
    ValueId full = add(eb, Op::kDiv, {n, k});
    Stmt outer = rw_.make_for(constant(eb, 0), full);
    std::vector<Stmt>& ob = outer.blocks[0].stmts;
    ValueId base = add(ob, Op::kAdd, {begin, add(ob, Op::kMul, {outer.result, k})});
    Stmt inner = rw_.make_for(constant(ob, 0), constant(ob, K));
    // Its stated trip bound (exact) carries into the adjoint's copies of it, which the emitter
    // then marks for unrolling: NVIDIA left the training kernel's 16-step segments rolled on its
    // own (with the mark its adjoint ran 6% faster on the H200).
    inner.has_cap = true;
    inner.cap = SizeExpr::constant(K);
    Stmt idx;  // defines the body's index, unchanged (so no fresh id)
    idx.op = Op::kAdd;
    idx.type = DType::kI32;
    idx.result = index;
    idx.args = {base, inner.result};
    std::vector<Stmt>& ib = inner.blocks[0].stmts;
    ib.push_back(std::move(idx));

    // The rest's copy, made before `body` moves into the segments; its begin follows them.
    Stmt tail = copy_loop(body, index, kNoValue, end, K - 1);
    for (Stmt& st : body.stmts) ib.push_back(std::move(st));
    ob.push_back(std::move(inner));
    eb.push_back(std::move(outer));

    // then for index'' in [begin + full*K, end) max_trip(K - 1) { body'' }: the rest.
    tail.args[0] = add(eb, Op::kAdd, {begin, add(eb, Op::kMul, {full, k})});
    eb.push_back(std::move(tail));
    out.push_back(std::move(branch));
  }

  // for index' in [b, e) max_trip(cap) { a copy of `body` with fresh ids, `index` renamed }.
  Stmt copy_loop(const Block& body, ValueId index, ValueId b, ValueId e, int64_t cap) {
    Stmt f = rw_.make_for(b, e, SizeExpr::constant(cap));
    std::unordered_map<ValueId, ValueId> renamed;
    f.blocks[0] = clone(body, renamed);
    renamed[index] = f.result;
    remap(f.blocks[0], renamed);
    return f;
  }

  // A copy of `b` whose every defined id (values, locals, loop indices, at any depth) is fresh;
  // `renamed` maps old to new. Operands are remapped by remap() once every definition is known.
  Block clone(const Block& b, std::unordered_map<ValueId, ValueId>& renamed) {
    Block c = b;
    std::function<void(Block&)> fresh = [&](Block& blk) {
      for (Stmt& st : blk.stmts) {
        if (st.result != kNoValue) st.result = renamed[st.result] = rw_.kernel().fresh();
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

  Rewriter rw_;  // ids from the kernel being split
  const std::unordered_map<ValueId, uint32_t>& loops_;
  uint32_t segment_;
};

}  // namespace

uint32_t whole_tape_trips(uint32_t segment, size_t values) {
  const uint64_t w = kWholeTapeValues / std::max<size_t>(values, 1);
  return static_cast<uint32_t>(
      std::clamp<uint64_t>(w, 2 * uint64_t{segment} - 1, 4 * uint64_t{segment}));
}

Kernel segment_loops(const Kernel& k, const std::unordered_map<ValueId, uint32_t>& loops,
                     uint32_t segment) {
  Kernel out = k;
  if (segment < 2 || loops.empty()) return out;
  Segmenter s(out, loops, segment);
  for (Task& t : out.tasks) s.block(t.body);
  return out;
}

}  // namespace vkad::codegen
