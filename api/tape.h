// vkad::Tape — records launches of differentiated kernels and runs their adjoints, with
// gradient storage that lives across iterations:
//
//   vkad::Tape tape(session);                       // borrows the session; outlive it not
//   for (int it = 0; it < iterations; ++it) {
//     tape.reset();                                 // a new recording; gradients are kept
//     for (int k = 0; k < steps; ++k) tape.launch(step, {Arg::ndarray(x[k]),
//     Arg::ndarray(x[k+1])}); tape.launch(loss_kernel, {Arg::ndarray(x[steps]),
//     Arg::ndarray(loss)}); tape.backward({TapeSeed::of_value(loss, 1.0)});   // zero, seed,
//     adjoints last-first session.launch(update, {..., Arg::ndarray(*tape.grad(x[0]))});
//   }
//
// Duties, and why each exists:
//  - launch(d, args) launches d.forward (Session::launch) and records (d, args), so backward can
//    launch each adjoint with the forward's own arguments (Differentiated::adjoint_args).
//  - Gradient storage: the gradient of an array (same dtype and shape) is made the first time a
//    backward needs it and kept, keyed by the array's handle, for later recordings: after the
//    first iteration a backward allocates and frees nothing. A gradient the tape made is freed
//    by the first reset() or backward() after its array was freed (handles are never reused,
//    so a stale key can never name another array), and by the tape's destruction.
//    set_grad(array, g) makes g (the caller's, never freed by the tape) array's gradient.
//  - backward zeroes every gradient the recording needs in one Session::zero(span) (one barrier
//    pair, one fill each), seeds, then launches the adjoints last-first. Nothing waits.
//
// Memory (docs/tape.md): a recorded launch keeps its arguments' handles, not
// copies, and backward reads every array as it is when the adjoints run (reverse mode reads the
// forward's inputs as they are). An array a recorded launch loads that something not on the
// tape writes before backward (Runtime::write_count: a launch, upload, fill, zero or copy) makes
// backward, and the next recorded launch that uses it, fail with kFailedPrecondition naming the
// array and the writer. So a launch recorded later must not overwrite an array that an
// earlier recorded launch reads, or one it wrote through a differentiated parameter; launch()
// refuses such a launch before it runs (api/tape_hazards.h has the rule: rows given by
// launch-uniform indices are compared, so DiffTaichi's time axis -- launch f reads row f and
// writes row f + 1 -- is accepted). A simulation of S steps over a state of B bytes holds S + 1
// states, (S + 1) x B, as one array with a time axis or S + 1 arrays, for as long as the
// recording is to be differentiated, plus one gradient (same size) per differentiated array --
// another (S + 1) x B when every step's state is differentiated -- kept across recordings.
// Nothing else grows with S (the recording itself is a few dozen host bytes per launch, plus a
// hash entry per row an array is read at). When that does not fit: checkpointing
// (set_checkpoint_every(K)) lets the recording reuse a few state arrays (a ring: step f reads A
// and writes B, step f + 1 reads B and writes A), which the default tape refuses. Before each
// launch the tape copies each array it writes, the first time the array is written in its
// segment of K launches (the segment's start state); backward runs the segments last first:
// copies the segment's start state back, launches its forward launches again, each into copies
// of what it writes (made from the latest version; the arrays keep the start state), then, last
// launch first, runs its clearing adjoint on the versions the launch saw
// (Session::clearing_adjoint: a store's adjoint clears the seed it read,
// so the array's gradient holds, in turn, the seed of each version of the array). Memory: the
// ring's arrays, plus one copy of each written array per segment (S / K) and per launch of a
// segment (K), plus one of the recording's end state (backward puts it back when it is done,
// so the arrays hold what the forward left, as without checkpointing); compute: the forward
// twice. Inside a graph capture the copies are launches of copy kernels (Session::copy), so a
// checkpointed iteration is captured, reworked and replayed like any other.
//
// Contract: every fallible call returns Status / Result and never throws. A Tape borrows its
// Session, which must outlive it, and is externally synchronised like the session. Launches
// and gradient arrays are plain handles: the caller keeps the arrays of the recorded launches
// alive until backward has run (a freed one is the error Session::launch gives for it).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "api/session.h"
#include "graph/checkpoint_schedule.h"

namespace vkad {

class TapeHazards;  // api/tape_hazards.h
class TapeCopies;   // api/tape_copies.h

// One launch of a step loop's body on a tape (Tape::launch_loop): a differentiate() result, its
// arguments in the first iteration, per parameter what an i32 scalar gains per iteration
// (empty: nothing steps). With `d` null, `kernel` is a launch of a kernel that is not
// differentiated: it runs with the loop, in its place in the body, and is neither checked nor
// recorded (as Session::launch of it beside a tape).
struct TapeLoopLaunch {
  const Differentiated* d = nullptr;
  std::vector<Arg> args;
  std::vector<int32_t> step;
  KernelHandle kernel;  // when d is null
};

// The tape's checks of step loops, kept for tapes that record the same loop first in a
// recording again (a training loop's iterations): from an empty record, the same launches --
// kernels, arguments (handles are never reused), steps and count -- leave the same record, so
// Tape::launch_loop takes it instead of checking ~10^4 launches again. prepare() checks a loop
// ahead (a front door's prepare_loop). At most kMax loops, the oldest dropped first. Shared by
// the tapes of one session (Tape::set_loop_checks); externally synchronised like the session.
class TapeLoopChecks {
 public:
  static constexpr size_t kMax = 8;
  TapeLoopChecks();
  ~TapeLoopChecks();
  // Checks `body` from an empty record, `count` iterations, and keeps the record it leaves.
  // The check's error (nothing kept) where a launch is refused. Launches nothing.
  Status prepare(Session& session, std::span<const TapeLoopLaunch> body, uint32_t count);
  size_t size() const { return entries_.size(); }

 private:
  friend class Tape;
  struct Entry;
  // Tape::launch_loop's check of every iteration's launches against `hazards` (the tape's
  // record), on a thread of its own while this one readies the loop (Session::ready_loop);
  // `hazards` left as it was where a launch is refused, with the refusal's message. `known`:
  // the checks kept (null: none), consulted and filled from an empty record.
  static Status check(Session& session, TapeHazards& hazards, TapeLoopChecks* known,
                      std::span<const TapeLoopLaunch> body, std::span<const LoopLaunch> launches,
                      uint32_t count);
  const TapeHazards* find(std::span<const LoopLaunch> launches, uint32_t count) const;
  void keep(std::vector<LoopLaunch> launches, uint32_t count, const TapeHazards& after);
  std::vector<std::unique_ptr<Entry>> entries_;
};

// One launch, or adjoint loop, a backward made, in order (Tape::backward's `launched`): for
// front doors that mirror a graph capture's launches (Python's Graph). `record`: the record
// whose adjoint ran (a launch_loop group's first, then `loop` says how the loop ran). A
// checkpointed tape's backward also launches records' forwards again (`is_forward`) and copies
// (`is_copy`: Session::copy, a launch of a copy kernel inside a capture, one entry each).
struct TapeAdjointLaunch {
  size_t record = 0;
  bool is_loop = false;
  LoopInfo loop;
  bool is_forward = false;
  bool is_copy = false;
};

// d(objective)/d(array) for one output: `value` for every element, or, when `data` is not
// null, `bytes` of host data (exactly the array's size; copied before backward returns).
struct TapeSeed {
  NdArrayHandle array;
  double value = 0;
  const void* data = nullptr;
  uint64_t bytes = 0;
  static TapeSeed of_value(NdArrayHandle array, double value) { return {array, value, nullptr, 0}; }
  static TapeSeed of_data(NdArrayHandle array, const void* data, uint64_t bytes) {
    return {array, 0, data, bytes};
  }
  template <typename T>
  static TapeSeed of_data(NdArrayHandle array, std::span<const T> data) {
    return {array, 0, data.data(), data.size_bytes()};
  }
};

class Tape {
 public:
  explicit Tape(Session& session);
  // Frees the gradient arrays the tape made (after their in-flight uses, as Session::free);
  // set_grad's arrays stay the caller's.
  ~Tape();
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  // Launches d.forward with `args` (Session::launch, asynchronous) and records it. kInvalid-
  // Argument, nothing launched or recorded, when args.size() differs from d.forward_params
  // ("tape.launch: 3 arguments given, the forward kernel has 4 parameters"), or the launch
  // passes one array for a parameter it writes and one it reads (in place: TapeHazards::
  // check_aliasing; a checkpointed tape refuses it too), or the launch would overwrite what
  // an earlier launch of this recording read or wrote through a differentiated parameter
  // (TapeHazards::check: the message names both launches, the array and the row; kInvalid-
  // Argument also when d.forward is not a live differentiate() result of this session);
  // otherwise Session::launch's errors, with "tape.launch: " in front. `id` as in
  // Session::launch. A launch captured into a graph (Session::begin_capture) is checked the
  // same way; a replay's scalar updates are not (they could move rows: docs/tape.md). A
  // differentiated f32 / f64 scalar parameter gets its gradient in scalar_grad().
  Status launch(const Differentiated& d, std::span<const Arg> args, LaunchId* id = nullptr);
  Status launch(const Differentiated& d, std::initializer_list<Arg> args, LaunchId* id = nullptr) {
    return launch(d, std::span<const Arg>(args.begin(), args.size()), id);
  }
  // A fill of `array` with `value` in its place on the tape (DiffTaichi's grid cleared and
  // refilled every step). A fill of an array no recorded launch was passed is Session::fill,
  // not recorded (the array's state before the recording). Otherwise, with checkpointing on
  // (set_checkpoint_every, set_memory_budget), it is recorded: backward's runs of the forward
  // fill again where the recording did, and in reverse the array's gradient is zeroed there
  // (what the array held before the fill reaches nothing after it) -- a Session::fill beside
  // such a tape would not run again, and the recomputed launches would read what it was to
  // clear. Without checkpointing it is refused (kInvalidArgument, nothing run: backward reads
  // the arrays as they are when it runs), the message pointing to set_memory_budget.
  // Session::fill's errors, with "tape.fill: " in front.
  Status fill(NdArrayHandle array, double value);
  // Session::copy(src, dst) inside the recording. Where the recording has touched src or dst
  // (passed it to a recorded launch) and they are f32 / f64, it is recorded as a launch of the
  // differentiated copy `dst[...] = src[...]` (Session::differentiated_copy): checked and
  // recorded as launch() does, and backward adds dst's gradient into src's (NVIDIA/warp#1728's
  // case). Otherwise it is the arrays' state before the recording (or has no gradient) and is a
  // plain Session::copy. Session::copy's errors (dtypes or shapes that differ, one array), with
  // "tape.copy: " in front; launch()'s refusals.
  Status copy(NdArrayHandle src, NdArrayHandle dst);
  // A step loop on the tape (Session::launch_loop; docs/graphs.md, "Step loops"): every launch of
  // every iteration checked as launch() checks it, all before any runs (a refused one names
  // the body's launch, its kernel and the iteration, and nothing is recorded; the check runs
  // on a thread of its own while the caller's readies the loop, Session::ready_loop; a loop
  // first in a recording that set_loop_checks' checks know is not checked again), then the
  // loop launched --
  // one resident kernel where it qualifies -- and recorded as its body's launches with their
  // steps and count; backward runs their adjoints as one loop (the body reversed, from the last
  // iteration down). With checkpointing on, or a body launch whose adjoint counts its loops'
  // trips (Differentiated::counted) or reads an in-place update's copy (Differentiated::
  // in_place), the iterations go through launch() one by one (a launch refused there leaves
  // the ones before it recorded, and backward refuses until reset()). A
  // loop launched one by one that fails past the checks leaves what ran off the tape, and
  // backward refuses until reset().
  Status launch_loop(std::span<const TapeLoopLaunch> body, uint32_t count,
                     LoopInfo* info = nullptr);

  // Zeroes the gradient of every differentiated argument of the recorded launches (making the
  // missing ones: same dtype and shape), seeds (a value fills the output's gradient, host data
  // is uploaded into it), then launches every recorded adjoint, last launch first. Records;
  // never waits, but for an adjoint that counts its loops' trips (Differentiated::counted),
  // whose launch waits for the counts (Session::differentiate).
  // kInvalidArgument, nothing recorded, when nothing was recorded since the last reset
  // ("tape.backward: no launch of a differentiated kernel was recorded"), a seed names an array
  // that no recorded launch differentiates ("tape.backward: seed for ndarray 1:4, which is not a
  // differentiated (grad) argument of any recorded launch"), host data of the wrong size, or a
  // value the gradient's dtype cannot hold. Gradients made before a later failure are kept. A
  // launch failing among the adjoints (an argument freed since it was recorded) returns its
  // error ("tape.backward: adjoint of launch 3: ...") with the adjoints before it recorded.
  // The recording stays: backward may run again (gradients are zeroed again, not accumulated).
  // A differentiated array freed since it was recorded gets no gradient: the adjoint of the
  // first launch (last first) that passes it returns the launch's error for it.
  // `launched`, when not null, gets each adjoint launch and adjoint loop in the order they
  // were made (also those before a failure).
  Status backward(std::span<const TapeSeed> seeds,
                  std::vector<TapeAdjointLaunch>* launched = nullptr);
  Status backward(std::initializer_list<TapeSeed> seeds) {
    return backward(std::span<const TapeSeed>(seeds.begin(), seeds.size()));
  }

  // The gradient array of `array`: made by a backward, or given to set_grad. It lives while
  // the tape and `array` do. kInvalidArgument ("tape.grad: ndarray 1:4 is not a differentiated
  // (grad) argument of any recorded launch, or backward() has not run") otherwise.
  Result<NdArrayHandle> grad(NdArrayHandle array) const;
  // The gradient of differentiated scalar parameter `param` (an f32 / f64 scalar marked grad)
  // of d's forward kernel: a shape {1} array, made by a backward and kept like an array's
  // gradient, holding d(objective)/d(value) summed over every recorded launch of d.forward --
  // the gradient with respect to the value when every launch is passed the same one.
  // kInvalidArgument when `param` is not such a parameter of d, or no backward has run over a
  // launch of d.forward.
  Result<NdArrayHandle> scalar_grad(const Differentiated& d, uint32_t param) const;
  // Makes `grad` (the caller's; the tape never frees it) the gradient of `array` from now on; a
  // gradient the tape had made for `array` is freed. kInvalidArgument when either handle is
  // not live, they are the same array, or their dtypes or shapes differ; nothing changes then.
  // A null `grad` (id 0) forgets a gradient set_grad gave (the next backward makes one); a
  // gradient the tape made stays.
  Status set_grad(NdArrayHandle array, NdArrayHandle grad);
  // Whether the tape holds a gradient for `array` (made or set), live or not.
  bool has_grad(NdArrayHandle array) const { return grads_.count(array.id) != 0; }
  // Forgets the recorded launches and what they read and wrote (a new recording starts); keeps
  // the gradients, except those of arrays freed meanwhile, which it frees.
  void reset();

  // Checkpointing across launches (see the file comment): K launches per segment, 0 = off (the
  // default). kFailedPrecondition while launches are recorded (set it before a recording, or
  // after reset()). The copies it keeps are made on first use and kept, like gradients, for
  // later recordings; they are freed with the tape, or by a backward (outside a capture) that
  // no longer uses them, except those a captured graph launches with.
  Status set_checkpoint_every(uint32_t launches_per_segment);
  uint32_t checkpoint_every() const { return checkpoint_every_; }
  // Checkpointing within a memory budget (docs/tape.md, "A memory budget"): the copies the
  // tape holds stay within `bytes` (device memory, the end-state copy included; the user's
  // arrays and the gradients are not counted) and backward recomputes the least that allows:
  // codegen::plan_checkpoints picks the fewest levels of checkpoints that fit (graph/
  // checkpoint_schedule.h; two levels run every launch twice, as set_checkpoint_every does),
  // from an estimate; where that asks for more than two, two levels counted exactly
  // (exact_two_levels) are taken where they fit.
  // The recording cuts level 0: from the previous recording's plan where there was one (a
  // training loop's iterations record the same launches), else segments of one launch that
  // double (two merged into one, their copies reused) whenever level 0 would hold more than
  // half the budget -- so a recording of a length unknown ahead still fits. 0 turns it off;
  // replaces set_checkpoint_every (and is replaced by it). kFailedPrecondition while launches
  // are recorded. A budget below what a recording needs is refused by the launch that finds
  // it (its copies alone exceed the budget) or by backward (no plan fits), with the least
  // bytes that would do; nothing is launched then.
  Status set_memory_budget(uint64_t bytes);
  uint64_t memory_budget() const { return memory_budget_; }
  // The schedule backward runs for the recording so far: levels, segments, peak bytes and how
  // many times each launch runs. kFailedPrecondition without checkpointing or a recording;
  // kInvalidArgument (the minimum named) where the budget fits no plan.
  Result<codegen::CheckpointPlan> checkpoint_plan() const;
  // Device bytes the tape's checkpoint copies hold now (kept across recordings; within the
  // budget after a backward run outside a capture).
  uint64_t checkpoint_bytes() const;
  // The loop checks launch_loop consults and fills (null: none kept; the default).
  void set_loop_checks(std::shared_ptr<TapeLoopChecks> checks) { loop_checks_ = std::move(checks); }
  // What a gradient holds after backward where the recording wrote the array. True (no
  // checkpointing): grad(x) at an element a recorded launch stored is d(objective)/d(the value
  // stored there) -- DiffTaichi's intermediate gradients, e.g. dL/dx[t] of a time axis. False
  // (checkpointing): each store's adjoint consumes and clears its seed (the array may hold
  // several versions), so every gradient is d(objective)/d(the array as the recording found
  // it): 0 where a launch overwrote the element, the same as without checkpointing elsewhere
  // (inputs, and elements only atomically added to).
  bool keeps_intermediate_gradients() const { return !checkpointing(); }

  // Records: a launch, a launch_loop's body launch (a loop counts its body once), or a fill
  // (checkpointing).
  size_t launches() const { return records_.size(); }
  // Gradient arrays held (made or set; scalar parameters' included).
  size_t gradients() const { return grads_.size() + scalar_grads_.size(); }

 private:
  struct Record {
    KernelHandle forward, adjoint;  // both 0 for a fill: args_ holds its array and value
    // A launch_loop's body launch: its group's first record, the body's size, the iterations
    // and its steps (arg_count of them, into steps_); loop_len 0 for a plain launch.
    uint32_t loop_first = 0, loop_len = 0, loop_count = 0, step_begin = 0;
    uint32_t arg_begin = 0, arg_count = 0;          // into args_
    uint32_t grad_begin = 0, grad_count = 0;        // into grad_params_
    uint32_t written_begin = 0, written_count = 0;  // into written_ (checkpointing only)
    // Checkpointing: a launch every store of which overwrites its array whole runs the plain
    // adjoint (`adjoint`), and the gradients of its stored differentiated parameters
    // (clear_params_[clear_begin, + clear_count), none for other launches) are zeroed after
    // it, deferred to the next adjoint passed one of them or the end of backward; `clearing` is
    // its clearing adjoint, run instead where one of those gradients is shared with another
    // parameter's.
    KernelHandle clearing;
    uint32_t clear_begin = 0, clear_count = 0;
    // An in-place update (Differentiated::in_place): the copies of its arrays taken before the
    // launch, before_[before_begin, + before_count), in Session::in_place's order.
    uint32_t before_begin = 0, before_count = 0;
  };
  struct Grad {
    NdArrayHandle grad;
    bool owned = false;  // made by the tape (freed by it) or given to set_grad
    uint64_t stamp = 0;  // the backward that last listed it (dedupes without allocating)
  };
  // Drops the gradients of arrays that are no longer live, freeing those the tape made.
  void prune();
  // backward's first part: the gradients the recording needs, made where missing (not for an
  // array freed since it was recorded), listed once each in zero_list_.
  Status list_gradients();
  // launch()'s part for an in-place update: a copy of each array `in_place` names, taken now
  // (before the launch), appended to before_; on an error none is left.
  Status copy_before(const std::vector<codegen::InPlaceParam>& in_place, std::span<const Arg> args);
  void free_before();
  // The adjoint of record `index` (a fill's: its array's gradient zeroed), with
  // `forward_args` in place of the recorded forward arguments where given.
  Status launch_adjoint(size_t index, std::span<const Arg> forward_args = {});
  // launch_loop's records: the body's launches with their steps and the count.
  void record_loop(std::span<const TapeLoopLaunch> body, uint32_t count);
  // The adjoint loop of the launch_loop group records_[first, first + len).
  Status launch_adjoint_loop(size_t first, size_t len, LoopInfo* info);
  // Checkpointing (set_checkpoint_every, set_memory_budget).
  bool checkpointing() const { return checkpoint_every_ != 0 || memory_budget_ != 0; }
  // set_checkpoint_every / set_memory_budget: one mode replaces the other.
  Status set_checkpointing(const char* what, uint32_t every, uint64_t budget);
  Result<codegen::CheckpointPlan> checkpoint_plan(const std::string& what) const;
  // launch()'s part with checkpointing on: the copies at its level-0 segment's start (merging
  // segments where the budget asks), then the launch.
  Status checkpointed_launch(const Differentiated& d, std::span<const Arg> args, LaunchId* id,
                             Record* r);
  // checkpointed_launch's parts: the arrays the launch writes onto written_ (and those new to
  // the recording, with their bytes, into `fresh`); the budget's refusal and level 0's merges.
  // Marks in `read` the arrays of record `r` (bound as `args`) whose values its adjoint reads
  // (Session::adjoint_reads of its adjoint; every array where that is unknown).
  void note_adjoint_reads(const Record& r, std::span<const Arg> args,
                          std::unordered_map<uint64_t, bool>* read) const;
  Status note_writes(const codegen::KernelAccess& access, std::span<const Arg> args, Record* r,
                     std::vector<std::pair<uint64_t, uint64_t>>* fresh);
  Status fit_budget(uint64_t state, uint64_t slot);
  // What recording an entry that writes `writes` (a launch, a recorded fill) takes with
  // checkpointing on, around `run` (which records it on the session): its copies' slot within
  // the budget (the recording's state with `fresh` added), its level-0 segment's start copies,
  // `run`; then the tape counts `fresh` and the slot. An error leaves the tape's counts as they
  // were (the caller drops what it noted on written_). A template, defined and used in tape.cpp
  // only: `run` inlined, no std::function allocated on a recording's path.
  template <typename Run>
  Status checkpointed_entry(std::span<const uint64_t> writes,
                            std::span<const std::pair<uint64_t, uint64_t>> fresh, Run&& run);
  Status checkpointed_backward(const codegen::CheckpointPlan& plan,
                               std::vector<TapeAdjointLaunch>* launched);
  // Record `record`'s forward (or fill) again, with `args` in place of its recorded ones
  // where given (a segment's copies: reverse_range).
  Status launch_forward_again(size_t record, std::vector<TapeAdjointLaunch>* launched,
                              std::span<const Arg> args = {});
  // Reverses records [first, last) at `level` of `plan` (their written arrays hold the state
  // at `first`; left so again): below the last level, cut into segments whose starts are copied
  // while their launches run again, each reversed last first; at the last, every launch's
  // written arrays copied before it runs again, then its adjoint last first.
  Status reverse_range(const codegen::CheckpointPlan& plan, size_t level, size_t first, size_t last,
                       std::vector<TapeAdjointLaunch>* launched);
  // Whether record `r` (a launch, with `args`) stores to every element of `array` without
  // reading it (Session::whole_stores, its extents and rows evaluated): a new version of the
  // array then needs no copy of the old one to start from.
  bool overwrites_whole(const Record& r, std::span<const Arg> args, uint64_t array) const;
  // Whether launch `r` (bound as `args`, forward accesses `access`) stores to some array and
  // every array it stores to is overwritten whole (overwrites_whole).
  // Whether a recorded launch was passed `array` (fill's and copy's test: an untouched array's
  // fill or copy is its state before the recording).
  bool recording_touched(NdArrayHandle array) const;
  bool stores_only_whole(const Record& r, std::span<const Arg> args,
                         const codegen::KernelAccess& access) const;
  // The pending clears among `args` (all of them: `all`) zeroed and no longer pending.
  Status flush_clears(std::span<const Arg> args, bool all = false);
  // The slots (position, form index) reverse_leaf takes for records [first, last), into
  // `keys`; launches nothing (find_stable first).
  Status leaf_slots(size_t first, size_t last, std::set<std::pair<uint64_t, uint64_t>>* keys) const;
  // checkpoint_plan's second look where its estimate leaves more than two levels: two levels
  // {m * top_, 1} with the deepest level's bytes counted exactly (leaf_slots over every
  // segment), the fitting one holding least; an error where none fits.
  Result<codegen::CheckpointPlan> exact_two_levels(uint64_t state, const std::string& what) const;
  // reverse_range's last level (`at`): records [first, last) again into copies, then their
  // adjoints, last first.
  Status reverse_leaf(int at, size_t first, size_t last, std::vector<TapeAdjointLaunch>* launched);
  // The arrays records [first, last) write, each once (stable ones left out).
  void written_by(size_t first, size_t last, std::vector<uint64_t>* out) const;
  // Before a checkpointed backward: the recording's *stable* arrays -- every element written at
  // most once, by launches (not fills) that write only stable arrays, and read only after that
  // write: the default tape's check (api/tape_hazards.h) accepts the recording's accesses to
  // them. A time axis (actuation[t, i] written by step t and read later) is the usual one. When
  // backward runs they hold what every launch saw, so they need no copies and a launch writing
  // only stable arrays (`stable_records_`) does not run again. Empty where the recording holds a
  // launch_loop group.
  void find_stable() const;
  // find_stable's first part: the written arrays whose accesses alone the check accepts.
  void stable_by_access(std::unordered_set<uint64_t>* stable) const;
  Status copy_array(NdArrayHandle from, NdArrayHandle to, std::vector<TapeAdjointLaunch>* launched);
  bool differentiated(NdArrayHandle array) const;
  // The gradient of record r's k-th differentiated parameter: its array's, or, for a scalar,
  // the one of (r.forward, parameter). Listed by backward before any adjoint asks.
  NdArrayHandle gradient(const Record& r, uint32_t k) const;

  // Writes from outside the recording. Before a launch or loop is recorded: kFailedPrecondition
  // naming the array when one of `args` that an earlier recorded launch reads was written since
  // the tape last touched it (Runtime::write_count), by a launch, upload, fill or copy that is
  // not on the tape. `where`: the message's opening.
  Status check_unwritten(std::span<const Arg> args, const std::string& where) const;
  // After a launch or loop of the recording ran: its arrays' write counts, for those `access`
  // says it loads (null: none) and those an earlier launch read.
  void note_touched(std::span<const Arg> args, const codegen::KernelAccess* access);

  Session* session_;  // borrowed
  // The arrays the recorded launches load -> their write count (Runtime::write_count) after the
  // recording last touched them. The adjoints read these arrays as they are when backward runs,
  // so a write from outside the recording in between (another launch, an upload, a fill: what
  // Warp's tape allows silently, NVIDIA/warp#1350) is refused by the next launch that uses
  // the array and by backward.
  std::unordered_map<uint64_t, uint64_t> reads_seen_;
  // What the recording read and wrote (launch refuses overwrites; api/tape_hazards.h).
  std::unique_ptr<TapeHazards> hazards_;
  std::vector<Record> records_;
  std::vector<Arg> args_;                     // every record's forward arguments, back to back
  std::vector<int32_t> steps_;                // launch_loop records' steps
  std::string broken_;                        // why backward refuses ("" where it may run)
  std::vector<uint32_t> grad_params_;         // every record's differentiated parameter indices
  std::unordered_map<uint64_t, Grad> grads_;  // array handle id -> its gradient
  // (forward kernel handle id, parameter) -> a differentiated scalar's gradient ({1}, owned).
  std::map<std::pair<uint64_t, uint32_t>, Grad> scalar_grads_;
  uint64_t epoch_ = 0;
  // backward's scratch, kept so that a steady-state backward allocates nothing on the host
  // either.
  std::vector<NdArrayHandle> zero_list_;
  std::vector<Arg> adjoint_args_;
  // Gradients whose clear (Record::clear_count) is pending: zeroed before the next adjoint
  // passed one of them, and at the end of backward.
  std::vector<NdArrayHandle> pending_clears_;
  std::vector<uint32_t> clear_params_;  // Record::clear_begin / clear_count
  // The copies in-place updates' adjoints read (Record::before_begin): the tape's, freed by
  // reset() and the destructor.
  std::vector<NdArrayHandle> before_;
  // Checkpointing (set_checkpoint_every, set_memory_budget).
  uint32_t checkpoint_every_ = 0;
  uint64_t memory_budget_ = 0;
  uint32_t top_ = 0;                    // the recording's level-0 segment length
  uint32_t planned_top_ = 0;            // budget mode: the previous backward's plan's, 0 before one
  uint64_t planned_top_bytes_ = 0;      // and what its level 0 holds
  std::vector<uint64_t> written_;       // every record's written arrays
  std::unique_ptr<TapeCopies> copies_;  // what the written arrays held (api/tape_copies.h)
  std::unordered_map<uint64_t, uint64_t> state_bytes_;  // the recording's written arrays' bytes
  std::unordered_set<uint64_t> touched_;  // arrays the recording's launches were passed
  // w: a deepest-level slot's bytes, the most copies of each form one launch needs (form_mult_;
  // TapeCopies::slot_bytes).
  uint64_t launch_bytes_ = 0;
  std::map<uint64_t, uint64_t> form_mult_;  // form -> the most arrays of it one launch writes
  std::shared_ptr<TapeLoopChecks> loop_checks_;
  // find_stable's, for the backward running (or checkpoint_plan's exact bytes).
  mutable std::unordered_set<uint64_t> stable_arrays_;
  mutable std::vector<bool> stable_records_;
  // Bumped by every record and reset; stable_of_: the value find_stable last ran at (0: none).
  uint64_t recorded_ = 1;
  mutable uint64_t stable_of_ = 0;
};

}  // namespace vkad
