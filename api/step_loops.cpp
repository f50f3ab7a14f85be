// StepLoops::launch_loop (docs/graphs.md, "Step loops"): a step loop's body launched `count`
// times, as one resident kernel (graph/resident.h) where it may be rolled.
//
// Why here and not only in the graph rework: the rework rolls a captured step loop, but only
// after the capture, so a training loop's first iteration still records and runs every launch
// as captured (DiffTaichi's mass_spring: ~6,800 dependent launches, ~35 ms on an H100, against
// the 6 ms of the rolled graph). A loop said as one gives the rolled kernel at its first run.
#include "api/step_loops.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "api/loop_steps.h"
#include "api/phase_clock.h"
#include "graph/graph_rework.h"
#include "graph/resident.h"
#include "ir/text.h"
#include "runtime/graphs.h"
#include "runtime/runtime.h"

namespace vkad {

namespace {

constexpr uint32_t kMaxLoopLocal = 256;  // as the rework's resident kernels (graph_compiler.cpp)

// Launch `l`'s arguments in iteration r.
void iteration_args(const LoopLaunch& l, int64_t r, std::vector<Arg>* out) {
  out->assign(l.args.begin(), l.args.end());
  for (size_t p = 0; p < l.step.size(); ++p) (*out)[p].i += r * l.step[p];
}

// The loop iteration the launches made in its scope name in their device errors
// (Runtime::set_launch_iteration); none after it.
class IterationNote {
 public:
  explicit IterationNote(runtime::Runtime& rt) : rt_(rt) {}
  ~IterationNote() { rt_.set_launch_iteration(-1); }
  IterationNote(const IterationNote&) = delete;
  IterationNote& operator=(const IterationNote&) = delete;

 private:
  runtime::Runtime& rt_;
};

std::string where(size_t j, int64_t r) {
  return "launch_loop: launch " + std::to_string(j) + " of the body, iteration " +
         std::to_string(r);
}

}  // namespace

Status check_loop_steps(std::span<const Arg> args, std::span<const int32_t> step, uint32_t count) {
  const int64_t last = static_cast<int64_t>(count) - 1;
  if (!step.empty() && step.size() != args.size()) {
    return make_error(ErrorCode::kInvalidArgument, std::to_string(step.size()) + " steps for " +
                                                       std::to_string(args.size()) + " arguments");
  }
  for (size_t p = 0; p < step.size(); ++p) {
    if (step[p] == 0) continue;
    const Arg& x = args[p];
    if (x.kind != abi::ParamKind::kScalar || x.dtype != DType::kI32) {
      return make_error(ErrorCode::kInvalidArgument,
                        "argument " + std::to_string(p) + " steps by " + std::to_string(step[p]) +
                            " per iteration but is not an i32 scalar (only i32 scalars step)");
    }
    // The start first: x.i is a caller's int64, so x.i + last * step could overflow. With x.i
    // in i32 and |last * step| < 2^63 - 2^32, the sum below cannot.
    if (x.i < std::numeric_limits<int32_t>::min() || x.i > std::numeric_limits<int32_t>::max()) {
      return make_error(ErrorCode::kInvalidArgument, "argument " + std::to_string(p) +
                                                         " (i32) value " + std::to_string(x.i) +
                                                         " does not fit");
    }
    const int64_t end = x.i + last * step[p];
    if (end < std::numeric_limits<int32_t>::min() || end > std::numeric_limits<int32_t>::max()) {
      return make_error(ErrorCode::kInvalidArgument, "argument " + std::to_string(p) + " reaches " +
                                                         std::to_string(end) + " at iteration " +
                                                         std::to_string(last) + ", past i32");
    }
  }
  return {};
}

Status StepLoops::check_loop(std::span<const LoopLaunch> body, uint32_t count) const {
  const int64_t last = static_cast<int64_t>(count) - 1;
  std::vector<Arg> a;
  for (size_t j = 0; j < body.size(); ++j) {
    const LoopLaunch& l = body[j];
    VKAD_TRY_CTX(check_loop_steps(l.args, l.step, count), where(j, 0));
    for (int64_t r : {int64_t{0}, last}) {
      iteration_args(l, r, &a);
      VKAD_TRY_CTX(core_.rt->check_launch(l.kernel, a), where(j, r));
    }
  }
  return {};
}

Status StepLoops::launch_loop(std::span<const LoopLaunch> body, uint32_t count, LoopInfo* info) {
  if (info) *info = {};
  if (count == 0 || body.empty()) return {};
  core_.drop_stale_capture();
  PhaseClock clock("vkad loop");
  // Everything checked before anything is launched: a refused loop records nothing.
  VKAD_TRY(check_loop(body, count));
  clock.mark("checks");
  std::vector<Arg> a;
  std::optional<RolledLoop> rolled = roll_loop(body, count, clock);
  const uint32_t first_launch = core_.capture ? core_.capture->launches : 0;
  if (rolled) {
    rolled_args(*rolled, body, &a);
    VKAD_TRY_CTX(session_.launch(rolled->kernel, a), "launch_loop: the rolled loop");
    if (core_.capture) core_.capture_fixed.push_back({first_launch, core_.capture->launches});
    ++rolled_loops_;
    if (info) *info = {true, false, 1};
    // A capture that runs starts it now rather than after the next 64 captured steps.
    if (core_.capture) VKAD_TRY(core_.rt->graphs().cut_capture_run());
    clock.mark("launch (rolled)");
    return {};
  }
  if (!loop_reworks_.empty()) {
    auto known = loop_reworks_.find(loop_key(body, count));
    const bool usable =
        known != loop_reworks_.end() && known->second && zeros_hold(known->second->zeros);
    // Why a loop with a plan runs its launches one by one (a first iteration's cost).
    if (known != loop_reworks_.end() && known->second && !usable) clock.mark("zeros not held");
    if (usable) {
      LoopInfo local;
      LoopInfo* out = info ? info : &local;
      out->reworked = true;
      Status st = launch_reworked(*known->second, out);
      if (core_.capture && core_.capture->launches > first_launch) {
        core_.capture_fixed.push_back({first_launch, core_.capture->launches});
      }
      if (st.ok()) {
        ++reworked_loops_;
        blocked_launches_ += known->second->blocked;
        // As after a rolled loop: a capture that runs starts the loop's dispatches now, while
        // the caller records what follows (wave's backward), not after 64 more captured steps.
        if (core_.capture) VKAD_TRY(core_.rt->graphs().cut_capture_run());
        clock.mark("launches (reworked)");
        return {};
      }
      if (out->launches > 0) return st;  // part of the plan is recorded: as a launch error
      // Refused before anything was recorded (a kernel of the plan the device refused since):
      // the plan is dropped and the launches run one by one.
      known->second.reset();
      out->reworked = false;
    }
  }
  // Launched one at a time, each launch's device errors name its iteration.
  IterationNote note(*core_.rt);
  for (int64_t r = 0; r < static_cast<int64_t>(count); ++r) {
    core_.rt->set_launch_iteration(r);
    for (size_t j = 0; j < body.size(); ++j) {
      iteration_args(body[j], r, &a);
      VKAD_TRY_CTX(session_.launch(body[j].kernel, a), where(j, r));
      if (info) ++info->launches;
    }
  }
  clock.mark("launches");
  return {};
}

std::string StepLoops::loop_key(std::span<const LoopLaunch> body, uint32_t count) {
  // Every bit launch_loop's launches depend on: kernels, arguments (arrays by handle, never
  // reused; scalars by value and type) and steps.
  std::string key;
  auto put = [&](const auto& v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(count);
  for (const LoopLaunch& l : body) {
    put(l.kernel.id);
    put(l.args.size());
    for (const Arg& x : l.args) {
      put(x.kind);
      put(x.dtype);
      put(x.kind == abi::ParamKind::kNdArray ? x.array.id : static_cast<uint64_t>(x.i));
      put(x.f);
    }
    put(l.step.size());
    for (int32_t st : l.step) put(st);
  }
  return key;
}

void StepLoops::loop_accumulates(const LoopLaunch& l, std::vector<uint64_t>* out) const {
  auto ca = core_.capture_access.find(l.kernel.id);
  if (ca == core_.capture_access.end()) return;
  for (const auto& [param, kinds] : ca->second.params) {
    if (param >= l.args.size() || l.args[param].kind != abi::ParamKind::kNdArray) continue;
    if ((kinds & kind_bit(codegen::ArrayAccess::Kind::kAccumulate)) == 0) continue;
    const uint64_t id = l.args[param].array.id;
    if (std::find(out->begin(), out->end(), id) == out->end()) out->push_back(id);
  }
}

std::vector<uint64_t> StepLoops::plan_zeros(const GraphCompiler::PreparedRework& p,
                                            std::span<const LoopLaunch> body,
                                            std::span<const uint64_t> assumed) const {
  // The accumulated arrays of the producers gather recompute copied into their consumers
  // (recompute_pins holds consumer, producer launch numbers in turn, numbered after rolling
  // and blocking: where the rework merged a stretch of the loop and recomputed, every assumed
  // zero). Merging alone relies on no zero: a rolled or blocked kernel runs its members' adds
  // as they are, and a blocked adjoint's rows that hold earlier sums get a stash -- so a
  // blocked adjoint loop whose gradient rows the loss seeded still launches its plan.
  std::vector<uint64_t> zeros;
  if (p.any_rolled && !p.recompute_pins.empty()) {
    zeros.assign(assumed.begin(), assumed.end());
  } else {
    for (size_t i = 1; i < p.recompute_pins.size(); i += 2) {
      loop_accumulates(body[p.recompute_pins[i] % body.size()], &zeros);
    }
  }
  // And those fusion took for zeros: a fused run's loads of an array whose last step before
  // it was a zero fill read the constant, and a fill a fused run made redundant is left out.
  auto add = [&](uint64_t id) {
    if (std::find(zeros.begin(), zeros.end(), id) == zeros.end()) zeros.push_back(id);
  };
  const ShapeOf shape_of = [&](uint64_t id) -> std::optional<std::vector<uint32_t>> {
    Result<std::vector<uint32_t>> shape = core_.rt->shape(NdArrayHandle{id});
    if (!shape.ok()) return std::nullopt;
    return std::move(*shape);
  };
  for (const auto& run : zero_fills_before_runs(p.w.steps, p.w.launches, p.w.runs, shape_of)) {
    for (const auto& [id, step] : run) add(id);
  }
  for (size_t i = 0; i < p.w.steps.size() && i < p.w.dropped.size(); ++i) {
    if (!p.w.steps[i].launch && p.w.dropped[i]) add(p.w.steps[i].args[0].array.id);
  }
  return zeros;
}

namespace {

// The pipelines a plan's launches will use, made now (a first launch would make them), side by
// side on threads (a batch of prepares): a rework's kernels are dozens, each tens to hundreds
// of ms in a cold driver. Best effort: a failure shows at the launch.
void prepare_pipelines(runtime::Runtime& rt, const ReworkPlan& w) {
  struct Batch {  // ended however the walk leaves
    runtime::Runtime& rt;
    explicit Batch(runtime::Runtime& r) : rt(r) { rt.begin_prepare_batch(); }
    ~Batch() { rt.end_prepare_batch(); }
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;
  } batch(rt);
  std::unordered_set<uint64_t> ready;
  (void)walk_plan(
      w, [](size_t, bool) { return Status{}; }, [](size_t, size_t, size_t) {},
      [&](KernelHandle k, std::span<const Arg> args) {
        if (ready.insert(k.id).second) (void)rt.prepare(k, args);
        return Status{};
      });
}

}  // namespace

void StepLoops::rework_loop(std::span<const LoopLaunch> body, uint32_t count) {
  constexpr size_t kMaxLoopReworks = 8;
  if (count < 2 || body.empty() || core_.pipeline.empty()) return;
  // A background rework first installed (as a replay would): until then its kernels sit in the
  // caches under handles the runtime does not know yet, which this plan could take up. Never
  // inside an open capture, as finish_rework (which refuses then) and replay: then no plan.
  if (graphs_.background_pending()) {
    if (core_.rt->graphs().capturing()) return;
    graphs_.settle();
  }
  LoopPlan plan;
  if (plan_loop(body, count, &plan)) return;  // it rolls (ready_loop makes that kernel)
  std::string key = loop_key(body, count);
  if (loop_reworks_.count(key) || !check_loop(body, count).ok()) return;
  PhaseClock clock("vkad loop rework", compiler_.compile_ms());
  // The oldest plan makes room (a loop and its adjoint, prepared together, both stay).
  if (loop_reworks_.size() >= kMaxLoopReworks && !loop_rework_order_.empty()) {
    loop_reworks_.erase(loop_rework_order_.front());
    loop_rework_order_.pop_front();
  }
  loop_rework_order_.push_back(key);
  std::shared_ptr<const LoopRework>& slot = loop_reworks_[key];
  // The arrays the body adds into are taken to be zero at the loop's start (as after the
  // tape's zeroing of its gradients): a fill of each before the launches. The plan keeps the
  // ones it relied on (plan_zeros), which launch_loop checks against the capture's record.
  std::vector<uint64_t> accumulated;
  for (const LoopLaunch& l : body) loop_accumulates(l, &accumulated);
  std::vector<CapturedStep> steps;
  steps.reserve(accumulated.size() + body.size() * count);
  for (uint64_t id : accumulated) steps.push_back({false, {}, {Arg::ndarray({id})}, 0.0});
  for (int64_t r = 0; r < static_cast<int64_t>(count); ++r) {
    for (const LoopLaunch& l : body) {
      steps.push_back({true, l.kernel, {}, 0.0});
      iteration_args(l, r, &steps.back().args);
    }
  }
  compiler_.snapshot_extents(steps);
  std::unique_ptr<GraphCompiler::PreparedRework> p;
  try {
    p = compiler_.prepare_rework(GraphHandle{0}, std::move(steps), "loop");
  } catch (...) {  // out of memory: the loop runs its launches one by one
    GraphCompiler::PreparedRework left;
    left.kernels = compiler_.take_unregistered();
    (void)compiler_.register_rework_kernels(left);  // the caches name them
    return;
  }
  clock.mark("plan");
  if (!compiler_.register_rework_kernels(*p) || !p->rework) return;
  clock.mark("register");
  std::vector<NdArrayHandle> stashes;
  if (!compiler_.materialize_stashes(p->stashes, &p->w, &stashes).ok()) {
    for (NdArrayHandle h : stashes) (void)session_.free(h);
    return;  // out of memory: the loop runs its launches one by one
  }
  loop_stashes_.insert(loop_stashes_.end(), stashes.begin(), stashes.end());
  auto r = std::make_shared<LoopRework>();
  r->zeros = plan_zeros(*p, body, accumulated);
  prepare_pipelines(*core_.rt, p->w);
  clock.mark("pipelines");
  if (!p->any_rolled && p->blocked == 0 && p->w.order.size() == body.size() * count) {
    for (uint32_t captured : p->w.order) {
      r->iteration.push_back(static_cast<int64_t>(captured / body.size()));
    }
  }
  r->blocked = p->blocked;
  r->w = std::move(p->w);
  r->ir = std::move(p->ir);
  slot = std::move(r);
}

bool StepLoops::zeros_hold(std::span<const uint64_t> zeros) const {
  if (zeros.empty()) return true;
  if (!core_.capture) return false;  // outside a capture nothing tells what the arrays hold
  std::vector<uint64_t> open(zeros.begin(), zeros.end());
  const uint8_t writes = kind_bit(codegen::ArrayAccess::Kind::kAccumulate) |
                         kind_bit(codegen::ArrayAccess::Kind::kOverwrite);
  // From the latest step back (the runtime's record of the open capture): each array's last
  // fill must be a zero fill, with no launch since that may write it.
  const runtime::Runtime::Graphs::GraphRecord record = core_.rt->graphs().capture_record();
  for (size_t i = record.size(); i-- > 0 && !open.empty();) {
    const runtime::GraphStep s = record[i];
    if (!s.launch) {
      auto it = std::find(open.begin(), open.end(), s.array.id);
      if (it == open.end()) continue;
      if (s.value != 0.0 || std::signbit(s.value)) return false;  // +0, all bits zero
      open.erase(it);
      continue;
    }
    auto ca = core_.capture_access.find(s.kernel.id);
    if (ca == core_.capture_access.end()) return false;  // it may write anything
    for (const auto& [param, kinds] : ca->second.params) {
      if (param >= s.args.size() || s.args[param].kind != abi::ParamKind::kNdArray) return false;
      if ((kinds & writes) != 0 &&
          std::find(open.begin(), open.end(), s.args[param].array.id) != open.end()) {
        return false;
      }
    }
  }
  return open.empty();
}

Status StepLoops::launch_reworked(const LoopRework& r, LoopInfo* info) {
  // Through Session::launch, not Runtime::Graphs::instantiate: these are the caller's launches, run
  // now or captured into the caller's open capture, whose barriers Session judges as for any
  // launch. A plan's fills are the assumed zeros (rework_loop): never launched. Each launch names
  // its iteration, a fused run the iterations of its members.
  IterationNote note(*core_.rt);
  return walk_plan(
      r.w, [](size_t, bool) { return Status{}; },
      [&](size_t n, size_t, size_t m) {
        const runtime::LaunchOrigin so_far = core_.rt->launch_origin();
        runtime::LaunchOrigin mine = so_far;
        mine.iteration = n < r.iteration.size() ? r.iteration[n] : -1;
        mine.last_iteration = -1;
        core_.rt->set_launch_origin(m == 0 ? mine : runtime::LaunchOrigin::join(so_far, mine));
      },
      [&](KernelHandle k, std::span<const Arg> args) -> Status {
        VKAD_TRY_CTX(
            session_.launch(k, args),
            "launch_loop: launch " + std::to_string(info->launches) + " of the reworked loop");
        ++info->launches;
        return {};
      });
}

std::optional<codegen::LaunchShapes> StepLoops::loop_ranges(const codegen::Kernel& k,
                                                            std::span<const Arg> args) const {
  // From the launch's scalars and the arrays' extents, asked of the runtime: this is the
  // caller's thread, unlike the rework's (which reads a snapshot).
  auto scalar = [&](uint32_t p) -> std::optional<int64_t> {
    if (p >= args.size()) return std::nullopt;
    return args[p].i;
  };
  auto extent = [&](uint32_t p, uint32_t d) -> std::optional<int64_t> {
    if (p >= args.size() || args[p].kind != abi::ParamKind::kNdArray) return std::nullopt;
    Result<uint32_t> e = core_.rt->extent(args[p].array, d);
    if (!e.ok()) return std::nullopt;
    return *e;
  };
  return codegen::launch_shapes(k, scalar, extent,
                                static_cast<int64_t>(core_.graph.resident_max_range));
}

std::optional<codegen::ResidentMember> StepLoops::loop_member(
    const LoopLaunch& l, uint32_t count, std::shared_ptr<const codegen::Kernel>* ir) const {
  const std::shared_ptr<const codegen::Kernel>& rollable = core_.catalog.rollable_ir(l.kernel.id);
  if (!rollable || rollable->params.size() != l.args.size()) return std::nullopt;
  const codegen::Kernel& k = *rollable;
  // Once per kernel (handles are never reused): a loop is planned up to three times per run
  // (prepare_loop, ready_loop, launch_loop) and residable() walks the whole IR.
  auto [known, fresh] = loop_residable_.try_emplace(l.kernel.id, false);
  if (fresh) {
    const bool loops_capped = core_.rt->caps().max_loop_passes != 0;
    known->second = codegen::residable(k) && !(loops_capped && any_task_loops(k));
  }
  if (!known->second) return std::nullopt;
  codegen::ResidentMember m;
  m.kernel = &k;
  m.step.assign(l.args.size(), 0);
  for (size_t p = 0; p < l.step.size(); ++p) m.step[p] = l.step[p];
  // The rolled kernel states its ranges: they must not step.
  std::optional<codegen::LaunchShapes> first = loop_ranges(k, l.args);
  std::vector<Arg> a;
  iteration_args(l, static_cast<int64_t>(count) - 1, &a);
  std::optional<codegen::LaunchShapes> end = loop_ranges(k, a);
  if (!first || !end || !(*first == *end)) return std::nullopt;
  m.ranges = std::move(first->ranges);
  m.boxes = std::move(first->boxes);
  for (const Arg& x : l.args) {
    m.arrays.push_back(x.kind == abi::ParamKind::kNdArray ? x.array.id : 0);
  }
  *ir = rollable;
  return m;
}

bool StepLoops::plan_loop(std::span<const LoopLaunch> body, uint32_t count, LoopPlan* plan) const {
  const RollLimits limits = roll_limits(core_.rt->caps().max_storage_buffers);
  if (core_.graph.resident_max_range == 0 || count < limits.min_reps || body.empty()) return false;
  // The signature: what the rolled kernel depends on -- the kernels, the steps, which
  // parameters share an array (by first use), the ranges, the count and the workgroup size;
  // not the arrays themselves nor the scalars' values (the launch passes them).
  std::unordered_map<uint64_t, size_t> first_use;
  std::string sig = std::to_string(count);
  int64_t widest = 1;
  for (const LoopLaunch& l : body) {
    std::shared_ptr<const codegen::Kernel> ir;
    std::optional<codegen::ResidentMember> m = loop_member(l, count, &ir);
    if (!m) return false;
    sig += "|" + std::to_string(l.kernel.id) + ":";
    for (size_t p = 0; p < m->arrays.size(); ++p) {
      if (m->arrays[p] != 0) {
        auto [at, fresh] = first_use.try_emplace(m->arrays[p], first_use.size());
        sig += "a" + std::to_string(at->second) + ",";
      } else {
        sig += "s" + std::to_string(m->step[p]) + ",";
      }
    }
    for (const auto& [b, e] : m->ranges) {
      sig += std::to_string(b) + "-" + std::to_string(e) + ",";
      widest = std::max(widest, e - b);
    }
    for (const auto& box : m->boxes) {  // an N-d task's box: its points' indices
      sig += "[";
      for (const auto& [b, e] : box) sig += std::to_string(b) + "-" + std::to_string(e) + ",";
      sig += "]";
    }
    plan->period.push_back(std::move(*m));
    plan->ir.push_back(std::move(ir));
  }
  if (first_use.size() > limits.max_arrays) return false;
  plan->count = count;
  plan->local = static_cast<uint32_t>(std::min<int64_t>(
      std::min<uint32_t>(kMaxLoopLocal, core_.target.max_local_size), (widest + 31) / 32 * 32));
  const uint32_t cap = core_.rt->caps().max_loop_passes;
  if (cap != 0 && resident_loop_passes(plan->period, count, plan->local) > cap) return false;
  plan->name = "loop_" + plan->period[0].kernel->name + "_x" + std::to_string(plan->period.size()) +
               "_r" + std::to_string(count);
  plan->signature = std::move(sig) + "|" + std::to_string(plan->local);
  return true;
}

void StepLoops::prepare_loop(std::span<const LoopLaunch> body, uint32_t count) {
  constexpr size_t kMaxLoopJobs = 8;
  graphs_.join();  // plan_loop reads the catalog, which a background rework may be writing
  LoopPlan plan;
  if (!plan_loop(body, count, &plan) || rolled_by_shape_.count(plan.signature)) return;
  for (const std::unique_ptr<LoopJob>& j : loop_jobs_) {
    if (j->plan.signature == plan.signature) return;
  }
  if (loop_jobs_.size() >= kMaxLoopJobs) {
    // The oldest was never launched (a tape's adjoint whose backward never came, say): its
    // compile stays in the compile cache.
    if (loop_jobs_.front()->worker.joinable()) loop_jobs_.front()->worker.join();
    loop_jobs_.erase(loop_jobs_.begin());
  }
  loop_jobs_.reserve(loop_jobs_.size() + 1);  // push_back below cannot throw with a thread live
  auto job = std::make_unique<LoopJob>();
  job->plan = std::move(plan);
  codegen::CompileOptions options = core_.compile_options;
  options.specialize_shapes = true;  // as roll_loop compiles it (loop_kernel)
  LoopJob* j = job.get();
  auto work = [this, j, options]() noexcept {
    try {
      Result<codegen::ResidentKernel> rk =
          codegen::roll_launches(j->plan.period, j->plan.count, j->plan.local, j->plan.name);
      if (!rk.ok() || !within_loop_cap(*rk)) return;
      j->key = codegen::print(rk->kernel);
      j->compiled = core_.compile_cache.compile(rk->kernel, core_.target, options);
      j->rolled = std::move(*rk);
    } catch (...) {
      j->rolled.reset();  // roll_loop then rolls on the caller's thread
    }
  };
  try {
    job->worker = std::thread(work);
  } catch (...) {
    return;  // no thread: launch_loop rolls it itself
  }
  loop_jobs_.push_back(std::move(job));
}

void StepLoops::rolled_args(const RolledLoop& rolled, std::span<const LoopLaunch> body,
                            std::vector<Arg>* out) {
  out->assign(rolled.params, Arg{});
  for (size_t j = 0; j < body.size(); ++j) {
    for (size_t p = 0; p < body[j].args.size(); ++p) {
      (*out)[rolled.param_map[j][p]] = body[j].args[p];
    }
  }
}

void StepLoops::ready_loop(std::span<const LoopLaunch> body, uint32_t count) {
  PhaseClock clock("vkad loop");
  std::optional<RolledLoop> rolled = roll_loop(body, count, clock);
  if (!rolled) return;
  std::vector<Arg> a;
  rolled_args(*rolled, body, &a);
  (void)core_.rt->prepare(rolled->kernel, a);  // an error shows at the launch
  clock.mark("pipelines (ready_loop)");
}

bool StepLoops::loop_rolls(std::span<const LoopLaunch> body, uint32_t count) {
  PhaseClock clock("vkad loop");
  return roll_loop(body, count, clock).has_value();
}

void StepLoops::join_jobs() {
  for (std::unique_ptr<LoopJob>& j : loop_jobs_) {
    if (j->worker.joinable()) j->worker.join();
  }
  loop_jobs_.clear();
}

bool StepLoops::within_loop_cap(const codegen::ResidentKernel& rk) const {
  // plan_loop's estimate leaves out what only the made kernel shows (float atomics that are
  // compare-and-swap loops, the idle passes): the runtime would refuse the launch past the cap.
  const uint32_t cap = core_.rt->caps().max_loop_passes;
  if (cap == 0) return true;
  return codegen::rolled_loop_passes(
             rk, codegen::cas_float_atomics(core_.compile_options, core_.target, false),
             codegen::cas_float_atomics(core_.compile_options, core_.target, true)) <= cap;
}

std::optional<StepLoops::RolledLoop> StepLoops::roll_loop(std::span<const LoopLaunch> body,
                                                          uint32_t count, PhaseClock& clock) {
  graphs_.join();  // plan_loop reads the catalog, which a background rework may be writing
  LoopPlan plan;
  if (!plan_loop(body, count, &plan)) return std::nullopt;
  clock.mark("plan");
  if (auto known = rolled_by_shape_.find(plan.signature); known != rolled_by_shape_.end()) {
    if (!known->second) return std::nullopt;
    return *known->second;
  }
  std::optional<RolledLoop> out;
  auto job = std::find_if(loop_jobs_.begin(), loop_jobs_.end(),
                          [&](const auto& j) { return j->plan.signature == plan.signature; });
  std::optional<codegen::ResidentKernel> rk;
  std::string key;
  std::optional<Result<std::shared_ptr<const runtime::CompiledKernel>>> ck;
  if (job != loop_jobs_.end()) {  // prepare_loop's: rolled and compiled on its thread
    (*job)->worker.join();
    rk = std::move((*job)->rolled);
    key = std::move((*job)->key);
    ck = std::move((*job)->compiled);
    loop_jobs_.erase(job);
    clock.mark("prepared");
  }
  if (!rk) {
    Result<codegen::ResidentKernel> r =
        codegen::roll_launches(plan.period, count, plan.local, plan.name);
    if (r.ok() && within_loop_cap(*r)) rk = std::move(*r);
    clock.mark("roll");
  }
  if (rk) {
    std::optional<KernelHandle> h = loop_kernel(rk->kernel, std::move(key), std::move(ck), clock);
    if (h) out = RolledLoop{*h, std::move(rk->param_map), rk->kernel.params.size()};
  }
  rolled_by_shape_[plan.signature] =
      out ? std::make_shared<const RolledLoop>(*out) : std::shared_ptr<const RolledLoop>();
  return out;
}

std::optional<KernelHandle> StepLoops::loop_kernel(
    const codegen::Kernel& k, std::string key,
    std::optional<Result<std::shared_ptr<const runtime::CompiledKernel>>> ck, PhaseClock& clock) {
  if (key.empty()) {
    key = codegen::print(k);
    clock.mark("print");
  }
  if (auto known = loop_kernels_.find(key); known != loop_kernels_.end()) return known->second;
  graphs_.join();  // refused_kernels_ and register_ir's tables are what a background rework reads
  if (compiler_.refused(key)) return std::nullopt;
  if (!ck) {
    // As the rework's kernels: launched with the shapes it was rolled for, so its extents are
    // pipeline constants and its generic pipeline is made only if a launch needs it.
    codegen::CompileOptions options = core_.compile_options;
    options.specialize_shapes = true;
    ck = core_.compile_cache.compile(k, core_.target, options);
    clock.mark("compile");
  }
  Result<KernelHandle> h = ck->ok() ? core_.register_ir(k, ***ck, /*generic_on_demand=*/true)
                                    : Result<KernelHandle>(ck->status());
  if (!h.ok()) {  // the launches run one by one, now and at later loops of this shape
    compiler_.refuse(std::move(key));
    return std::nullopt;
  }
  clock.mark("register");
  loop_kernels_.emplace(std::move(key), *h);
  return *h;
}

}  // namespace vkad
