// The recompute pass (graph/graph_passes.h, graph/gather_recompute.h): a launch that gathers an
// earlier launch's element-wise output computes it itself, so scheduling no longer makes it wait
// for that launch.
#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "graph/gather_recompute.h"
#include "graph/graph_passes.h"

namespace vkad {

namespace {

using Kind = codegen::ArrayAccess::Kind;

// Whether `k` (its access summary) writes array `id` of a launch with `args`.
bool writes(const codegen::KernelAccess& k, std::span<const Arg> args, uint64_t id) {
  for (const codegen::ParamAccess& p : k.params) {
    if (p.param >= args.size() || args[p.param].array.id != id) continue;
    for (const codegen::ArrayAccess& a : p.accesses) {
      if (a.kind != Kind::kRead) return true;
    }
  }
  return false;
}

bool zero_fill(const CapturedStep& s) {
  return !s.launch && s.value == 0.0 && !std::signbit(s.value);
}

// Whether launch `s` is a fill launch the rename pass made (Program::fill_kernels: `dst`,
// `value`) and, if so, whether it fills +0 (`*zero`).
bool fill_launch(const CapturedStep& s, std::span<const uint64_t> fill_kernels, bool* zero) {
  if (!s.launch || s.args.size() != 2 ||
      std::find(fill_kernels.begin(), fill_kernels.end(), s.kernel.id) == fill_kernels.end())
    return false;
  const Arg& v = s.args[1];
  *zero = v.dtype == runtime::DType::kF32 ? v.f == 0.0 && !std::signbit(v.f) : v.i == 0;
  return true;
}

class RecomputePass final : public GraphPass {
 public:
  std::string name() const override { return "recompute"; }
  Stage stage() const override { return Stage::kRewrite; }

  bool run(Program& p, PassContext& ctx) override {
    ctx_ = &ctx;
    fill_kernels_ = p.fill_kernels;
    // Shape classes by array hold for this run only: an array freed later must not be found
    // here (those by extents stay: recompute_answers_ keys hold them).
    rework_shape_class_.clear();
    std::vector<CapturedStep> out;
    p.any_recomputed = recompute(p.steps, &out, &p.recompute_pins, &p.memo);
    if (p.any_recomputed) p.steps = std::move(out);
    rework_shape_class_.clear();
    ctx_ = nullptr;
    return true;
  }

  void forget(uint64_t id) override {
    for (auto& [key, answer] : recompute_answers_) {
      if (answer.kernel.id == id) answer = RecomputeAnswer{};  // no kernel: stays as launched
    }
  }

 private:
  // `captured` with every launch that gathers an earlier launch's element-wise output
  // rewritten to compute it; `launches` gets the launch numbers whose arguments a rewritten
  // launch carries. False when none was rewritten. `memo` gets every launch step's schedule
  // (empty where a step was rewritten: its kernel changed), for the plan.
  bool recompute(const std::vector<CapturedStep>& captured, std::vector<CapturedStep>* out,
                 std::vector<size_t>* launches, ScheduleMemo* memo);
  std::optional<CapturedStep> recompute_step(
      std::span<const CapturedStep> steps, size_t consumer,
      std::span<const std::vector<uint64_t>> zeros_before,
      const std::unordered_map<uint64_t, size_t>& first_write, size_t* producer_step);
  // The producers of `consumer` that recompute may copy into it, nearest first.
  std::vector<size_t> recompute_producers(std::span<const CapturedStep> steps, size_t consumer,
                                          const std::unordered_map<uint64_t, size_t>& first_write);
  // Whether the producer's inputs are written before it and nothing between it and the
  // consumer writes what it reads or writes.
  bool producer_fits(std::span<const CapturedStep> steps, size_t producer, size_t consumer,
                     const std::unordered_map<uint64_t, size_t>& first_write);
  // `consumer` rewritten to compute what it gathers of `producer`'s outputs, if it does.
  std::optional<CapturedStep> recompute_with(std::span<const CapturedStep> steps, size_t consumer,
                                             size_t producer,
                                             std::span<const std::vector<uint64_t>> zeros_before);
  std::optional<codegen::GatherLaunch> gather_launch(const CapturedStep& s, bool producer) const;
  // The launch-uniform values the kernel indexes with, evaluated for `s` (sorted by value id).
  void gather_uniform(const CapturedStep& s, const codegen::Kernel& k,
                      codegen::UniformWords* out) const;
  std::vector<std::vector<uint64_t>> zero_outputs(std::span<const CapturedStep> steps,
                                                  ScheduleMemo* memo) const;
  // What recompute_gathers' answer for consumer `c` and producer `p` depends on, in words:
  // both kernels, which arguments are the same array, each array's extents (as a shape
  // class), the launch-uniform values (which equal which), the producer's ranges and which
  // of its arrays are known zero. Built from the steps without their GatherLaunches (made
  // only when the answer is not known yet). nullopt where gather_launch would refuse either.
  std::optional<std::vector<uint64_t>> recompute_key(const CapturedStep& c, const CapturedStep& p,
                                                     std::span<const uint64_t> zeros) const;
  // A session-wide number per distinct extents vector (an array's, during a run).
  uint64_t shape_class(uint64_t array) const;
  Result<KernelHandle> recomputed_kernel(const codegen::Kernel& k);

  PassContext* ctx_ = nullptr;          // during run()
  std::vector<uint64_t> fill_kernels_;  // the program's (Program::fill_kernels), during run()
  // shape_class(): by extents for the pass's life (recompute_answers_ keys hold them), by array
  // during a run.
  mutable std::map<std::vector<uint32_t>, uint64_t> shape_classes_;
  mutable std::unordered_map<uint64_t, uint64_t> rework_shape_class_;
  // recompute_key -> the rewritten kernel and its added arguments (kernel id 0: none).
  struct RecomputeAnswer {
    KernelHandle kernel;
    std::vector<uint32_t> producer_param;
  };
  struct WordsHash {
    size_t operator()(const std::vector<uint64_t>& w) const noexcept;
  };
  std::unordered_map<std::vector<uint64_t>, RecomputeAnswer, WordsHash> recompute_answers_;
};

// `k` (s's kernel) is the catalog's IR: its index expressions are found there, once per kernel.
void RecomputePass::gather_uniform(const CapturedStep& s, const codegen::Kernel& /*k*/,
                                   codegen::UniformWords* out) const {
  // Only the values used as indices are asked for (graph/gather_recompute.h); their expressions
  // are found once per kernel, sorted by value id as UniformWords keeps them.
  const KernelCatalog::IndexExprs& exprs = ctx_->catalog.index_exprs(s.kernel.id);
  const codegen::UniformInputs in = ctx_->launch_inputs(s);
  out->sorted.clear();
  out->sorted.reserve(exprs.size());
  for (const auto& [v, e] : exprs) {
    std::optional<uint32_t> w = codegen::evaluate(e, in);
    if (w) out->sorted.emplace_back(v, *w);
  }
}

std::optional<codegen::GatherLaunch> RecomputePass::gather_launch(const CapturedStep& s,
                                                                  bool producer) const {
  // A producer's body is copied as recompute takes it: with its ifs converted where it has any
  // (graph/if_conversion.h; the values the original defines keep their ids, so its index
  // expressions hold for both).
  const std::shared_ptr<const codegen::Kernel> ir =
      producer ? ctx_->catalog.producer_ir(s.kernel.id) : ctx_->catalog.ir(s.kernel.id);
  if (!ir || ir->params.size() != s.args.size()) return std::nullopt;
  const codegen::Kernel& k = *ir;
  codegen::GatherLaunch g;
  g.kernel = &k;
  g.arrays.reserve(s.args.size());
  g.extents.reserve(s.args.size());
  for (const Arg& a : s.args) {
    const bool array = a.kind == abi::ParamKind::kNdArray;
    g.arrays.push_back(array ? a.array.id : 0);
    const std::vector<uint32_t>* shape = array ? ctx_->extents(a.array.id) : nullptr;
    if (array && shape == nullptr) return std::nullopt;
    g.extents.push_back(array ? *shape : std::vector<uint32_t>{});
  }
  gather_uniform(s, k, &g.uniform);
  if (!producer) return g;
  std::optional<std::vector<std::pair<int64_t, int64_t>>> ranges = ctx_->task_ranges(s, k);
  if (!ranges) return std::nullopt;
  g.ranges = std::move(*ranges);
  return g;
}

std::vector<std::vector<uint64_t>> RecomputePass::zero_outputs(std::span<const CapturedStep> steps,
                                                               ScheduleMemo* memo) const {
  // Per step, the arrays the launch adds into (atomic_add) at a known row that holds zeros
  // when it starts: the array's last fill was +0 over the whole array and no launch since
  // wrote that row, or an unknown one. One pass in step order.
  struct Since {
    bool zero = false, any_row = false;
    std::unordered_set<int64_t> rows;
  };
  std::unordered_map<uint64_t, Since> since;  // by array; missing: nothing known
  std::vector<std::vector<uint64_t>> out(steps.size());
  memo->assign(steps.size(), std::nullopt);
  for (size_t i = 0; i < steps.size(); ++i) {
    const CapturedStep& s = steps[i];
    if (!s.launch) {
      if (!s.args.empty()) since[s.args[0].array.id] = Since{zero_fill(s), false, {}};
      continue;
    }
    if (bool zero = false; fill_launch(s, fill_kernels_, &zero)) {
      since[s.args[0].array.id] = Since{zero, false, {}};
      continue;
    }
    StepSchedule& m = (*memo)[i].emplace();
    m.launch = ctx_->schedule_launch(s, &m.pinned);
    const ScheduleLaunch& l = m.launch;
    if (!l.known) {
      since.clear();
      continue;
    }
    for (const ScheduleAccess& a : l.accesses) {
      if (a.kind != Kind::kAccumulate || a.row == ScheduleAccess::kAnyRow) continue;
      auto it = since.find(a.array);
      if (it != since.end() && it->second.zero && !it->second.any_row &&
          !it->second.rows.count(a.row) &&
          std::find(out[i].begin(), out[i].end(), a.array) == out[i].end()) {
        out[i].push_back(a.array);
      }
    }
    for (const ScheduleAccess& a : l.accesses) {
      if (a.kind == Kind::kRead) continue;
      auto it = since.find(a.array);
      if (it == since.end()) continue;
      if (a.row == ScheduleAccess::kAnyRow) {
        it->second.any_row = true;
      } else {
        it->second.rows.insert(a.row);
      }
    }
  }
  return out;
}

std::vector<size_t> RecomputePass::recompute_producers(
    std::span<const CapturedStep> steps, size_t consumer,
    const std::unordered_map<uint64_t, size_t>& first_write) {
  std::vector<size_t> out;
  const CapturedStep& c = steps[consumer];
  const std::shared_ptr<const codegen::KernelAccess>& ca = ctx_->catalog.access(c.kernel.id);
  if (!ca) return out;
  // The nearest earlier launches that write something the consumer touches, up to
  // kMaxWriters of them: the nearest may write only what the consumer reads element-wise or
  // writes in part (a checkpointed tape's copy of the version the consumer then writes), with
  // the launch whose output the consumer gathers before it. Each candidate is checked below
  // against everything between it and the consumer.
  constexpr size_t kMaxWriters = 4;
  size_t writers = 0;
  for (size_t i = consumer; i-- > 0 && writers < kMaxWriters;) {
    if (!steps[i].launch) break;  // fills end the search
    const std::shared_ptr<const codegen::KernelAccess>& pa =
        ctx_->catalog.access(steps[i].kernel.id);
    if (!pa) break;
    bool touched = false;
    for (const codegen::ParamAccess& p : ca->params) {
      touched = touched ||
                (p.param < c.args.size() && writes(*pa, steps[i].args, c.args[p.param].array.id));
    }
    if (!touched) continue;
    ++writers;
    if (ctx_->catalog.recompute_producer(steps[i].kernel.id) &&
        producer_fits(steps, i, consumer, first_write)) {
      out.push_back(i);
    }
  }
  return out;
}

bool RecomputePass::producer_fits(std::span<const CapturedStep> steps, size_t producer,
                                  size_t consumer,
                                  const std::unordered_map<uint64_t, size_t>& first_write) {
  // A producer whose inputs nothing in the graph writes before it (a controller reading its
  // weights) can run ahead of the chain anyway: copying it into the consumer would only
  // lengthen the consumer.
  const CapturedStep& p = steps[producer];
  const codegen::KernelAccess& pk = *ctx_->catalog.access(p.kernel.id);  // the caller found it
  bool fed = false;
  for (const codegen::ParamAccess& q : pk.params) {
    if (q.param >= p.args.size() || writes(pk, p.args, p.args[q.param].array.id)) continue;
    auto w = first_write.find(p.args[q.param].array.id);
    fed = fed || (w != first_write.end() && w->second < producer);
  }
  if (!fed) return false;
  // Nothing between them may write what the producer reads or writes.
  for (size_t i = producer + 1; i < consumer; ++i) {
    const std::shared_ptr<const codegen::KernelAccess>& xa =
        ctx_->catalog.access(steps[i].kernel.id);
    if (!xa) return false;
    for (const codegen::ParamAccess& q : pk.params) {
      if (q.param < p.args.size() && writes(*xa, steps[i].args, p.args[q.param].array.id))
        return false;
    }
  }
  return true;
}

std::optional<CapturedStep> RecomputePass::recompute_step(
    std::span<const CapturedStep> steps, size_t consumer,
    std::span<const std::vector<uint64_t>> zeros_before,
    const std::unordered_map<uint64_t, size_t>& first_write, size_t* producer_step) {
  // The nearest candidate whose outputs the consumer gathers.
  for (size_t producer : recompute_producers(steps, consumer, first_write)) {
    if (std::optional<CapturedStep> out = recompute_with(steps, consumer, producer, zeros_before)) {
      *producer_step = producer;
      return out;
    }
  }
  return std::nullopt;
}

std::optional<CapturedStep> RecomputePass::recompute_with(
    std::span<const CapturedStep> steps, size_t consumer, size_t producer,
    std::span<const std::vector<uint64_t>> zeros_before) {
  const CapturedStep& c = steps[consumer];
  const CapturedStep& p = steps[producer];
  const std::vector<uint64_t>& zeros = zeros_before[producer];
  // A step loop asks the same question once per step: the answer depends on the two kernels
  // and on which arrays, extents, ranges and index values are equal, not on their values.
  std::optional<std::vector<uint64_t>> key = recompute_key(c, p, zeros);
  if (!key) return std::nullopt;
  auto known = recompute_answers_.find(*key);
  if (known == recompute_answers_.end()) {
    std::optional<codegen::GatherLaunch> cg = gather_launch(c, false);
    std::optional<codegen::GatherLaunch> pg = gather_launch(p, true);
    if (!cg || !pg) return std::nullopt;  // recompute_key refuses the same launches
    RecomputeAnswer a;
    std::optional<codegen::Recomputed> r = codegen::recompute_gathers(*cg, *pg, zeros);
    if (r) {
      Result<KernelHandle> h = recomputed_kernel(r->kernel);
      if (h.ok()) a = RecomputeAnswer{*h, std::move(r->producer_param)};
    }
    known = recompute_answers_.emplace(std::move(*key), std::move(a)).first;
  }
  if (known->second.kernel.id == 0) return std::nullopt;  // the launch stays as it was
  CapturedStep out = c;
  out.kernel = known->second.kernel;
  for (uint32_t q : known->second.producer_param) out.args.push_back(p.args[q]);
  return out;
}

size_t RecomputePass::WordsHash::operator()(const std::vector<uint64_t>& w) const noexcept {
  uint64_t h = 14695981039346656037ull;
  for (uint64_t x : w) h = (h ^ x) * 1099511628211ull;
  return static_cast<size_t>(h);
}

uint64_t RecomputePass::shape_class(uint64_t array) const {
  auto [it, fresh] = rework_shape_class_.try_emplace(array, 0);
  if (fresh) {
    const std::vector<uint32_t>* shape = ctx_->extents(array);
    const uint64_t next = shape_classes_.size() + 1;  // 0: no array
    it->second = shape ? shape_classes_.try_emplace(*shape, next).first->second : 0;
  }
  return it->second;
}

std::optional<std::vector<uint64_t>> RecomputePass::recompute_key(
    const CapturedStep& c, const CapturedStep& p, std::span<const uint64_t> zeros) const {
  // Kernels by handle id (never reused in a session); arrays and index values by the first
  // place each distinct one appears, so two steps of a loop give one key; extents by their
  // session-wide shape class. Words, not text: a step loop asks once per step (diffmpm: 2,046
  // times an iteration). The separators are values no count, id or class takes, so two
  // different launch pairs never give one key.
  constexpr uint64_t kEnd = ~0ull, kNext = ~0ull - 1;
  std::vector<uint64_t> key = {c.kernel.id, p.kernel.id};
  key.reserve(192);
  std::vector<uint64_t> seen;  // a few dozen distinct values: a scan beats a hash map
  auto number = [&](uint64_t v) {
    const size_t n = std::find(seen.begin(), seen.end(), v) - seen.begin();
    if (n == seen.size()) seen.push_back(v);
    key.push_back(n);
  };
  codegen::UniformWords words;
  for (const CapturedStep* s : {&c, &p}) {
    const std::shared_ptr<const codegen::Kernel>& ir = ctx_->catalog.ir(s->kernel.id);
    if (!ir || ir->params.size() != s->args.size()) return std::nullopt;
    const codegen::Kernel& k = *ir;
    for (const Arg& a : s->args) {
      if (a.kind != abi::ParamKind::kNdArray) {
        number(0);
        key.push_back(0);
        continue;
      }
      const uint64_t cls = shape_class(a.array.id);
      if (cls == 0) return std::nullopt;  // freed: gather_launch refuses it
      number(a.array.id + (1ull << 40));
      key.push_back(cls);
    }
    key.push_back(kNext);
    gather_uniform(*s, k, &words);
    for (const auto& [v, w] : words.sorted) key.push_back(v), number(w);
    key.push_back(kNext);
    if (s == &p) {
      std::optional<std::vector<std::pair<int64_t, int64_t>>> ranges = ctx_->task_ranges(p, k);
      if (!ranges) return std::nullopt;
      for (const auto& [b, e] : *ranges) {
        key.push_back(static_cast<uint64_t>(b));
        key.push_back(static_cast<uint64_t>(e));
      }
    }
    key.push_back(kEnd);
  }
  // Which of the producer's parameters the known-zero arrays are (their first).
  for (uint64_t z : zeros) {
    size_t q = 0;
    while (q < p.args.size() &&
           !(p.args[q].kind == abi::ParamKind::kNdArray && p.args[q].array.id == z)) {
      ++q;
    }
    key.push_back(q);
  }
  return key;
}

Result<KernelHandle> RecomputePass::recomputed_kernel(const codegen::Kernel& k) {
  // Made once per printed IR (the sink's cache) with its IR and access summary, so scheduling
  // and fusion see it like any kernel of the session; never a producer itself.
  VKAD_ASSIGN_OR_RETURN(KernelHandle h, ctx_->sink.make(k, /*keep_ir=*/true));
  ctx_->catalog.refuse_producer(h.id);
  return h;
}

bool RecomputePass::recompute(const std::vector<CapturedStep>& captured,
                              std::vector<CapturedStep>* out, std::vector<size_t>* launches,
                              ScheduleMemo* memo) {
  *out = captured;
  std::vector<size_t> launch_of(out->size(), 0);  // step -> launch number
  size_t launch = 0;
  for (size_t i = 0; i < out->size(); ++i) launch_of[i] = (*out)[i].launch ? launch++ : launch;
  const std::vector<std::vector<uint64_t>> zeros = zero_outputs(*out, memo);
  std::unordered_map<uint64_t, size_t> first_write;  // array -> the first step writing it
  for (size_t i = 0; i < out->size(); ++i) {
    const CapturedStep& s = (*out)[i];
    if (!s.launch) continue;
    const std::shared_ptr<const codegen::KernelAccess>& a = ctx_->catalog.access(s.kernel.id);
    if (!a) continue;
    for (const codegen::ParamAccess& p : a->params) {
      if (p.param < s.args.size() && writes(*a, s.args, s.args[p.param].array.id))
        first_write.emplace(s.args[p.param].array.id, i);
    }
  }
  bool any = false;
  for (size_t i = 0; i < out->size(); ++i) {
    if (!(*out)[i].launch) continue;
    size_t producer = i;
    std::optional<CapturedStep> r = recompute_step(*out, i, zeros, first_write, &producer);
    if (!r) continue;
    (*out)[i] = std::move(*r);
    (*memo)[i].reset();  // another kernel now: plan_order asks again
    // Both launches' arguments are now in the rewritten one: an update of either needs the
    // graph as captured.
    launches->push_back(launch_of[i]);
    launches->push_back(launch_of[producer]);
    any = true;
  }
  return any;
}

}  // namespace

std::unique_ptr<GraphPass> make_recompute_pass() { return std::make_unique<RecomputePass>(); }

}  // namespace vkad
