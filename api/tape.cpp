#include "api/tape.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "api/loop_steps.h"
#include "api/tape_copies.h"
#include "api/tape_hazards.h"
#include "runtime/graphs.h"
#include "runtime/runtime.h"

namespace vkad {

namespace {

std::string label(NdArrayHandle a) { return "ndarray " + runtime::handle_string(a.id); }

// Names the launches made in its scope for their device errors ("in launch #12 (the adjoint
// of tape entry 3)"; Runtime::set_launch_note).
class LaunchNote {
 public:
  LaunchNote(Session& s, const char* what, uint64_t index) : rt_(s.runtime()) {
    rt_.set_launch_note(what, index);
  }
  ~LaunchNote() { rt_.set_launch_note(nullptr, 0); }
  LaunchNote(const LaunchNote&) = delete;
  LaunchNote& operator=(const LaunchNote&) = delete;

 private:
  runtime::Runtime& rt_;
};

std::string format_double(double v) {  // as Runtime::fill prints a value
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// What Tape::backward refuses of a seed (`differentiated`: whether its array is a grad argument
// of a recorded launch), before anything is made or recorded.
Status check_seed(Session& session, const TapeSeed& s, bool differentiated) {
  if (!differentiated) {
    return make_error(ErrorCode::kInvalidArgument,
                      "tape.backward: seed for " + label(s.array) +
                          ", which is not a differentiated (grad) argument of any recorded "
                          "launch");
  }
  VKAD_ASSIGN_OR_RETURN_CTX(DType t, session.dtype(s.array), "tape.backward");
  if (s.data != nullptr) {
    VKAD_ASSIGN_OR_RETURN_CTX(std::vector<uint32_t> shape, session.shape(s.array), "tape.backward");
    uint64_t bytes = runtime::dtype_bytes(t);
    for (uint32_t e : shape) bytes *= e;
    if (s.bytes != bytes) {
      return make_error(ErrorCode::kInvalidArgument, "tape.backward: seed for " + label(s.array) +
                                                         ": " + std::to_string(s.bytes) +
                                                         " bytes given, the array holds " +
                                                         std::to_string(bytes));
    }
  } else if (t == DType::kF32 && std::isfinite(s.value) && std::fabs(s.value) > FLT_MAX) {
    return make_error(ErrorCode::kInvalidArgument, "tape.backward: seed for " + label(s.array) +
                                                       ": value " + format_double(s.value) +
                                                       " does not fit f32");
  }
  return {};
}

}  // namespace

Tape::Tape(Session& session)
    : session_(&session),
      hazards_(std::make_unique<TapeHazards>()),
      copies_(std::make_unique<TapeCopies>(session)) {}

Tape::~Tape() {
  free_before();
  for (auto& [array, g] : grads_) {
    if (g.owned) (void)session_->free(g.grad);  // deferred past in-flight uses by the runtime
  }
  for (auto& [key, g] : scalar_grads_) (void)session_->free(g.grad);
}

uint64_t Tape::checkpoint_bytes() const { return copies_->bytes(); }

Status Tape::set_checkpointing(const char* what, uint32_t every, uint64_t budget) {
  if (!records_.empty()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      std::string("tape.") + what + ": " + std::to_string(records_.size()) +
                          " launches are recorded; set it before a recording (or after reset())");
  }
  checkpoint_every_ = every;
  memory_budget_ = budget;
  planned_top_ = 0;
  planned_top_bytes_ = 0;
  return {};
}

Status Tape::set_checkpoint_every(uint32_t launches_per_segment) {
  return set_checkpointing("set_checkpoint_every", launches_per_segment, 0);
}

Status Tape::set_memory_budget(uint64_t bytes) {
  return set_checkpointing("set_memory_budget", 0, bytes);
}

Result<codegen::CheckpointPlan> Tape::checkpoint_plan() const {
  return checkpoint_plan("tape.checkpoint_plan");
}

Result<codegen::CheckpointPlan> Tape::checkpoint_plan(const std::string& what) const {
  if (!checkpointing() || records_.empty()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      what + ": " +
                          (checkpointing() ? "nothing is recorded"
                                           : "checkpointing is off (set_memory_budget or "
                                             "set_checkpoint_every)"));
  }
  uint64_t state = 0;
  for (const auto& [array, bytes] : state_bytes_) state += bytes;
  const uint32_t n = static_cast<uint32_t>(records_.size());
  // Where the recording's level-0 cut leaves too little for the levels below, backward merges
  // its segments m at a time (their copies reused below): of the cuts m = 1, 2, 3, 4, 6, 8,
  // ... the one with the fewest levels, then bytes.
  Result<codegen::CheckpointPlan> best = make_error(ErrorCode::kInternal, "");
  for (uint64_t m = 1;; m = std::max(m + 1, m * 3 / 2)) {
    const uint64_t top = std::min<uint64_t>(m * top_, n);
    Result<codegen::CheckpointPlan> p = codegen::plan_checkpoints(
        n, state, launch_bytes_, memory_budget_, static_cast<uint32_t>(top), what);
    if (p.ok() && (!best.ok() || p->recompute < best->recompute ||
                   (p->recompute == best->recompute && p->peak_bytes < best->peak_bytes))) {
      best = std::move(p);
    } else if (!best.ok() && !p.ok()) {
      best = std::move(p);  // the refusal of the coarsest cut tried
    }
    if (memory_budget_ == 0 || top >= n || (best.ok() && best->recompute == 2)) break;
  }
  // The estimate takes every deepest position to hold what the launch writing the most holds;
  // in a periodic recording (a step of several launches) most hold far less, and in place or
  // stable writes nothing. Counted exactly, two levels may fit where the estimate needs three.
  if (memory_budget_ != 0 && (!best.ok() || best->recompute > 2)) {
    Result<codegen::CheckpointPlan> two = exact_two_levels(state, what);
    if (two.ok()) {
      two->min_bytes = best.ok() ? std::min(best->min_bytes, two->peak_bytes) : two->peak_bytes;
      best = std::move(two);
    }
  }
  return best;
}

Status Tape::copy_array(NdArrayHandle from, NdArrayHandle to,
                        std::vector<TapeAdjointLaunch>* launched) {
  VKAD_TRY(session_->copy(from, to));
  // Where capturing, a graph launches with them from now on. Both sides where both are the
  // tape's: the leaf's second write of an array in a range copies its first copy into a new
  // one, which the launches after it write and read.
  copies_->pin(from.id);
  copies_->pin(to.id);
  if (launched) launched->push_back({0, false, {}, false, true});
  return {};
}

void Tape::written_by(size_t first, size_t last, std::vector<uint64_t>* out) const {
  out->clear();
  for (size_t j = first; j < last; ++j) {
    const Record& r = records_[j];
    for (uint32_t w = 0; w < r.written_count; ++w) {
      const uint64_t a = written_[r.written_begin + w];
      if (stable_arrays_.count(a)) continue;
      if (std::find(out->begin(), out->end(), a) == out->end()) out->push_back(a);
    }
  }
}

void Tape::stable_by_access(std::unordered_set<uint64_t>* stable) const {
  std::unordered_map<uint64_t, TapeHazards> candidates;  // array -> its accesses so far
  for (const Record& r : records_) {
    for (uint32_t w = 0; w < r.written_count; ++w) candidates[written_[r.written_begin + w]];
  }
  std::unordered_map<uint64_t, std::vector<uint32_t>> shapes;
  auto extent = [&](NdArrayHandle a, uint32_t axis) -> std::optional<uint32_t> {
    auto it = shapes.find(a.id);
    if (it == shapes.end()) {
      Result<std::vector<uint32_t>> sh = session_->shape(a);
      it = shapes.emplace(a.id, sh.ok() ? *sh : std::vector<uint32_t>{}).first;
    }
    if (axis >= it->second.size()) return std::nullopt;
    return it->second[axis];
  };
  // Each candidate's accesses alone, in recording order, through a TapeHazards of its own: a
  // launch's access filtered to the parameters bound to that array.
  std::unordered_set<uint64_t> unstable;
  for (const Record& r : records_) {
    const std::span<const Arg> args(args_.data() + r.arg_begin, r.arg_count);
    if (r.forward.id == 0) {  // a fill overwrites every element
      unstable.insert(args[0].array.id);
      continue;
    }
    std::shared_ptr<const codegen::KernelAccess> access = session_->launch_access(r.forward);
    for (const Arg& arg : args) {
      auto c = arg.kind == runtime::ParamKind::kNdArray ? candidates.find(arg.array.id)
                                                        : candidates.end();
      if (c == candidates.end() || unstable.count(arg.array.id)) continue;
      auto only = std::make_shared<codegen::KernelAccess>();
      if (access) {
        only->kernel = access->kernel;
        only->names = access->names;
        only->exprs = access->exprs;
        for (const codegen::ParamAccess& pa : access->params) {
          const bool bound = pa.param < args.size() &&
                             args[pa.param].kind == runtime::ParamKind::kNdArray &&
                             args[pa.param].array.id == arg.array.id;
          if (bound) only->params.push_back(pa);
        }
      }
      if (access && c->second.accepts(extent, std::move(only), args)) {
        c->second.record();
      } else {
        unstable.insert(arg.array.id);
      }
    }
  }
  for (const auto& [a, h] : candidates) {
    if (!unstable.count(a)) stable->insert(a);
  }
}

void Tape::find_stable() const {
  // Once per recording: checkpoint_plan's exact two-level count and the backward after it ask
  // of the same records.
  if (stable_of_ == recorded_) return;
  stable_of_ = recorded_;
  stable_arrays_.clear();
  stable_records_.assign(records_.size(), false);
  for (const Record& r : records_) {
    if (r.loop_len != 0) return;  // a loop group's rows step per iteration: not looked at
  }
  stable_by_access(&stable_arrays_);
  // A launch writing an unstable array runs again, so every array it writes is unstable too
  // (an atomic add would add twice); until nothing changes. Then the launches writing only
  // stable arrays.
  auto all_stable = [&](const Record& r) {
    bool all = r.forward.id != 0 && r.written_count != 0;
    for (uint32_t w = 0; w < r.written_count && all; ++w) {
      all = stable_arrays_.count(written_[r.written_begin + w]) != 0;
    }
    return all;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (const Record& r : records_) {
      if (all_stable(r)) continue;
      for (uint32_t w = 0; w < r.written_count; ++w) {
        changed = stable_arrays_.erase(written_[r.written_begin + w]) != 0 || changed;
      }
    }
  }
  for (size_t j = 0; j < records_.size(); ++j) stable_records_[j] = all_stable(records_[j]);
}

void Tape::note_adjoint_reads(const Record& r, std::span<const Arg> args,
                              std::unordered_map<uint64_t, bool>* read) const {
  // A fill's adjoint zeroes a gradient: it reads no values.
  if (r.forward.id == 0) return;
  const std::vector<uint32_t>* used = session_->adjoint_reads(r.adjoint);
  auto mark = [&](uint32_t param) {
    if (param < args.size() && args[param].kind == runtime::ParamKind::kNdArray) {
      (*read)[args[param].array.id] = true;
    }
  };
  if (!used) {  // unknown: it may read every array
    for (uint32_t p = 0; p < args.size(); ++p) mark(p);
    return;
  }
  // The adjoint's parameters are the forward's, then the gradients (past args: not marked).
  for (uint32_t p : *used) mark(p);
}

Status Tape::note_writes(const codegen::KernelAccess& access, std::span<const Arg> args, Record* r,
                         std::vector<std::pair<uint64_t, uint64_t>>* fresh) {
  r->written_begin = static_cast<uint32_t>(written_.size());
  for (const codegen::ParamAccess& pa : access.params) {
    bool writes = false;
    for (const codegen::ArrayAccess& a : pa.accesses) {
      writes = writes || a.kind != codegen::ArrayAccess::Kind::kRead;
    }
    if (!writes || pa.param >= args.size()) continue;
    const NdArrayHandle a = args[pa.param].array;
    Result<DType> t = session_->dtype(a);
    Result<std::vector<uint32_t>> shape = session_->shape(a);
    if (!t.ok() || !shape.ok()) {
      written_.resize(r->written_begin);
      return make_error((t.ok() ? shape.status() : t.status()).code(),
                        "tape.launch: " + (t.ok() ? shape.status() : t.status()).message());
    }
    uint64_t bytes = runtime::dtype_bytes(*t);
    for (uint32_t e : *shape) bytes *= e;
    written_.push_back(a.id);
    if (!state_bytes_.count(a.id)) fresh->emplace_back(a.id, bytes);
  }
  r->written_count = static_cast<uint32_t>(written_.size()) - r->written_begin;
  return {};
}

Status Tape::fit_budget(uint64_t state, uint64_t slot) {
  // Any schedule holds the end state, one level-0 segment's start and one launch's copies.
  if (2 * state + slot > memory_budget_) {
    Result<codegen::CheckpointPlan> p = codegen::plan_checkpoints(
        static_cast<uint32_t>(records_.size() + 1), state, slot, memory_budget_, 0, "tape.launch");
    return p.ok() ? make_error(ErrorCode::kInvalidArgument,
                               "tape.launch: the memory budget of " +
                                   codegen::format_bytes(memory_budget_) + " is below " +
                                   codegen::format_bytes(2 * state + slot))
                  : p.status();
  }
  // Level 0 holds at most half the budget (the deeper levels and the end state the rest), or
  // after a plan what that plan's level 0 held: where a new segment would pass it, two
  // segments become one.
  const uint64_t cap = std::max(memory_budget_ / 2, planned_top_bytes_);
  auto segments = [&] { return records_.size() / top_ + 1; };
  while (records_.size() % top_ == 0 && segments() > 1 && segments() * state > cap) {
    copies_->merge_level0(2);
    top_ *= 2;
  }
  return {};
}

template <typename Run>
Status Tape::checkpointed_entry(std::span<const uint64_t> writes,
                                std::span<const std::pair<uint64_t, uint64_t>> fresh, Run&& run) {
  std::map<uint64_t, uint64_t> mult = form_mult_;
  VKAD_ASSIGN_OR_RETURN(uint64_t slot, copies_->slot_bytes(writes, &mult));
  if (memory_budget_ != 0) {
    uint64_t state = 0;
    for (const auto& [array, bytes] : state_bytes_) state += bytes;
    for (const auto& [array, bytes] : fresh) state += bytes;
    VKAD_TRY(fit_budget(state, slot));
  }
  VKAD_TRY(copies_->copy_segment_start(records_.size() / top_, writes));
  VKAD_TRY(run());
  for (const auto& [array, bytes] : fresh) state_bytes_.emplace(array, bytes);
  launch_bytes_ = slot;
  form_mult_ = std::move(mult);
  return {};
}

namespace {

// Whether the kernel stores to (overwrites elements of) the parameter of `pa`.
bool stores_to(const codegen::ParamAccess& pa) {
  return std::any_of(pa.accesses.begin(), pa.accesses.end(), [](const codegen::ArrayAccess& x) {
    return x.kind == codegen::ArrayAccess::Kind::kOverwrite;
  });
}

}  // namespace

Status Tape::checkpointed_launch(const Differentiated& d, std::span<const Arg> args, LaunchId* id,
                                 Record* r) {
  // Overwrites are what checkpointing is for: the arrays this launch writes are copied the
  // first time their level-0 segment writes them, and its adjoint clears the seeds it consumes.
  std::shared_ptr<const codegen::KernelAccess> access = session_->launch_access(d.forward);
  if (!access) {
    return make_error(ErrorCode::kInvalidArgument,
                      "tape.launch: kernel " + runtime::handle_string(d.forward.id) +
                          " is not a live differentiate() result of this session");
  }
  // No record to compare with, but an in-place launch is wrong at backward all the same.
  VKAD_TRY(TapeHazards::check_aliasing(*session_, *access, args));
  // A launch whose every store overwrites its array whole (DiffTaichi's grid_op storing the one
  // grid_v_out) clears each seed it reads, every element of the gradient: the tape runs the
  // plain adjoint and clears the gradients itself, after the adjoint, as late as it may -- just
  // before the next adjoint that touches them. The graph then sees the adjoint as a pure function
  // of its inputs (gather recompute copies it into the gather that reads its output) and the
  // clears as fills (rename gives the gradient a ring of buffers).
  // The clearing adjoint clears only differentiated parameters' seeds: those are the ones the
  // tape clears.
  r->forward = d.forward;
  VKAD_ASSIGN_OR_RETURN_CTX(r->adjoint, session_->clearing_adjoint(d), "tape.launch");
  if (stores_only_whole(*r, args, *access)) {
    r->clear_begin = static_cast<uint32_t>(clear_params_.size());
    for (const codegen::ParamAccess& pa : access->params) {
      const bool grad = std::any_of(d.gradients.begin(), d.gradients.end(),
                                    [&](const GradientParam& g) { return g.param == pa.param; });
      if (grad && stores_to(pa)) clear_params_.push_back(pa.param);
    }
    r->clear_count = static_cast<uint32_t>(clear_params_.size()) - r->clear_begin;
    if (r->clear_count > 0) {
      r->clearing = r->adjoint;
      r->adjoint = d.adjoint;
    }
  }
  std::vector<std::pair<uint64_t, uint64_t>> fresh;  // arrays new to the recording, and bytes
  VKAD_TRY(note_writes(*access, args, r, &fresh));
  auto undo = [&](const Status& st) {
    written_.resize(r->written_begin);
    return st.message().rfind("tape.launch", 0) == 0
               ? st
               : make_error(st.code(), "tape.launch: " + st.message());
  };
  const std::span<const uint64_t> writes(written_.data() + r->written_begin, r->written_count);
  if (records_.empty()) {
    copies_->begin_recording();
    top_ = checkpoint_every_ != 0 ? checkpoint_every_ : std::max(planned_top_, 1u);
  }
  const Status st = checkpointed_entry(writes, fresh, [&] {
    LaunchNote note(*session_, "tape entry", records_.size());
    return session_->launch(d.forward, args, id);
  });
  if (!st.ok()) return undo(st);
  for (const Arg& a : args) {
    if (a.kind == runtime::ParamKind::kNdArray) touched_.insert(a.array.id);
  }
  return {};
}

bool Tape::recording_touched(NdArrayHandle array) const {
  if (checkpointing()) return touched_.count(array.id) != 0;
  return std::any_of(args_.begin(), args_.end(), [&](const Arg& a) {
    return a.kind == runtime::ParamKind::kNdArray && a.array.id == array.id;
  });
}

Status Tape::copy(NdArrayHandle src, NdArrayHandle dst) {
  const bool touched = recording_touched(src) || recording_touched(dst);
  Result<DType> t = session_->dtype(src);
  Result<std::vector<uint32_t>> shape = session_->shape(src);
  const bool floats = t.ok() && (*t == DType::kF32 || *t == DType::kF64);
  Result<DType> dt = session_->dtype(dst);
  Result<std::vector<uint32_t>> dshape = session_->shape(dst);
  const bool same = src.id != dst.id && t.ok() && dt.ok() && *t == *dt && shape.ok() &&
                    dshape.ok() && *shape == *dshape;
  if (!touched || !floats || !same) {  // Session::copy names what is wrong, if anything
    VKAD_TRY_CTX(session_->copy(src, dst), "tape.copy");
    return {};
  }
  VKAD_ASSIGN_OR_RETURN_CTX(const Differentiated* d,
                            session_->differentiated_copy(*t, static_cast<uint32_t>(shape->size())),
                            "tape.copy");
  const Arg args[] = {Arg::ndarray(src), Arg::ndarray(dst)};
  return launch(*d, args);
}

Status Tape::fill(NdArrayHandle array, double value) {
  const bool touched = recording_touched(array);
  // An array the recording has not touched: the fill is its state before the recording (a
  // checkpoint of a later segment copies it where a launch writes it).
  if (!touched) {
    VKAD_TRY_CTX(session_->fill(array, value), "tape.fill");
    return {};
  }
  if (!checkpointing()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "tape.fill: " + label(array) +
                          " is an argument of a recorded launch; backward reads the arrays as "
                          "they are when it runs, so the fill would change what the launch is "
                          "differentiated at. A tape with checkpointing (set_memory_budget, "
                          "Python's t.memory_budget) records fills and runs them again");
  }
  Record r;
  r.written_begin = static_cast<uint32_t>(written_.size());
  VKAD_ASSIGN_OR_RETURN_CTX(DType t, session_->dtype(array), "tape.fill");
  VKAD_ASSIGN_OR_RETURN_CTX(std::vector<uint32_t> shape, session_->shape(array), "tape.fill");
  uint64_t bytes = runtime::dtype_bytes(t);
  for (uint32_t e : shape) bytes *= e;
  written_.push_back(array.id);
  r.written_count = 1;
  auto undo = [&](const Status& st) {
    written_.resize(r.written_begin);
    return make_error(st.code(), "tape.fill: " + st.message());
  };
  // (records_ is not empty: touched)
  std::vector<std::pair<uint64_t, uint64_t>> fresh;
  if (!state_bytes_.count(array.id)) fresh.emplace_back(array.id, bytes);
  const Status st = checkpointed_entry(std::span<const uint64_t>(&written_.back(), 1), fresh,
                                       [&] { return session_->fill(array, value); });
  if (!st.ok()) return undo(st);
  r.arg_begin = static_cast<uint32_t>(args_.size());
  r.arg_count = 2;
  r.grad_begin = static_cast<uint32_t>(grad_params_.size());
  args_.push_back(Arg::ndarray(array));
  args_.push_back(Arg::f64(value));
  records_.push_back(r);
  ++recorded_;
  note_touched(std::span<const Arg>(&args_[args_.size() - 2], 1), nullptr);  // the recording's
  return {};
}

Status Tape::check_unwritten(std::span<const Arg> args, const std::string& where) const {
  for (const Arg& a : args) {
    if (a.kind != abi::ParamKind::kNdArray) continue;
    auto seen = reads_seen_.find(a.array.id);
    if (seen == reads_seen_.end()) continue;
    // A freed array: the launch or adjoint that binds it reports that, naming it.
    Result<uint64_t> now = session_->runtime().write_count(a.array);
    if (!now.ok() || *now == seen->second) continue;
    Result<std::string> name = session_->runtime().name(a.array);
    Result<std::string> writer = session_->runtime().last_writer(a.array);
    return make_error(
        ErrorCode::kFailedPrecondition,
        where + ": ndarray '" + (name.ok() ? *name : std::string("?")) + "' (" +
            runtime::handle_string(a.array.id) +
            ") was written after the tape recorded a launch that reads it, by " +
            (writer.ok() ? *writer : std::string("?")) + " that is not on the tape (" +
            std::to_string(*now - seen->second) +
            " write(s) since); the adjoints read it as it is now and would give wrong "
            "gradients. Make that write after backward(), record it on the tape, or write into "
            "another array (docs/tape.md)");
  }
  return {};
}

void Tape::note_touched(std::span<const Arg> args, const codegen::KernelAccess* access) {
  for (size_t p = 0; p < args.size(); ++p) {
    if (args[p].kind != abi::ParamKind::kNdArray) continue;
    bool loads = false;
    if (access) {
      for (const codegen::ParamAccess& pa : access->params) {
        if (pa.param != p) continue;
        for (const codegen::ArrayAccess& x : pa.accesses)
          loads = loads || x.kind == codegen::ArrayAccess::Kind::kRead;
      }
    }
    auto seen = reads_seen_.find(args[p].array.id);
    if (!loads && seen == reads_seen_.end()) continue;
    Result<uint64_t> now = session_->runtime().write_count(args[p].array);
    if (now.ok()) reads_seen_[args[p].array.id] = *now;
  }
}

Status Tape::launch(const Differentiated& d, std::span<const Arg> args, LaunchId* id) {
  if (args.size() != d.forward_params) {
    return make_error(ErrorCode::kInvalidArgument, "tape.launch: " + std::to_string(args.size()) +
                                                       " arguments given, the forward kernel has " +
                                                       std::to_string(d.forward_params) +
                                                       " parameters");
  }
  for (const GradientParam& g : d.gradients) {
    if (g.param >= args.size()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "tape.launch: a gradient is of parameter " + std::to_string(g.param) +
                            ", past the " + std::to_string(args.size()) + " arguments");
    }
  }
  Record r;
  r.forward = d.forward;
  r.adjoint = d.adjoint;
  VKAD_TRY(check_unwritten(args, "tape.launch"));
  const std::vector<codegen::InPlaceParam>* in_place = session_->in_place(d.adjoint);
  // An in-place update's adjoint reads the copies the tape keeps, not the arrays.
  const std::shared_ptr<const codegen::KernelAccess> access =
      in_place ? session_->in_place_access(d.adjoint) : session_->launch_access(d.forward);
  if (in_place && checkpointing()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "tape.launch: the kernel updates an array in place (its adjoint reads a "
                      "copy from before the launch), which a checkpointed tape does not keep; "
                      "write the result into another array, or record without checkpointing");
  }
  if (!checkpointing()) {
    // Refused before it runs: the caller learns at the launch that would spoil the gradients.
    VKAD_TRY(hazards_->check(*session_, access, args));
    if (in_place) {
      // One array bound to two parameters is judged on what the kernel does (in_place_access
      // speaks for the adjoint: with both parameters updated in place it would see no read).
      VKAD_TRY(TapeHazards::check_aliasing(*session_, *session_->launch_access(d.forward), args));
      r.before_begin = static_cast<uint32_t>(before_.size());
      VKAD_TRY(copy_before(*in_place, args));
      r.before_count = static_cast<uint32_t>(in_place->size());
    }
    {
      LaunchNote note(*session_, "tape entry", records_.size());
      const Status st = session_->launch(d.forward, args, id);
      if (!st.ok()) {
        for (uint32_t i = 0; i < r.before_count; ++i) {
          (void)session_->free(before_[r.before_begin + i]);
        }
        before_.resize(r.before_begin);
        return Status(st.code(), "tape.launch: " + st.message());
      }
    }
    hazards_->record();
  } else {
    VKAD_TRY(checkpointed_launch(d, args, id, &r));
  }
  note_touched(args, access.get());
  r.arg_begin = static_cast<uint32_t>(args_.size());
  r.arg_count = static_cast<uint32_t>(args.size());
  r.grad_begin = static_cast<uint32_t>(grad_params_.size());
  r.grad_count = static_cast<uint32_t>(d.gradients.size());
  args_.insert(args_.end(), args.begin(), args.end());
  for (const GradientParam& g : d.gradients) grad_params_.push_back(g.param);
  records_.push_back(r);
  ++recorded_;
  return {};
}

namespace {

void loop_args(const TapeLoopLaunch& l, int64_t r, std::vector<Arg>* a) {
  a->assign(l.args.begin(), l.args.end());
  for (size_t p = 0; p < l.step.size() && p < a->size(); ++p) (*a)[p].i += r * l.step[p];
}

std::string loop_where(size_t j, int64_t r, const codegen::KernelAccess* access = nullptr) {
  return "tape.launch_loop: launch " + std::to_string(j) + " of the body" +
         (access ? " ('" + access->kernel + "')" : std::string()) + ", iteration " +
         std::to_string(r);
}

bool same_arg(const Arg& a, const Arg& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.i == b.i && a.array.id == b.array.id &&
         // The bits: a NaN argument equals itself, and -0.0 differs from 0.0.
         std::bit_cast<uint64_t>(a.f) == std::bit_cast<uint64_t>(b.f);
}

bool same_launches(std::span<const LoopLaunch> a, std::span<const LoopLaunch> b) {
  if (a.size() != b.size()) return false;
  for (size_t j = 0; j < a.size(); ++j) {
    if (a[j].kernel.id != b[j].kernel.id || a[j].args.size() != b[j].args.size() ||
        a[j].step != b[j].step) {
      return false;
    }
    for (size_t p = 0; p < a[j].args.size(); ++p) {
      if (!same_arg(a[j].args[p], b[j].args[p])) return false;
    }
  }
  return true;
}

// The recorded launches of a body (its differentiate() results'), as a TapeLoopChecks keys them.
std::vector<LoopLaunch> recorded_launches(std::span<const TapeLoopLaunch> body) {
  std::vector<LoopLaunch> out;
  for (const TapeLoopLaunch& l : body) {
    if (l.d != nullptr) out.push_back({l.d->forward, l.args, l.step});
  }
  return out;
}

// Calls each(j, r, args) for body launch j of iteration r, every differentiated launch of
// every iteration in order, recording each in `hz` after it; stops at the first error.
template <typename Each>
Status each_loop_launch(TapeHazards& hz, std::span<const TapeLoopLaunch> body, uint32_t count,
                        Each&& each) {
  std::vector<Arg> a;
  for (uint32_t r = 0; r < count; ++r) {
    for (size_t j = 0; j < body.size(); ++j) {
      if (body[j].d == nullptr) continue;
      loop_args(body[j], r, &a);
      VKAD_TRY(each(j, r, a));
      hz.record();
    }
  }
  return {};
}

// Every iteration's recorded launches checked against `hz` and recorded, the extents from
// `extent` (no session call: it runs on a thread of its own). False where one is refused.
bool accepts_loop(TapeHazards& hz, const TapeHazards::Extent& extent,
                  std::span<const TapeLoopLaunch> body,
                  std::span<const std::shared_ptr<const codegen::KernelAccess>> access,
                  uint32_t count) {
  return each_loop_launch(hz, body, count,
                          [&](size_t j, uint32_t, const std::vector<Arg>& a) -> Status {
                            if (hz.accepts(extent, access[j], a)) return {};
                            return make_error(ErrorCode::kInvalidArgument, "refused");
                          })
      .ok();
}

// The check of accepts_loop with the session's extents and messages: the refusal's error.
Status check_loop_serially(Session& session, TapeHazards& hz, std::span<const TapeLoopLaunch> body,
                           std::span<const std::shared_ptr<const codegen::KernelAccess>> access,
                           uint32_t count) {
  return each_loop_launch(
      hz, body, count, [&](size_t j, uint32_t r, const std::vector<Arg>& a) -> Status {
        VKAD_TRY_CTX(hz.check(session, access[j], a), loop_where(j, r, access[j].get()));
        return {};
      });
}

// The shapes of the body's arrays, for a check on a thread that may not call the session.
TapeHazards::Extent extents_of(
    Session& session, std::span<const TapeLoopLaunch> body,
    std::shared_ptr<std::unordered_map<uint64_t, std::vector<uint32_t>>> shapes) {
  for (const TapeLoopLaunch& l : body) {
    for (const Arg& x : l.args) {
      if (x.kind != runtime::ParamKind::kNdArray || shapes->count(x.array.id)) continue;
      Result<std::vector<uint32_t>> sh = session.shape(x.array);
      if (sh.ok()) shapes->emplace(x.array.id, std::move(*sh));
    }
  }
  return [shapes](NdArrayHandle a, uint32_t d) -> std::optional<uint32_t> {
    auto it = shapes->find(a.id);
    if (it == shapes->end() || d >= it->second.size()) return std::nullopt;
    return it->second[d];
  };
}

// What launch() refuses of a differentiate() result's arguments, before its hazard check.
Status loop_launch_args(const TapeLoopLaunch& l, uint32_t count) {
  const Differentiated& d = *l.d;
  if (l.args.size() != d.forward_params) {
    return make_error(ErrorCode::kInvalidArgument,
                      std::to_string(l.args.size()) + " arguments given, the forward kernel has " +
                          std::to_string(d.forward_params) + " parameters");
  }
  // Before any iteration's arguments are computed (loop_args adds r * step to them).
  VKAD_TRY(check_loop_steps(l.args, l.step, count));
  for (const GradientParam& g : d.gradients) {
    if (g.param >= l.args.size()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "a gradient is of parameter " + std::to_string(g.param) + ", past the " +
                            std::to_string(l.args.size()) + " arguments");
    }
  }
  return {};
}

}  // namespace

TapeLoopChecks::TapeLoopChecks() = default;
TapeLoopChecks::~TapeLoopChecks() = default;

struct TapeLoopChecks::Entry {
  std::vector<LoopLaunch> launches;  // the recorded ones, in body order
  uint32_t count = 0;
  TapeHazards after;
};

const TapeHazards* TapeLoopChecks::find(std::span<const LoopLaunch> launches,
                                        uint32_t count) const {
  for (const std::unique_ptr<Entry>& e : entries_) {
    if (e->count == count && same_launches(e->launches, launches)) return &e->after;
  }
  return nullptr;
}

void TapeLoopChecks::keep(std::vector<LoopLaunch> launches, uint32_t count,
                          const TapeHazards& after) {
  if (launches.empty() || find(launches, count) != nullptr) return;
  if (entries_.size() >= kMax) entries_.erase(entries_.begin());
  entries_.push_back(std::make_unique<Entry>(Entry{std::move(launches), count, after}));
}

Status TapeLoopChecks::prepare(Session& session, std::span<const TapeLoopLaunch> body,
                               uint32_t count) {
  std::vector<std::shared_ptr<const codegen::KernelAccess>> access(body.size());
  for (size_t j = 0; j < body.size(); ++j) {
    if (body[j].d == nullptr) continue;
    VKAD_TRY_CTX(loop_launch_args(body[j], count), loop_where(j, 0));
    access[j] = session.launch_access(body[j].d->forward);
  }
  std::vector<LoopLaunch> key = recorded_launches(body);
  if (key.empty() || count == 0 || find(key, count) != nullptr) return {};
  TapeHazards hz;
  VKAD_TRY(check_loop_serially(session, hz, body, access, count));
  keep(std::move(key), count, hz);
  return {};
}

Status TapeLoopChecks::check(Session& session, TapeHazards& hazards, TapeLoopChecks* known,
                             std::span<const TapeLoopLaunch> body,
                             std::span<const LoopLaunch> launches, uint32_t count) {
  std::vector<std::shared_ptr<const codegen::KernelAccess>> access(body.size());
  for (size_t j = 0; j < body.size(); ++j) {
    if (body[j].d != nullptr) access[j] = session.launch_access(body[j].d->forward);
  }
  const bool from_empty = hazards.launches() == 0;
  std::vector<LoopLaunch> key;
  if (from_empty && known) {
    key = recorded_launches(body);
    if (const TapeHazards* was = known->find(key, count)) {
      hazards = *was;  // checked before, from an empty record
      session.ready_loop(launches, count);
      return {};
    }
  }
  // The check's ~1 us per launch on a thread of its own while this one readies the loop (its
  // kernels rolled, compiled, registered, their pipelines made): they overlap.
  TapeHazards saved = hazards;
  const TapeHazards::Extent extent = extents_of(
      session, body, std::make_shared<std::unordered_map<uint64_t, std::vector<uint32_t>>>());
  bool accepted = false;
  auto work = [&]() noexcept {
    try {
      accepted = accepts_loop(hazards, extent, body, access, count);
    } catch (...) {
      accepted = false;
    }
  };
  std::thread checker;
  try {
    checker = std::thread(work);
  } catch (...) {
    work();  // no thread: here
  }
  session.ready_loop(launches, count);
  if (checker.joinable()) checker.join();
  if (!accepted) {  // the check again with the session, for its message
    hazards = saved;
    Status c = check_loop_serially(session, hazards, body, access, count);
    if (!c.ok()) {
      hazards = std::move(saved);
      return c;
    }
  }
  if (from_empty && known) known->keep(std::move(key), count, hazards);
  return {};
}

Status Tape::launch_loop(std::span<const TapeLoopLaunch> body, uint32_t count, LoopInfo* info) {
  if (info) *info = {};
  if (count == 0 || body.empty()) return {};
  for (size_t j = 0; j < body.size(); ++j) {
    if (body[j].d == nullptr) {
      if (body[j].kernel.id == 0) {
        return make_error(ErrorCode::kInvalidArgument,
                          loop_where(j, 0) + ": no differentiate() result, nor a kernel");
      }
      VKAD_TRY_CTX(check_loop_steps(body[j].args, body[j].step, count), loop_where(j, 0));
      continue;
    }
    VKAD_TRY_CTX(loop_launch_args(body[j], count), loop_where(j, 0));
  }
  // Checkpointing copies before each launch, a counted adjoint (Session::differentiate) counts
  // its trips per launch and an in-place update's adjoint reads its launch's copy, which an
  // adjoint loop cannot: one by one.
  const bool counted = std::any_of(body.begin(), body.end(), [&](const TapeLoopLaunch& l) {
    return l.d != nullptr && (session_->counted_loops(l.d->adjoint) != 0 ||
                              session_->in_place(l.d->adjoint) != nullptr);
  });
  std::vector<Arg> a;
  if (checkpointing() || counted) {
    uint32_t ran = 0;
    for (uint32_t r = 0; r < count; ++r) {
      for (size_t j = 0; j < body.size(); ++j) {
        loop_args(body[j], r, &a);
        Status st =
            body[j].d != nullptr ? launch(*body[j].d, a) : session_->launch(body[j].kernel, a);
        if (!st.ok()) {
          // What ran is recorded: a part of the loop, which backward must not differentiate.
          if (ran > 0) {
            broken_ = "a launch_loop failed after " + std::to_string(ran) +
                      " of its launches ran (" + st.message() + "); the tape holds part of it";
          }
          return st.with_context(loop_where(j, r));
        }
        ++ran;
        if (info) ++info->launches;
      }
    }
    return {};
  }
  std::vector<LoopLaunch> fwd;
  for (const TapeLoopLaunch& l : body) {
    fwd.push_back({l.d != nullptr ? l.d->forward : l.kernel, l.args, l.step});
  }
  for (size_t j = 0; j < body.size(); ++j)
    VKAD_TRY(check_unwritten(body[j].args, loop_where(j, 0)));
  // Every launch checked before any runs; the record put back if one is refused or the loop
  // fails.
  TapeHazards saved = *hazards_;
  VKAD_TRY(TapeLoopChecks::check(*session_, *hazards_, loop_checks_.get(), body, fwd, count));
  LoopInfo ran;
  Status st;
  {
    LaunchNote note(*session_, "the loop at tape entry", records_.size());
    st = session_->launch_loop(fwd, count, &ran);
  }
  if (info) *info = ran;
  if (!st.ok()) {
    *hazards_ = std::move(saved);
    if (ran.launches > 0) {
      broken_ = "a launch_loop failed after " + std::to_string(ran.launches) +
                " of its launches ran (" + st.message() + "); they are not on the tape";
    }
    return st.with_context("tape.launch_loop");
  }
  record_loop(body, count);
  for (const TapeLoopLaunch& l : body) {
    const std::shared_ptr<const codegen::KernelAccess> access =
        l.d != nullptr ? session_->launch_access(l.d->forward) : nullptr;
    note_touched(l.args, access.get());
  }
  return {};
}

void Tape::record_loop(std::span<const TapeLoopLaunch> body, uint32_t count) {
  const uint32_t first = static_cast<uint32_t>(records_.size());
  uint32_t recorded = 0;
  for (const TapeLoopLaunch& l : body) recorded += l.d != nullptr ? 1 : 0;
  for (const TapeLoopLaunch& l : body) {
    if (l.d == nullptr) continue;  // not differentiated: ran, not recorded
    Record r;
    r.forward = l.d->forward;
    r.adjoint = l.d->adjoint;
    r.loop_first = first;
    r.loop_len = recorded;
    r.loop_count = count;
    r.step_begin = static_cast<uint32_t>(steps_.size());
    r.arg_begin = static_cast<uint32_t>(args_.size());
    r.arg_count = static_cast<uint32_t>(l.args.size());
    r.grad_begin = static_cast<uint32_t>(grad_params_.size());
    r.grad_count = static_cast<uint32_t>(l.d->gradients.size());
    args_.insert(args_.end(), l.args.begin(), l.args.end());
    for (size_t p = 0; p < l.args.size(); ++p) steps_.push_back(p < l.step.size() ? l.step[p] : 0);
    for (const GradientParam& g : l.d->gradients) grad_params_.push_back(g.param);
    records_.push_back(r);
    ++recorded_;
  }
}

Status Tape::launch_adjoint_loop(size_t first, size_t len, LoopInfo* info) {
  VKAD_TRY(flush_clears({}, /*all=*/true));  // the loop's adjoints may touch any of them
  std::vector<LoopLaunch> body;
  const int64_t last = static_cast<int64_t>(records_[first].loop_count) - 1;
  for (size_t j = first + len; j-- > first;) {
    const Record& r = records_[j];
    LoopLaunch l;
    l.kernel = r.adjoint;
    for (uint32_t p = 0; p < r.arg_count; ++p) {
      Arg x = args_[r.arg_begin + p];
      const int32_t step = steps_[r.step_begin + p];
      x.i += last * step;
      l.args.push_back(x);
      l.step.push_back(-step);
    }
    for (uint32_t k = 0; k < r.grad_count; ++k) {
      l.args.push_back(Arg::ndarray(gradient(r, k)));
      l.step.push_back(0);
    }
    body.push_back(std::move(l));
  }
  // Its iterations run from the forward's last: the note says so.
  LaunchNote note(*session_, "the adjoint (run from the last iteration) of the loop at tape entry",
                  first);
  VKAD_TRY_CTX(session_->launch_loop(body, records_[first].loop_count, info),
               "tape.backward: adjoint of the loop at launch " + std::to_string(first));
  return {};
}

bool Tape::differentiated(NdArrayHandle array) const {
  for (const Record& r : records_) {
    for (uint32_t k = 0; k < r.grad_count; ++k) {
      const Arg& x = args_[r.arg_begin + grad_params_[r.grad_begin + k]];
      if (x.kind == runtime::ParamKind::kNdArray && x.array.id == array.id) return true;
    }
  }
  return false;
}

void Tape::prune() {
  for (auto it = grads_.begin(); it != grads_.end();) {
    if (session_->dtype(NdArrayHandle{it->first}).ok()) {
      ++it;
      continue;
    }
    if (it->second.owned) (void)session_->free(it->second.grad);
    it = grads_.erase(it);
  }
}

void Tape::free_before() {
  for (NdArrayHandle h : before_) (void)session_->free(h);  // deferred past in-flight uses
  before_.clear();
}

Status Tape::copy_before(const std::vector<codegen::InPlaceParam>& in_place,
                         std::span<const Arg> args) {
  const size_t first = before_.size();
  Status st;
  for (const codegen::InPlaceParam& a : in_place) {
    if (a.param >= args.size() || args[a.param].kind != runtime::ParamKind::kNdArray) {
      st = make_error(ErrorCode::kInvalidArgument,
                      "tape.launch: argument " + std::to_string(a.param) +
                          " is updated in place by the kernel and must be an ndarray");
      break;
    }
    const NdArrayHandle x = args[a.param].array;
    Result<DType> t = session_->dtype(x);
    Result<std::vector<uint32_t>> shape = session_->shape(x);
    if (!t.ok() || !shape.ok()) {
      st = t.ok() ? shape.status() : t.status();
      break;
    }
    Result<NdArrayHandle> c = session_->ndarray(*t, *shape, "before");
    if (!c.ok()) {
      st = c.status();
      break;
    }
    before_.push_back(*c);
    st = session_->copy(x, *c);
    if (!st.ok()) break;
  }
  if (st.ok()) return {};
  for (size_t i = first; i < before_.size(); ++i) (void)session_->free(before_[i]);
  before_.resize(first);
  return Status(st.code(),
                "tape.launch: the copy of an array the kernel updates in place: " + st.message());
}

void Tape::reset() {
  free_before();
  records_.clear();
  reads_seen_.clear();
  pending_clears_.clear();
  clear_params_.clear();
  ++recorded_;
  args_.clear();
  steps_.clear();
  broken_.clear();
  grad_params_.clear();
  hazards_->reset();
  written_.clear();
  copies_->reset();
  state_bytes_.clear();
  touched_.clear();
  launch_bytes_ = 0;
  form_mult_.clear();
  prune();
}

Status Tape::list_gradients() {
  ++epoch_;
  zero_list_.clear();
  for (const Record& r : records_) {
    for (uint32_t k = 0; k < r.grad_count; ++k) {
      const uint32_t param = grad_params_[r.grad_begin + k];
      const Arg& x = args_[r.arg_begin + param];
      if (x.kind != runtime::ParamKind::kNdArray) {
        // A scalar's gradient: one element of its dtype (launch checked it against the
        // kernel's), summed by every launch of the kernel.
        auto [it, fresh] = scalar_grads_.try_emplace({r.forward.id, param});
        if (fresh) {
          Result<NdArrayHandle> g =
              session_->ndarray(x.dtype, {1},
                                "tape grad of parameter " + std::to_string(param) + " of kernel " +
                                    runtime::handle_string(r.forward.id));
          if (!g.ok()) {
            scalar_grads_.erase(it);
            return make_error(g.status().code(), "tape.backward: " + g.status().message());
          }
          it->second = Grad{*g, true, 0};
        }
        if (it->second.stamp != epoch_) {
          it->second.stamp = epoch_;
          zero_list_.push_back(it->second.grad);
        }
        continue;
      }
      const NdArrayHandle a = x.array;
      auto it = grads_.find(a.id);
      if (it == grads_.end()) {
        Result<DType> dtype = session_->dtype(a);
        // Freed since it was recorded: no gradient; the adjoint of the launch that passes it
        // says so (launch_adjoint), naming the launch.
        if (!dtype.ok()) continue;
        const DType t = *dtype;
        VKAD_ASSIGN_OR_RETURN_CTX(std::vector<uint32_t> shape, session_->shape(a), "tape.backward");
        // Pooled: a new tape per iteration reuses the gradients earlier tapes freed instead of
        // making Vulkan buffers anew (Runtime::create_ndarray's `pooled`).
        // Named after its array ("x_grad"), as a front door names the gradients it makes.
        Result<std::string> name = session_->name(a);
        VKAD_ASSIGN_OR_RETURN_CTX(
            NdArrayHandle g,
            session_->runtime().create_ndarray(t, std::move(shape),
                                               name.ok() && !name->empty()
                                                   ? *name + "_grad"
                                                   : "tape grad of " + runtime::handle_string(a.id),
                                               true),
            "tape.backward");
        it = grads_.emplace(a.id, Grad{g, true, 0}).first;
      }
      if (it->second.stamp != epoch_) {
        it->second.stamp = epoch_;
        zero_list_.push_back(it->second.grad);
      }
    }
  }
  return {};
}

Status Tape::backward(std::span<const TapeSeed> seeds, std::vector<TapeAdjointLaunch>* launched) {
  if (launched) launched->clear();
  pending_clears_.clear();
  if (!broken_.empty()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "tape.backward: " + broken_ + "; record the iteration again (reset())");
  }
  if (records_.empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "tape.backward: no launch of a differentiated kernel was recorded");
  }
  for (const auto& [id, count] : reads_seen_) {
    const Arg a = Arg::ndarray(NdArrayHandle{id});
    VKAD_TRY(check_unwritten(std::span<const Arg>(&a, 1), "tape.backward"));
  }
  // A checkpointed backward writes the recording's arrays itself (copies back, the forward
  // again, the end state put back): those writes are the tape's, so a later backward or launch
  // compares with the counts it leaves, whichever way it returns.
  struct Recount {
    Tape* t;
    ~Recount() {
      for (auto& [id, count] : t->reads_seen_) {
        Result<uint64_t> now = t->session_->runtime().write_count(NdArrayHandle{id});
        if (now.ok()) count = *now;
      }
    }
  } recount{this};
  // Everything a seed can get wrong is checked before anything is made or recorded.
  for (const TapeSeed& s : seeds) VKAD_TRY(check_seed(*session_, s, differentiated(s.array)));
  // A checkpointed backward's schedule, refused (the least bytes named) before anything runs.
  codegen::CheckpointPlan plan;
  if (checkpointing()) {
    VKAD_ASSIGN_OR_RETURN(plan, checkpoint_plan("tape.backward"));
    if (plan.segments[0] > top_) {
      const uint32_t m = (plan.segments[0] + top_ - 1) / top_;
      copies_->merge_level0(m);
      top_ *= m;
    }
    if (memory_budget_ != 0) {
      // The next recording's cut: the best for this one's length, where it fits.
      Result<codegen::CheckpointPlan> free = codegen::plan_checkpoints(
          plan.launches, plan.state_bytes, plan.launch_bytes, memory_budget_, 0, "");
      const codegen::CheckpointPlan& next = free.ok() ? *free : plan;
      planned_top_ = next.segments[0];
      planned_top_bytes_ = (next.launches + planned_top_ - 1) / planned_top_ * next.state_bytes;
    }
  }
  prune();
  VKAD_TRY(list_gradients());
  VKAD_TRY_CTX(session_->zero(std::span<const NdArrayHandle>(zero_list_)), "tape.backward");
  for (const TapeSeed& s : seeds) {
    const NdArrayHandle g = grads_.at(s.array.id).grad;
    VKAD_TRY_CTX(
        s.data != nullptr ? session_->upload(g, s.data, s.bytes) : session_->fill(g, s.value),
        "tape.backward");
  }
  if (checkpointing()) {
    const Status st = checkpointed_backward(plan, launched);
    if (!st.ok()) {
      pending_clears_.clear();  // a later backward zeroes them first
      return st;
    }
    return flush_clears({}, /*all=*/true);  // what the gradients hold when backward returns
  }
  for (size_t i = records_.size(); i-- > 0;) {
    const Record& r = records_[i];
    if (r.loop_len == 0) {
      VKAD_TRY(launch_adjoint(i));
      if (launched) launched->push_back({i, false, {}});
      continue;
    }
    // The whole group, then what is before it.
    LoopInfo info;
    const Status st = launch_adjoint_loop(r.loop_first, r.loop_len, &info);
    if (launched) launched->push_back({r.loop_first, true, info});
    VKAD_TRY(st);
    i = r.loop_first;
  }
  return {};
}

Status Tape::checkpointed_backward(const codegen::CheckpointPlan& plan,
                                   std::vector<TapeAdjointLaunch>* launched) {
  const size_t n = records_.size(), k = top_;
  copies_->ensure_levels(plan.segments.size());
  find_stable();
  // The recording's end state, put back at the end (a stable array keeps it throughout).
  std::vector<uint64_t> all;
  for (const std::vector<uint64_t>& seg : copies_->segment_arrays()) {
    for (uint64_t a : seg) {
      if (stable_arrays_.count(a)) continue;
      if (std::find(all.begin(), all.end(), a) == all.end()) all.push_back(a);
    }
  }
  for (size_t i = 0; i < all.size(); ++i) {
    VKAD_ASSIGN_OR_RETURN_CTX(uint64_t index, copies_->form_index(all, i), "tape.backward");
    VKAD_ASSIGN_OR_RETURN_CTX(NdArrayHandle c,
                              copies_->slot(TapeCopies::kEnd, 0, index, NdArrayHandle{all[i]}),
                              "tape.backward");
    VKAD_TRY_CTX(copy_array(NdArrayHandle{all[i]}, c, launched), "tape.backward");
  }
  for (size_t segment = (n + k - 1) / k; segment-- > 0;) {
    // The segment's start state: what its launches overwrite, as it was before them (the
    // other arrays hold it already: later segments were put back to their starts).
    // A stable array's copy (taken while recording, before it was known to be) stays unused: it
    // holds what every launch saw already.
    const std::vector<uint64_t>& at_start = copies_->segment_arrays()[segment];
    for (size_t i = 0; i < at_start.size(); ++i) {
      if (stable_arrays_.count(at_start[i])) continue;
      VKAD_ASSIGN_OR_RETURN_CTX(uint64_t index, copies_->form_index(at_start, i), "tape.backward");
      VKAD_TRY_CTX(
          copy_array(copies_->at(0, {segment, index}), NdArrayHandle{at_start[i]}, launched),
          "tape.backward");
    }
    VKAD_TRY(reverse_range(plan, 1, segment * k, std::min(n, segment * k + k), launched));
  }
  for (size_t i = 0; i < all.size(); ++i) {
    VKAD_ASSIGN_OR_RETURN_CTX(uint64_t index, copies_->form_index(all, i), "tape.backward");
    VKAD_TRY_CTX(
        copy_array(copies_->at(TapeCopies::kEnd, {0, index}), NdArrayHandle{all[i]}, launched),
        "tape.backward");
  }
  copies_->trim(memory_budget_);
  stable_arrays_.clear();
  stable_records_.clear();
  stable_of_ = 0;  // asked again of this recording, found again
  return {};
}

Status Tape::launch_forward_again(size_t j, std::vector<TapeAdjointLaunch>* launched,
                                  std::span<const Arg> args) {
  const Record& r = records_[j];
  if (args.empty()) args = std::span<const Arg>(args_.data() + r.arg_begin, r.arg_count);
  if (r.forward.id == 0) {  // a fill (not a launch: nothing to report)
    VKAD_TRY_CTX(session_->fill(args[0].array, args[1].f),
                 "tape.backward: fill " + std::to_string(j) + " again");
    return {};
  }
  LaunchNote note(*session_, "the forward of tape entry", j);
  VKAD_TRY_CTX(session_->launch(r.forward, args),
               "tape.backward: forward of launch " + std::to_string(j) + " again");
  if (launched) launched->push_back({j, false, {}, true, false});
  return {};
}

namespace {

// reverse_leaf's choice for a launch writing array `a`: in place where its latest version is
// one of the segment's copies (`copied`) that no adjoint having seen it reads; else a new
// version, which no adjoint has seen yet. leaf_slots makes the same choice.
bool in_place(bool copied, uint64_t a, std::unordered_map<uint64_t, bool>* read) {
  auto held = read->find(a);
  if (copied && held != read->end() && !held->second) return true;
  (*read)[a] = false;
  return false;
}

}  // namespace

bool Tape::overwrites_whole(const Record& r, std::span<const Arg> args, uint64_t array) const {
  const std::vector<codegen::WholeStore>* whole = session_->whole_stores(r.forward);
  if (whole == nullptr) return false;
  const codegen::WholeStore* w = nullptr;
  for (const codegen::WholeStore& x : *whole) {
    if (x.param < args.size() && args[x.param].kind == runtime::ParamKind::kNdArray &&
        args[x.param].array.id == array) {
      w = &x;
    }
  }
  Result<std::vector<uint32_t>> shape = session_->shape(NdArrayHandle{array});
  if (w == nullptr || !shape.ok() || shape->size() != w->axes.size()) return false;
  auto extent = [&](uint32_t p, uint32_t d) -> std::optional<uint32_t> {
    if (p >= args.size() || args[p].kind != runtime::ParamKind::kNdArray) return std::nullopt;
    Result<uint32_t> e = session_->extent(args[p].array, d);
    return e.ok() ? std::optional<uint32_t>(*e) : std::nullopt;
  };
  auto scalar = [&](uint32_t p) -> int64_t { return p < args.size() ? args[p].i : 0; };
  const adstack::SizeInputs sizes{
      scalar, [&](uint32_t p, uint32_t d) -> int64_t { return extent(p, d).value_or(0); }};
  const codegen::UniformInputs rows{scalar, extent};
  const std::shared_ptr<const codegen::KernelAccess> access = session_->launch_access(r.forward);
  auto end_of = [&](const adstack::SizeExpr& e) -> std::optional<int64_t> {
    Result<int64_t> v = adstack::evaluate(e, sizes);
    return v.ok() ? std::optional<int64_t>(*v) : std::nullopt;
  };
  return codegen::whole_store_covers(*w, *shape, end_of, access.get(), rows);
}

Status Tape::leaf_slots(size_t first, size_t last,
                        std::set<std::pair<uint64_t, uint64_t>>* keys) const {
  std::unordered_set<uint64_t> copied;
  std::unordered_map<uint64_t, bool> read;
  std::unordered_map<uint64_t, uint64_t> made;  // form -> copies of it taken so far
  for (size_t j = first; j < last; ++j) {
    const Record& r = records_[j];
    note_adjoint_reads(r, std::span<const Arg>(args_.data() + r.arg_begin, r.arg_count), &read);
    if (stable_records_[j]) continue;
    const std::span<const uint64_t> writes(written_.data() + r.written_begin, r.written_count);
    for (uint32_t w = 0; w < r.written_count; ++w) {
      if (in_place(copied.count(writes[w]) != 0, writes[w], &read)) continue;
      VKAD_ASSIGN_OR_RETURN(uint64_t index, copies_->form_index(writes, w));
      const uint64_t form = index >> 32;
      keys->insert({made[form]++, form << 32});
      copied.insert(writes[w]);
    }
  }
  return {};
}

Result<codegen::CheckpointPlan> Tape::exact_two_levels(uint64_t state,
                                                       const std::string& what) const {
  const size_t n = records_.size();
  find_stable();
  Result<codegen::CheckpointPlan> best =
      make_error(ErrorCode::kInvalidArgument, what + ": no two-level plan fits");
  for (uint64_t m = 1;; m = std::max(m + 1, m * 3 / 2)) {
    const size_t top = static_cast<size_t>(std::min<uint64_t>(m * top_, n));
    std::set<std::pair<uint64_t, uint64_t>> keys;
    for (size_t a = 0; a < n; a += top) VKAD_TRY(leaf_slots(a, std::min(n, a + top), &keys));
    uint64_t leaf = 0;
    for (const auto& [position, index] : keys) leaf += copies_->form_bytes(index >> 32);
    // The end state, a copy of what each level-0 segment writes at its start (at most all of
    // it), and the deepest level's slots.
    const uint64_t bytes = state + (n + top - 1) / top * state + leaf;
    if (bytes <= memory_budget_ && (!best.ok() || bytes < best->peak_bytes)) {
      codegen::CheckpointPlan p;
      p.launches = static_cast<uint32_t>(n);
      p.segments = {static_cast<uint32_t>(top), 1};
      p.state_bytes = state;
      p.launch_bytes = (leaf + top - 1) / top;
      p.peak_bytes = bytes;
      p.min_bytes = bytes;
      p.recompute = 2;
      best = std::move(p);
    }
    if (top >= n) break;
  }
  return best;
}

Status Tape::reverse_leaf(int at, size_t first, size_t last,
                          std::vector<TapeAdjointLaunch>* launched) {
  // The last level: each launch runs again into copies of what it writes, so the arrays
  // themselves keep the segment's start state (as reverse_range leaves them) and no copy goes
  // back. `now`: each array written so far in the segment -> its latest copy; a launch reads
  // the latest versions, and writes into its own copy of each written array, made from the
  // latest version first (the launch may write only some elements). Its adjoint then sees
  // every array as the launch did: the versions before it.
  //
  // A version no adjoint reads needs no keeping: `read` holds, per array written so far, whether
  // an adjoint that sees its latest version reads that array's values. A launch writing an
  // array whose latest version is one of the tape's copies and unread writes it in place --
  // no copy, no new slot (a fill's zeros that a scatter then accumulates into; a linear
  // stencil's ring, whose adjoints read only gradients). The arrays themselves are never
  // written: they keep the segment's start state.
  std::unordered_map<uint64_t, NdArrayHandle> now;
  std::unordered_map<uint64_t, bool> read;
  auto version = [&](const Arg& a) {
    if (a.kind != runtime::ParamKind::kNdArray) return a;
    auto v = now.find(a.array.id);
    return v == now.end() ? a : Arg::ndarray(v->second);
  };
  // A copy's slot: the k-th copy of its form (dtype and shape) in the segment, so segments
  // whatever their phase in a periodic recording share slots (leaf_slots counts them alike).
  std::unordered_map<uint64_t, uint64_t> made;         // form -> copies of it taken so far
  std::vector<std::vector<Arg>> before(last - first);  // launch j's arguments as it saw them
  std::vector<Arg> redirected;
  for (size_t j = first; j < last; ++j) {
    const Record& r = records_[j];
    const std::span<const Arg> args(args_.data() + r.arg_begin, r.arg_count);
    std::vector<Arg>& seen = before[j - first];
    for (const Arg& a : args) seen.push_back(version(a));
    note_adjoint_reads(r, args, &read);
    if (stable_records_[j]) continue;  // what it wrote is still there
    const std::span<const uint64_t> writes(written_.data() + r.written_begin, r.written_count);
    for (uint32_t w = 0; w < r.written_count; ++w) {
      const NdArrayHandle a{writes[w]};
      if (in_place(now.count(a.id) != 0, a.id, &read)) continue;
      VKAD_ASSIGN_OR_RETURN_CTX(uint64_t index, copies_->form_index(writes, w), "tape.backward");
      const uint64_t form = index >> 32;
      VKAD_ASSIGN_OR_RETURN_CTX(NdArrayHandle c, copies_->slot(at, made[form]++, form << 32, a),
                                "tape.backward");
      // A fill, or a launch storing to every element without reading: nothing to start from.
      if (r.forward.id != 0 && !overwrites_whole(r, args, a.id)) {
        VKAD_TRY_CTX(copy_array(version(Arg::ndarray(a)).array, c, launched), "tape.backward");
      } else {
        copies_->pin(c.id);
      }
      now[a.id] = c;
    }
    redirected.clear();
    for (const Arg& a : args) redirected.push_back(version(a));
    VKAD_TRY(launch_forward_again(j, launched, redirected));
  }
  // ... then last launch first, its adjoint on the versions it saw.
  for (size_t j = last; j-- > first;) {
    VKAD_TRY(launch_adjoint(j, before[j - first]));
    if (launched && records_[j].forward.id != 0) {  // a fill's adjoint is a fill
      launched->push_back({j, false, {}, false, false});
    }
  }
  return {};
}

Status Tape::reverse_range(const codegen::CheckpointPlan& plan, size_t level, size_t first,
                           size_t last, std::vector<TapeAdjointLaunch>* launched) {
  const int at = static_cast<int>(level);
  if (level + 1 == plan.segments.size()) return reverse_leaf(at, first, last, launched);
  // A deeper level: its segments' starts copied while their launches run again (the last
  // segment's need not run: the level below runs it), then each reversed, last first.
  const size_t len = plan.segments[level];
  const size_t parts = (last - first + len - 1) / len;
  std::vector<std::vector<uint64_t>> starts(parts);
  for (size_t p = 0; p < parts; ++p) {
    const size_t a = first + p * len, b = std::min(last, a + len);
    written_by(a, b, &starts[p]);
    for (size_t i = 0; i < starts[p].size(); ++i) {
      const NdArrayHandle x{starts[p][i]};
      VKAD_ASSIGN_OR_RETURN_CTX(uint64_t index, copies_->form_index(starts[p], i), "tape.backward");
      VKAD_ASSIGN_OR_RETURN_CTX(NdArrayHandle c, copies_->slot(at, p, index, x), "tape.backward");
      VKAD_TRY_CTX(copy_array(x, c, launched), "tape.backward");
    }
    if (p + 1 == parts) break;
    for (size_t j = a; j < b; ++j) {
      if (!stable_records_[j]) VKAD_TRY(launch_forward_again(j, launched));
    }
  }
  for (size_t p = parts; p-- > 0;) {
    const size_t a = first + p * len, b = std::min(last, a + len);
    for (size_t i = 0; i < starts[p].size(); ++i) {
      VKAD_ASSIGN_OR_RETURN_CTX(uint64_t index, copies_->form_index(starts[p], i), "tape.backward");
      VKAD_TRY_CTX(copy_array(copies_->at(at, {p, index}), NdArrayHandle{starts[p][i]}, launched),
                   "tape.backward");
    }
    VKAD_TRY(reverse_range(plan, level + 1, a, b, launched));
  }
  return {};
}

Status Tape::launch_adjoint(size_t index, std::span<const Arg> forward_args) {
  const Record& r = records_[index];
  if (forward_args.empty()) {
    forward_args = std::span<const Arg>(args_.data() + r.arg_begin, r.arg_count);
  }
  if (r.forward.id == 0) {
    // A fill's adjoint: what reached the array's values after it came from nothing before it.
    auto g = grads_.find(args_[r.arg_begin].array.id);
    if (g == grads_.end()) return {};
    const NdArrayHandle grad = g->second.grad;
    std::erase_if(pending_clears_, [&](NdArrayHandle p) { return p.id == grad.id; });
    VKAD_TRY_CTX(session_->fill(grad, 0.0),
                 "tape.backward: adjoint of fill " + std::to_string(index));
    return {};
  }
  adjoint_args_.assign(forward_args.begin(), forward_args.end());
  // An in-place update's copies from before its launch (Session::in_place; the adjoint adds
  // their gradients into the arrays' own).
  for (uint32_t i = 0; i < r.before_count; ++i) {
    adjoint_args_.push_back(Arg::ndarray(before_[r.before_begin + i]));
  }
  const size_t forward_count = adjoint_args_.size();
  // The gradients are the recorded arrays' (an array's copy shares its gradient).
  for (uint32_t k = 0; k < r.grad_count; ++k) adjoint_args_.push_back(Arg::ndarray(gradient(r, k)));
  VKAD_TRY(flush_clears(adjoint_args_));
  // The gradients to clear after it; a gradient array shared with another parameter would lose
  // what the adjoint adds into it for that one: the clearing adjoint then, as recorded.
  std::vector<NdArrayHandle> clears;
  bool shared = false;
  const std::span<const Arg> grads(adjoint_args_.data() + forward_count, r.grad_count);
  for (uint32_t c = 0; c < r.clear_count; ++c) {
    const uint32_t param = clear_params_[r.clear_begin + c];
    for (uint32_t k = 0; k < r.grad_count; ++k) {
      if (grad_params_[r.grad_begin + k] != param) continue;
      const NdArrayHandle g = grads[k].array;
      shared = shared || std::count_if(grads.begin(), grads.end(),
                                       [&](const Arg& a) { return a.array.id == g.id; }) > 1;
      clears.push_back(g);
    }
  }
  {
    LaunchNote note(*session_, "the adjoint of tape entry", index);
    VKAD_TRY_CTX(session_->launch(shared ? r.clearing : r.adjoint, adjoint_args_),
                 "tape.backward: adjoint of launch " + std::to_string(index));
  }
  if (shared) return {};
  for (NdArrayHandle g : clears) {
    std::erase_if(pending_clears_, [&](NdArrayHandle p) { return p.id == g.id; });
    pending_clears_.push_back(g);
  }
  return {};
}

bool Tape::stores_only_whole(const Record& r, std::span<const Arg> args,
                             const codegen::KernelAccess& access) const {
  size_t stored = 0;
  for (const codegen::ParamAccess& pa : access.params) {
    if (!stores_to(pa)) continue;
    if (pa.param >= args.size() || args[pa.param].kind != runtime::ParamKind::kNdArray ||
        !overwrites_whole(r, args, args[pa.param].array.id)) {
      return false;
    }
    ++stored;
  }
  return stored > 0;
}

Status Tape::flush_clears(std::span<const Arg> args, bool all) {
  for (size_t i = 0; i < pending_clears_.size();) {
    const NdArrayHandle g = pending_clears_[i];
    const bool passed = all || std::any_of(args.begin(), args.end(), [&](const Arg& a) {
                          return a.kind == runtime::ParamKind::kNdArray && a.array.id == g.id;
                        });
    if (!passed) {
      ++i;
      continue;
    }
    pending_clears_.erase(pending_clears_.begin() + static_cast<std::ptrdiff_t>(i));
    VKAD_TRY_CTX(session_->fill(g, 0.0), "tape.backward: a gradient's clear");
  }
  return {};
}

NdArrayHandle Tape::gradient(const Record& r, uint32_t k) const {
  const uint32_t param = grad_params_[r.grad_begin + k];
  const Arg& x = args_[r.arg_begin + param];
  if (x.kind != runtime::ParamKind::kNdArray) return scalar_grads_.at({r.forward.id, param}).grad;
  auto it = grads_.find(x.array.id);
  // None for an array freed since it was recorded: the launch refuses that array first.
  return it != grads_.end() ? it->second.grad : NdArrayHandle{};
}

Result<NdArrayHandle> Tape::scalar_grad(const Differentiated& d, uint32_t param) const {
  bool differentiated = false;
  for (const GradientParam& g : d.gradients) differentiated = differentiated || g.param == param;
  auto it = scalar_grads_.find({d.forward.id, param});
  if (!differentiated || it == scalar_grads_.end()) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "tape.scalar_grad: parameter " + std::to_string(param) + " of kernel " +
            runtime::handle_string(d.forward.id) +
            (differentiated ? " has no scalar gradient: it is an ndarray (grad(array) "
                              "gives its gradient), or no backward has run over a "
                              "recorded launch of the kernel"
                            : " is not a differentiated (grad) parameter"));
  }
  return it->second.grad;
}

Result<NdArrayHandle> Tape::grad(NdArrayHandle array) const {
  auto it = grads_.find(array.id);
  if (it == grads_.end()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "tape.grad: " + label(array) +
                          " is not a differentiated (grad) argument of any recorded launch, or "
                          "backward() has not run");
  }
  VKAD_TRY_CTX(session_->dtype(array).status(), "tape.grad");  // freed since: not its gradient
  return it->second.grad;
}

Status Tape::set_grad(NdArrayHandle array, NdArrayHandle grad) {
  if (grad.id == 0) {
    auto it = grads_.find(array.id);
    if (it != grads_.end() && !it->second.owned) grads_.erase(it);
    return {};
  }
  VKAD_ASSIGN_OR_RETURN_CTX(DType at, session_->dtype(array), "tape.set_grad");
  VKAD_ASSIGN_OR_RETURN_CTX(DType gt, session_->dtype(grad), "tape.set_grad");
  VKAD_ASSIGN_OR_RETURN_CTX(std::vector<uint32_t> as, session_->shape(array), "tape.set_grad");
  VKAD_ASSIGN_OR_RETURN_CTX(std::vector<uint32_t> gs, session_->shape(grad), "tape.set_grad");
  if (array.id == grad.id) {
    return make_error(ErrorCode::kInvalidArgument,
                      "tape.set_grad: " + label(array) + " cannot be its own gradient");
  }
  if (at != gt || as != gs) {
    auto describe = [](DType t, const std::vector<uint32_t>& shape) {
      std::string out = std::string(runtime::dtype_name(t)) + " of shape (";
      for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
      return out + (shape.size() == 1 ? ",)" : ")");
    };
    return make_error(ErrorCode::kInvalidArgument,
                      "tape.set_grad: the gradient " + label(grad) + " is " + describe(gt, gs) +
                          ", " + label(array) + " is " + describe(at, as) +
                          "; a gradient has its array's dtype and shape");
  }
  auto it = grads_.find(array.id);
  if (it != grads_.end()) {
    if (it->second.owned && it->second.grad.id != grad.id) (void)session_->free(it->second.grad);
    it->second = Grad{grad, false, 0};
  } else {
    grads_.emplace(array.id, Grad{grad, false, 0});
  }
  return {};
}

}  // namespace vkad
