// Binds Session.loop's halves, vkad.LoopIndex and vkad.LoopRecord (docs/graphs.md, "Step loops").
// The traced body's run: on a recording tape through vkad::Tape::launch_loop (its check, run,
// record; backward runs its adjoint loop), and its launches in the graph being captured.
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"

using namespace nb::literals;

namespace vkad_py {

void add_loop_to_capture(State& st, const vkad::LoopInfo& info, size_t n,
                         const std::function<Kernel*(size_t)>& of) {
  if (st.capture.is_none()) return;
  Graph* g = nb::cast<Graph*>(st.capture);
  if (info.rolled || info.reworked) {
    for (uint32_t i = 0; i < info.launches; ++i) g->add(nullptr);
    return;
  }
  for (uint32_t i = 0; i < info.launches; ++i) g->add(of(i % n));
}

template <typename Grad>
std::optional<std::vector<vkad::LoopLaunch>> Loops::adjoint_body(
    const std::vector<LoopEntry>& entries, uint32_t count, Grad&& grad,
    std::vector<Kernel*>* kernels) {
  std::vector<vkad::LoopLaunch> body;
  const int64_t last = static_cast<int64_t>(count) - 1;
  for (size_t j = entries.size(); j-- > 0;) {
    const LoopEntry& e = entries[j];
    const Kernel* fwd = e.k;
    const size_t n = e.args.size();
    if (fwd->adjoint.is_none()) invalid("'" + fwd->name + "' is not differentiated");
    Kernel* adj = launches.kernel_for(fwd->adjoint, n + fwd->gradients.size(), "launch");
    vkad::LoopLaunch l;
    l.kernel = adj->handle;
    l.args.resize(n + fwd->gradients.size());
    l.step.assign(l.args.size(), 0);
    for (size_t p = 0; p < n; ++p) {
      l.args[p] = e.args[p];
      l.args[p].i += last * e.step[p];
      l.step[p] = -e.step[p];
    }
    for (size_t g = 0; g < fwd->gradients.size(); ++g) {
      std::optional<Arg> a = grad(l.args[fwd->gradients[g].first], e, g, *adj);
      if (!a) return std::nullopt;
      l.args[n + g] = *a;
    }
    body.push_back(std::move(l));
    if (kernels) kernels->push_back(adj);
  }
  return body;
}

nb::object Loops::loop_begin(int64_t start) {
  if (st->loop && st->loop->mine()) {
    invalid(
        "Session.loop inside a loop's body: write the inner loop's launches into the "
        "outer body, or run the loops one after the other");
  }
  if (st->loop) {
    invalid(
        "Session.loop: another thread is tracing a loop's body on this session; trace "
        "one at a time");
  }
  if (st->recording != nullptr && st->recording->tape &&
      !st->recording->tape->keeps_intermediate_gradients()) {
    invalid(
        "Session.loop: the recording tape checkpoints (checkpoint_every, memory_budget), which "
        "copies "
        "per launch; Session.loop runs the body per iteration there");
  }
  {
    Locked l(*st);
    (void)st->get();  // a closed session traces nothing
  }
  st->loop = std::make_unique<LoopTrace>();
  st->loop->start = start;
  return nb::cast(LoopIndex{0});
}

void Loops::loop_abort() {
  if (st->loop && st->loop->mine()) st->loop.reset();
}

bool Loops::loop_prepare(uint32_t count) {
  if (!st->loop || !st->loop->mine()) {
    invalid("Session._loop_prepare: no loop body is being traced on this thread");
  }
  std::unique_ptr<LoopTrace> t = std::move(st->loop);
  if (count == 0 || t->entries.empty()) return false;
  std::vector<vkad::LoopLaunch> body;
  for (const LoopEntry& e : t->entries) body.push_back({e.k->handle, e.args, e.step});
  std::optional<std::vector<vkad::LoopLaunch>> adjoint = adjoint_of_set_grads(*t, count);
  Locked l(*st);
  vkad::Session& s = st->get();
  if (adjoint) s.prepare_loop(*adjoint, count);  // compiled beside the forward's
  s.ready_loop(body, count);
  if (adjoint) s.ready_loop(*adjoint, count);
  // A loop too wide to roll: the graph rework's plan of its launches, and its adjoint's,
  // made now, so that its first run launches what a reworked replay would.
  s.rework_loop(body, count);
  if (adjoint) s.rework_loop(*adjoint, count);
  // The tape's check of the loop recorded first in a recording, kept for the tapes that do
  // (vkad::TapeLoopChecks); a refused loop is refused again, with its message, by the tape.
  for (LoopEntry& e : t->entries) e.recorded = !e.k->adjoint.is_none();
  (void)st->loop_checks->prepare(s, tape_loop(*t), count);
  return s.loop_rolls(body, count);
}

std::vector<vkad::TapeLoopLaunch> Loops::tape_loop(const LoopTrace& t) {
  std::vector<vkad::TapeLoopLaunch> out;
  for (const LoopEntry& e : t.entries) {
    if (e.recorded) {
      out.push_back({e.k->diff.get(), e.args, e.step, {}});
    } else {
      out.push_back({nullptr, e.args, e.step, e.k->handle});
    }
  }
  return out;
}

void Loops::loop_end(uint32_t count) {
  if (!st->loop || !st->loop->mine()) {
    invalid("Session._loop_end: no loop body is being traced on this thread");
  }
  std::unique_ptr<LoopTrace> t = std::move(st->loop);
  if (count == 0 || t->entries.empty()) return;
  std::vector<vkad::LoopLaunch> body;
  bool any_recorded = false;
  for (const LoopEntry& e : t->entries) {
    body.push_back({e.k->handle, e.args, e.step});
    any_recorded = any_recorded || e.recorded;
  }
  Tape* tape = any_recorded ? st->recording : nullptr;
  vkad::LoopInfo info;
  Status run;
  {
    Locked l(*st);
    if (tape) {
      // The adjoint's loop is compiled beside the forward's and registered by backward:
      // readied here it would hold this loop's launch back (H100: 4 ms), readied there it
      // overlaps this loop's run. vkad::Tape::launch_loop checks every iteration's launches
      // (on a thread of its own while it readies the loop), launches and records the loop.
      prepare_loops(*t, body, count);
      run = tape->get().launch_loop(tape_loop(*t), count, &info);
    } else {
      run = st->get().launch_loop(body, count, &info);
    }
  }
  // What did run is in the graph being captured (numbered as the runtime numbered it).
  add_loop_to_capture(*st, info, t->entries.size(), [&](size_t j) { return t->entries[j].k; });
  check(run);
  if (tape) {
    auto* rec = new LoopRecord();
    nb::object obj = nb::cast(rec, nb::rv_policy::take_ownership);
    for (LoopEntry& e : t->entries) {
      if (e.recorded) rec->entries.push_back(std::move(e));
    }
    rec->start = t->start;
    rec->count = count;
    tape->record_loop(std::move(obj), *rec);
  }
}

void Loops::prepare_loops(const LoopTrace& t, std::span<const vkad::LoopLaunch> body,
                          uint32_t count) {
  vkad::Session& s = st->get();
  s.prepare_loop(body, count);
  if (std::optional<std::vector<vkad::LoopLaunch>> adj = adjoint_of_set_grads(t, count)) {
    s.prepare_loop(*adj, count);
  }
}

std::optional<std::vector<vkad::LoopLaunch>> Loops::adjoint_of_set_grads(const LoopTrace& t,
                                                                         uint32_t count) {
  std::vector<LoopEntry> differentiated;
  for (const LoopEntry& e : t.entries) {
    if (!e.k->adjoint.is_none()) differentiated.push_back(e);
  }
  if (differentiated.empty()) return std::nullopt;
  auto grad = [&](const Arg&, const LoopEntry& e, size_t g, const Kernel&) -> std::optional<Arg> {
    NdArray* arr = nullptr;
    if (!nb::try_cast<NdArray*>(e.values[e.k->gradients[g].first], arr) || !arr) return {};
    NdArray* ga = nullptr;
    if (arr->grad.is_none() || !nb::try_cast<NdArray*>(arr->grad, ga) || !ga || ga->freed) {
      return std::nullopt;
    }
    return Arg::ndarray(ga->handle);
  };
  return adjoint_body(differentiated, count, grad, nullptr);
}

namespace {

// vkad.LoopIndex: the loop index a Session.loop body sees.
void bind_loop_index(nb::module_& m) {
  // Session.loop's symbolic index (docs/graphs.md, "Step loops").
  auto symbolic = [](const LoopIndex& t) -> nb::object {
    invalid("Session.loop: " + t.repr() +
            " is symbolic (the body is traced once): pass it, plus or minus an int, to a "
            "kernel's i32 scalar; a value that depends on it otherwise (int(t), t * 2, an if "
            "on it) is not traced -- compute it in the kernel from t");
  };
  nb::class_<LoopIndex>(m, "LoopIndex",
                        "Session.loop's step inside its body: symbolic, t + an int offset.")
      .def("__add__", [](const LoopIndex& t, int64_t c) { return LoopIndex{t.offset + c}; })
      .def("__radd__", [](const LoopIndex& t, int64_t c) { return LoopIndex{t.offset + c}; })
      .def("__sub__", [](const LoopIndex& t, int64_t c) { return LoopIndex{t.offset - c}; })
      .def_prop_ro("offset", [](const LoopIndex& t) { return t.offset; })
      .def("__mul__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__rmul__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__rsub__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__floordiv__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__truediv__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__mod__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__eq__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__ne__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__lt__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__le__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__gt__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__ge__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__neg__", symbolic)
      .def("__index__", symbolic)
      .def("__int__", symbolic)
      .def("__float__", symbolic)
      .def("__bool__", symbolic)
      .def("__repr__", &LoopIndex::repr);
}

// The cyclic GC sees a loop record's kernels and arguments: a tape's gradient view passed to a
// Session.loop on that tape is held here and holds the tape (ndarray.cpp, tape.cpp).
int loop_record_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  for (const LoopEntry& e : nb::inst_ptr<LoopRecord>(self)->entries) {
    Py_VISIT(e.kernel.ptr());
    Py_VISIT(e.values.ptr());
  }
  return 0;
}

PyType_Slot loop_record_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(loop_record_traverse)},
                                   {0, nullptr}};

// vkad.LoopRecord: a tape's record of a Session.loop.
void bind_loop_record(nb::module_& m) {
  nb::class_<LoopRecord>(m, "LoopRecord", nb::type_slots(loop_record_slots),
                         "A Session.loop as a tape recorded it (an entry of Tape.launches).")
      .def_prop_ro("count", [](const LoopRecord& r) { return r.count; })
      .def_prop_ro("start", [](const LoopRecord& r) { return r.start; })
      .def_prop_ro(
          "body",
          [](const LoopRecord& r) {
            nb::list out;
            for (const LoopEntry& e : r.entries) out.append(nb::make_tuple(e.kernel, e.values));
            return out;
          },
          "(kernel, args) of each recorded launch of the body, args as in its first "
          "iteration")
      .def("__repr__", [](const LoopRecord& r) {
        return "vkad.LoopRecord(" + std::to_string(r.entries.size()) + " launches x " +
               std::to_string(r.count) + " iterations from t = " + std::to_string(r.start) + ")";
      });
}

void bind_session_loops(nb::class_<Session>& session) {
  session.def("_loop_begin", on<&Session::loops>(&Loops::loop_begin), "start"_a)
      .def("_loop_end", on<&Session::loops>(&Loops::loop_end), "count"_a)
      .def("_loop_abort", on<&Session::loops>(&Loops::loop_abort))
      .def("_loop_prepare", on<&Session::loops>(&Loops::loop_prepare), "count"_a);
}

}  // namespace

void bind_loops(nb::module_& m, nb::class_<Session>& session) {
  bind_loop_index(m);
  bind_loop_record(m);
  bind_session_loops(session);
}

}  // namespace vkad_py
