#include "codegen/checkpoint.h"

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
    const ValueId begin = loop.args[0], end = loop.args[1];
    const int64_t K = segment_;
    // n = max(end - begin, 0): an empty or reversed range runs no segment. (n + K - 1) / K
    // cannot overflow where the adstack could hold the loop: its capacity is n entries.
    ValueId zero = constant(out, 0);
    ValueId n = add(out, Op::kMax, {add(out, Op::kSub, {end, begin}), zero});
    ValueId k = constant(out, K);
    ValueId segments = add(out, Op::kDiv, {add(out, Op::kAdd, {n, constant(out, K - 1)}), k});

    Stmt outer;
    outer.op = Op::kFor;
    outer.type = DType::kI32;
    outer.result = k_.fresh();
    outer.args = {zero, segments};
    outer.blocks.resize(1);
    std::vector<Stmt>& body = outer.blocks[0].stmts;
    ValueId base = add(body, Op::kAdd, {begin, add(body, Op::kMul, {outer.result, k})});
    ValueId hi = add(body, Op::kMin, {add(body, Op::kAdd, {base, k}), end});
    loop.args = {base, hi};
    loop.has_cap = true;  // its stacks hold one segment
    loop.cap = SizeExpr::constant(K);
    body.push_back(std::move(loop));
    out.push_back(std::move(outer));
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
