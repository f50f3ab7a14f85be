// Binds vkad._Tape: the session's vkad::Tape (api/tape.h), which python/vkad/tape.py's Tape
// wraps. Recording (Session.launch / Session.loop inside `with t:`, launch.cpp and loop.cpp),
// backward, gradients, checkpointing and scalar gradients are vkad::Tape's; what this file adds
// is Python's: the recorded launches' Python objects kept alive, `array.grad` given to the tape
// as set_grad, the gradients viewed as NdArrays, and a capture's Graph told of the adjoints.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"

using namespace nb::literals;

namespace vkad_py {

Tape::Tape(StatePtr state) : st(std::move(state)) {
  Locked l(*st);
  tape = std::make_unique<vkad::Tape>(st->get());
  tape->set_loop_checks(st->loop_checks);
  std::lock_guard<std::mutex> p(st->pending_mu);
  st->tapes.push_back(this);
}

Tape::~Tape() {
  {
    std::lock_guard<std::mutex> p(st->pending_mu);
    st->tapes.erase(std::remove(st->tapes.begin(), st->tapes.end(), this), st->tapes.end());
  }
  if (!tape) return;  // the session closed first
  // Its gradients are freed by the vkad::Tape's destructor, which calls into the session.
  if (st->mu.try_lock()) {
    tape.reset();
    st->mu.unlock();
  } else {
    std::lock_guard<std::mutex> p(st->pending_mu);
    st->pending_tapes.push_back(std::move(tape));
  }
}

bool Tape::clear_record() {
  record_kernels.clear();
  loop_lens.clear();
  // The same list object, emptied (Tape.launches may be held by the caller).
  return PySequence_DelSlice(launches.ptr(), 0, PY_SSIZE_T_MAX) == 0;
}

vkad::Tape& Tape::get() {
  if (!tape) raise(Status(ErrorCode::kFailedPrecondition, "the session is closed"));
  return *tape;
}

void Tape::record(nb::handle kernel, Kernel* k, nb::handle args) {
  nb::tuple rec = nb::make_tuple(nb::borrow(kernel), args);
  untrack_if_atomic(args);
  untrack_if_atomic(rec);
  launches.append(rec);
  record_kernels.push_back(k);
}

void Tape::fill(nb::handle array, NdArrayHandle handle, double value) {
  size_t before = 0;
  bool recorded = false;
  uint32_t captured = 0;
  {
    Locked l(*st);
    before = get().launches();
    check(get().fill(handle, value));
    recorded = get().launches() != before;  // not where it ran as a plain fill
    captured = st->get().captured_launches();
  }
  pad_capture(*st, captured);  // the copies of a checkpoint it took first
  if (!recorded) return;
  launches.append(nb::make_tuple(nb::none(), nb::make_tuple(nb::borrow(array), value)));
  record_kernels.push_back(nullptr);
}

void Tape::copy(nb::handle src, nb::handle dst, NdArrayHandle a, NdArrayHandle b) {
  size_t before = 0;
  bool recorded = false;
  uint32_t captured = 0;
  {
    Locked l(*st);
    before = get().launches();
    check(get().copy(a, b));
    recorded = get().launches() != before;
    captured = st->get().captured_launches();
  }
  pad_capture(*st, captured);  // the copy kernel's launch, and a checkpoint's copies before it
  if (!recorded) return;
  launches.append(nb::make_tuple(nb::none(), nb::make_tuple(nb::borrow(src), nb::borrow(dst))));
  record_kernels.push_back(nullptr);
}

void Tape::record_loop(nb::object rec, const LoopRecord& loop) {
  loop_lens.emplace(record_kernels.size(), static_cast<uint32_t>(loop.entries.size()));
  for (const LoopEntry& e : loop.entries) record_kernels.push_back(e.k);
  launches.append(std::move(rec));
}

namespace {

Kernel* adjoint_of(const Kernel* fwd) { return nb::cast<Kernel*>(fwd->adjoint); }

// A gradient the tape owns as a Python NdArray that keeps the tape (`owner`) alive and frees
// nothing.
nb::object view(nb::handle owner, const StatePtr& st, NdArrayHandle h, DType dtype,
                std::vector<uint32_t> shape, std::string name) {
  auto* a = new NdArray();
  a->st = st;
  a->handle = h;
  a->dtype = dtype;
  a->shape = std::move(shape);
  a->name = std::move(name);
  a->owner = nb::borrow(owner);
  return nb::cast(a, nb::rv_policy::take_ownership);
}

NdArray& array_of(const Tape& t, nb::handle obj, const char* what) {
  NdArray* a = nullptr;
  if (!nb::try_cast<NdArray*>(obj, a) || !a) {
    invalid(std::string(what) + ": expected a vkad ndarray, got " +
            nb::type_name(obj.type()).c_str());
  }
  if (a->st != t.st) invalid(std::string(what) + ": " + a->label() + " belongs to another session");
  return *a;
}

// Each array's `array.grad` (the caller's gradient) given to the tape (set_grad), or taken back
// where the caller unset it or the array went, before a backward: per array with one, not per
// recorded launch (the record path stays as cheap as a launch).
void give_caller_grads(Tape& t) {
  for (const auto& [id, a] : t.st->with_grad) {
    NdArray* g = nullptr;
    if (a->freed || !nb::try_cast<NdArray*>(a->grad, g) || !g || g->freed) continue;
    auto it = t.caller_grads.find(id);
    if (it != t.caller_grads.end() && it->second == g->handle.id) continue;
    check(t.get().set_grad(a->handle, g->handle));
    t.caller_grads[id] = g->handle.id;
  }
  for (auto it = t.caller_grads.begin(); it != t.caller_grads.end();) {
    auto now = t.st->with_grad.find(it->first);
    NdArray* g = nullptr;
    const bool kept = now != t.st->with_grad.end() && !now->second->freed &&
                      nb::try_cast<NdArray*>(now->second->grad, g) && g && !g->freed &&
                      g->handle.id == it->second;
    if (kept) {
      ++it;
      continue;
    }
    (void)t.get().set_grad(NdArrayHandle{it->first}, NdArrayHandle{});
    it = t.caller_grads.erase(it);
  }
}

// What a backward launched, added to the Graph being captured (its adjoints' kernels, per
// launch, as Session.launch adds a launch's).
void add_to_capture(Tape& t, std::span<const vkad::TapeAdjointLaunch> launched) {
  if (t.st->capture.is_none()) return;
  Graph* g = nb::cast<Graph*>(t.st->capture);
  for (const vkad::TapeAdjointLaunch& l : launched) {
    if (l.is_copy) {  // a checkpointing tape's copy: a launch of a copy kernel
      g->add(nullptr);
      continue;
    }
    if (!l.is_loop) {
      Kernel* fwd = t.record_kernels[l.record];
      g->add(!fwd ? nullptr : l.is_forward ? fwd : adjoint_of(fwd));
      continue;
    }
    const uint32_t len = t.loop_lens.at(l.record);
    // The adjoint loop's body is the forward's reversed.
    add_loop_to_capture(*t.st, l.loop, len, [&](size_t j) {
      return adjoint_of(t.record_kernels[l.record + len - 1 - j]);
    });
  }
}

// Tape.backward's second half: `seeds` as (array, value) pairs, a value a float or a numpy
// array of the output's dtype and shape (tape.py converts them).
void backward(Tape& t, nb::list seeds) {
  std::vector<vkad::TapeSeed> s;
  std::vector<HostArray> hosts;  // the host seeds' buffers, alive until backward returns
  hosts.reserve(nb::len(seeds));
  for (nb::handle item : seeds) {
    nb::tuple pair = nb::borrow<nb::tuple>(item);
    NdArray& out = array_of(t, pair[0], "tape.backward");
    if (nb::isinstance<nb::float_>(pair[1])) {
      s.push_back(vkad::TapeSeed::of_value(out.handle, nb::cast<double>(pair[1])));
      continue;
    }
    hosts.push_back(nb::cast<HostArray>(pair[1]));
    s.push_back(vkad::TapeSeed::of_data(out.handle, hosts.back().data(), hosts.back().nbytes()));
  }
  std::vector<vkad::TapeAdjointLaunch> launched;
  Status st;
  uint32_t captured = 0;
  {
    Locked l(*t.st);
    (void)t.st->get();
    give_caller_grads(t);
    st = t.get().backward(s, &launched);
    captured = t.st->get().captured_launches();
  }
  add_to_capture(t, launched);
  pad_capture(*t.st, captured);  // (every launch it made is in `launched`: a safeguard)
  check(st);
}

void reset(Tape& t) {
  // The Python objects first: arrays only the recording held are freed now, so the tape's
  // reset drops their gradients.
  if (!t.clear_record()) throw nb::python_error();
  Locked l(*t.st);
  t.get().reset();
  // Arrays freed since: the tape dropped their gradients, and forgets the caller's here.
  for (auto it = t.caller_grads.begin(); it != t.caller_grads.end();) {
    it = t.tape->has_grad(NdArrayHandle{it->first}) ? std::next(it) : t.caller_grads.erase(it);
  }
}

void begin(nb::handle self) {
  Tape& t = nb::cast<Tape&>(self);
  if (t.st->recording != nullptr) {
    invalid("tape: this session is already recording on another tape");
  }
  reset(t);
  t.st->recording = &t;
  t.st->recording_obj = nb::borrow(self);
}

void end(Tape& t) {
  if (t.st->recording != &t) return;
  t.st->recording = nullptr;
  t.st->recording_obj = nb::none();
}

nb::object grad(nb::handle self, nb::handle obj) {
  Tape& t = nb::cast<Tape&>(self);
  NdArray& a = array_of(t, obj, "tape.grad");
  NdArrayHandle g;
  {
    Locked l(*t.st);
    g = take(t.get().grad(a.handle));
  }
  return view(self, t.st, g, a.dtype, a.shape, (a.name.empty() ? "array" : a.name) + "_grad");
}

nb::object scalar_grad(nb::handle self, nb::handle kernel, uint32_t param) {
  Tape& t = nb::cast<Tape&>(self);
  Kernel* k = nullptr;
  if (!nb::try_cast<Kernel*>(kernel, k) || !k || !k->diff || k->st != t.st) {
    invalid("tape.scalar_grad: expected a differentiated kernel of this session");
  }
  NdArrayHandle g;
  {
    Locked l(*t.st);
    g = take(t.get().scalar_grad(*k->diff, param));
  }
  return view(self, t.st, g, k->params.at(param).dtype, {1},
              k->name + "." + k->params.at(param).name + "_grad");
}

void set_checkpoint_every(Tape& t, uint32_t k) {
  Locked l(*t.st);
  check(t.get().set_checkpoint_every(k));
}

void set_memory_budget(Tape& t, uint64_t bytes) {
  Locked l(*t.st);
  check(t.get().set_memory_budget(bytes));
}

// Tape.checkpoint_plan(): vkad::Tape::checkpoint_plan as a dict.
nb::dict checkpoint_plan(Tape& t) {
  const vkad::codegen::CheckpointPlan plan = take([&] {
    Locked l(*t.st);
    return t.get().checkpoint_plan();
  }());
  nb::dict d;
  d["launches"] = plan.launches;
  d["segments"] = nb::cast(plan.segments);
  d["levels"] = plan.segments.size();
  d["recompute"] = plan.recompute;
  d["peak_bytes"] = plan.peak_bytes;
  d["min_bytes"] = plan.min_bytes;
  d["state_bytes"] = plan.state_bytes;
  d["text"] = plan.to_string();
  return d;
}

}  // namespace

namespace {

// The cyclic GC sees the recording (`launches`): a gradient view (Tape.grad) launched on its own
// tape is held by the record and holds the tape. Clearing the recording breaks such a cycle
// once nothing else reaches it.
int tape_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  Py_VISIT(nb::inst_ptr<Tape>(self)->launches.ptr());
  return 0;
}

int tape_clear(PyObject* self) {
  if (!nb::inst_ready(self)) return 0;
  // As reset() does, but nothing may be thrown inside the GC.
  if (!nb::inst_ptr<Tape>(self)->clear_record()) PyErr_Clear();
  return 0;
}

PyType_Slot tape_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(tape_traverse)},
                            {Py_tp_clear, reinterpret_cast<void*>(tape_clear)},
                            {0, nullptr}};

}  // namespace

void bind_tape(nb::module_& m, nb::class_<Session>& session) {
  (void)session;
  nb::class_<Tape>(m, "_Tape", nb::type_slots(tape_slots),
                   "The session's vkad::Tape (api/tape.h), behind vkad.Tape (python/vkad/tape.py).")
      .def(
          "__init__", [](Tape* t, Session& s) { new (t) Tape(s.st); }, "session"_a)
      .def_ro("launches", &Tape::launches,
              "A (kernel, args) tuple per recorded launch, a LoopRecord per Session.loop.")
      .def("begin", &begin, "Starts a recording (reset()) that Session.launch / loop record on.")
      .def("end", &end, "Ends the recording (the launches stay for backward).")
      .def("reset", &reset, "Forgets the recording; keeps the gradients of live arrays.")
      .def("backward", &backward, "seeds"_a,
           nb::sig("def backward(self, seeds: list[tuple[NdArray, float | numpy.typing.NDArray]]) "
                   "-> None"),
           "vkad::Tape::backward, with each recorded array's `array.grad` as its gradient.")
      .def("grad", &grad, "array"_a, nb::sig("def grad(self, array: NdArray) -> NdArray"),
           "The tape's gradient of `array`, viewed (freed by the tape, not by this object).")
      .def("scalar_grad", &scalar_grad, "kernel"_a, "param"_a,
           nb::sig("def scalar_grad(self, kernel: Kernel, param: int) -> NdArray"),
           "The gradient of differentiated scalar parameter `param` of forward kernel `kernel`.")
      .def(
          "has_grad",
          [](Tape& t, uint64_t handle) {
            return t.tape && t.tape->has_grad(NdArrayHandle{handle});
          },
          "handle"_a, "Whether the tape holds a gradient for the array of this handle.")
      .def_prop_rw(
          "checkpoint_every", [](Tape& t) { return t.get().checkpoint_every(); },
          &set_checkpoint_every, "vkad::Tape::set_checkpoint_every's launches per segment.")
      .def_prop_rw(
          "memory_budget", [](Tape& t) { return t.get().memory_budget(); }, &set_memory_budget,
          "vkad::Tape::set_memory_budget's bytes (0: off).")
      .def("checkpoint_plan", &checkpoint_plan,
           "vkad::Tape::checkpoint_plan: the schedule backward runs for the recording so far.")
      .def_prop_ro(
          "checkpoint_bytes", [](Tape& t) { return t.get().checkpoint_bytes(); },
          "vkad::Tape::checkpoint_bytes: device bytes the checkpoint copies hold now.")
      .def_prop_ro(
          "records", [](Tape& t) { return t.get().launches(); },
          "vkad::Tape::launches: records, a loop's body counted per launch.")
      .def_prop_ro(
          "gradients", [](Tape& t) { return t.get().gradients(); },
          "vkad::Tape::gradients: gradient arrays held.");
}

}  // namespace vkad_py
