// Binds Session.loop's halves, vkad.LoopIndex and vkad.LoopRecord (docs/graphs.md, "Step loops").
// The traced body's tape check and run, its record on the tape and its adjoint loop.
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "binding.h"

using namespace nb::literals;

namespace vkad_py {

// A step loop's tape check, kept (State::loop_checks): from an empty record, the same launches
// -- kernels, arguments (array handles are never reused, shapes never change), steps and count
// -- leave the same record, so a recording that starts with a loop checked before (by
// Session.prepare_loop, or an earlier iteration's recording) takes the record instead of
// checking ~10^4 launches again.
struct LoopCheck {
  std::vector<vkad::LoopLaunch> launches;  // the recorded ones, in body order
  uint32_t count = 0;
  vkad::TapeHazards after;
};
constexpr size_t kLoopChecks = 8;

namespace {

bool same_arg(const Arg& a, const Arg& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.i == b.i && a.array.id == b.array.id &&
         std::memcmp(&a.f, &b.f, sizeof a.f) == 0;
}

// The launches of a traced body a tape records (its differentiated kernels'), as a LoopCheck
// keys them.
std::vector<vkad::LoopLaunch> recorded_launches(const LoopTrace& t) {
  std::vector<vkad::LoopLaunch> out;
  for (const LoopEntry& e : t.entries) {
    if (!e.k->adjoint.is_none()) out.push_back({e.k->handle, e.args, e.step});
  }
  return out;
}

bool same_launches(std::span<const vkad::LoopLaunch> a, std::span<const vkad::LoopLaunch> b) {
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

}  // namespace

template <typename KernelOf>
void Session::add_loop_to_capture(const vkad::LoopInfo& info, size_t n, KernelOf&& of) {
  if (st->capture.is_none()) return;
  Graph* g = nb::cast<Graph*>(st->capture);
  if (info.rolled || info.reworked) {
    for (uint32_t i = 0; i < info.launches; ++i) g->add(nullptr);
    return;
  }
  for (uint32_t i = 0; i < info.launches; ++i) g->add(of(i % n));
}

template <typename Grad>
std::optional<std::vector<vkad::LoopLaunch>> Session::adjoint_body(
    const std::vector<LoopEntry>& entries, uint32_t count, Grad&& grad,
    std::vector<Kernel*>* kernels) {
  std::vector<vkad::LoopLaunch> body;
  const int64_t last = static_cast<int64_t>(count) - 1;
  for (size_t j = entries.size(); j-- > 0;) {
    const LoopEntry& e = entries[j];
    const Kernel* fwd = e.k;
    const size_t n = e.args.size();
    if (fwd->adjoint.is_none()) invalid("'" + fwd->name + "' is not differentiated");
    Kernel* adj = kernel_for(fwd->adjoint, n + fwd->gradients.size(), "launch");
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

void Session::check_loop(const LoopTrace& t, uint32_t count, vkad::TapeHazards& hz,
                         vkad::TapeHazards* saved) {
  std::vector<Arg> a;
  for (uint32_t r = 0; r < count; ++r) {
    for (size_t j = 0; j < t.entries.size(); ++j) {
      const LoopEntry& e = t.entries[j];
      if (!e.recorded) continue;
      a = e.args;
      for (size_t p = 0; p < a.size(); ++p) a[p].i += int64_t{r} * e.step[p];
      Status c = hz.check(st->get(), e.k->access, a);
      if (!c.ok()) {
        hz = std::move(*saved);
        check(c.with_context("Session.loop: launch " + std::to_string(j) + " of the body ('" +
                             e.k->name + "'), iteration " + std::to_string(r) +
                             " (t = " + std::to_string(t.start + r) + ")"));
      }
      hz.record();
    }
  }
}

bool Session::check_loop_beside(const LoopTrace& t, uint32_t count, vkad::TapeHazards& hz,
                                std::span<const std::span<const vkad::LoopLaunch>> ready) {
  std::unordered_map<uint64_t, std::vector<uint32_t>> shapes;
  for (const LoopEntry& e : t.entries) {
    for (const Arg& x : e.args) {
      if (x.kind != ParamKind::kNdArray || shapes.count(x.array.id)) continue;
      Result<std::vector<uint32_t>> sh = st->get().shape(x.array);
      if (sh.ok()) shapes.emplace(x.array.id, std::move(*sh));
    }
  }
  const vkad::TapeHazards::Extent extent = [&shapes](NdArrayHandle a,
                                                     uint32_t d) -> std::optional<uint32_t> {
    auto it = shapes.find(a.id);
    if (it == shapes.end() || d >= it->second.size()) return std::nullopt;
    return it->second[d];
  };
  bool accepted = false;
  auto work = [&]() noexcept {
    try {
      std::vector<Arg> a;
      for (uint32_t r = 0; r < count; ++r) {
        for (const LoopEntry& e : t.entries) {
          if (!e.recorded) continue;
          a = e.args;
          for (size_t p = 0; p < a.size(); ++p) a[p].i += int64_t{r} * e.step[p];
          if (!hz.accepts(extent, e.k->access, a)) return;
          hz.record();
        }
      }
      accepted = true;
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
  try {
    for (std::span<const vkad::LoopLaunch> body : ready) st->get().ready_loop(body, count);
  } catch (...) {
    // out of memory readying it: launch_loop tries again or runs the launches one by one
  }
  if (checker.joinable()) checker.join();
  return accepted;
}

std::shared_ptr<LoopCheck> Session::find_loop_check(std::span<const vkad::LoopLaunch> launches,
                                                    uint32_t count) const {
  for (const std::shared_ptr<LoopCheck>& c : st->loop_checks) {
    if (c->count == count && same_launches(c->launches, launches)) return c;
  }
  return nullptr;
}

void Session::keep_loop_check(std::vector<vkad::LoopLaunch> launches, uint32_t count,
                              const vkad::TapeHazards& after) {
  if (launches.empty()) return;
  auto c = std::make_shared<LoopCheck>();
  c->launches = std::move(launches);
  c->count = count;
  c->after = after;
  if (st->loop_checks.size() >= kLoopChecks) st->loop_checks.erase(st->loop_checks.begin());
  st->loop_checks.push_back(std::move(c));
}

nb::object Session::loop_begin(int64_t start) {
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
  if (!st->before_launch.is_none()) {
    invalid(
        "Session.loop: the recording tape checkpoints (checkpoint_every), which copies "
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

void Session::loop_abort() {
  if (st->loop && st->loop->mine()) st->loop.reset();
}

bool Session::loop_prepare(uint32_t count) {
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
  // The tape's check of the loop recorded first in a recording, kept for that recording.
  std::vector<vkad::LoopLaunch> key = recorded_launches(*t);
  if (!key.empty() && !find_loop_check(key, count)) {
    for (LoopEntry& e : t->entries) e.recorded = !e.k->adjoint.is_none();
    vkad::TapeHazards hz;
    const std::span<const vkad::LoopLaunch> ready[] = {body};
    if (check_loop_beside(*t, count, hz, ready)) keep_loop_check(std::move(key), count, hz);
  }
  return s.loop_rolls(body, count);
}

void Session::loop_end(uint32_t count) {
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
  TapeHazards* hazards =
      any_recorded && !st->hazards.is_none() ? nb::cast<TapeHazards*>(st->hazards) : nullptr;
  vkad::LoopInfo info;
  {
    Locked l(*st);
    // vkad::Tape::launch's check per launch of the loop, before any runs, on a thread of its
    // own while this one readies the loop (its kernels rolled, compiled, registered, their
    // pipelines made); the hazard record is put back as it was if the loop is refused.
    std::optional<vkad::TapeHazards> saved;
    if (hazards) {
      saved = hazards->hazards;
      // The adjoint's is compiled beside it and registered by backward: readied here it would
      // hold this loop's launch back (H100: 4 ms), readied there it overlaps this loop's run.
      prepare_loops(*t, body, count);
      const bool from_empty = hazards->hazards.launches() == 0;
      std::vector<vkad::LoopLaunch> key;
      if (from_empty) key = recorded_launches(*t);
      std::shared_ptr<LoopCheck> known = from_empty ? find_loop_check(key, count) : nullptr;
      if (known) {
        hazards->hazards = known->after;  // checked before, from an empty record
        st->get().ready_loop(body, count);
      } else {
        const std::span<const vkad::LoopLaunch> ready[] = {body};
        if (!check_loop_beside(*t, count, hazards->hazards, ready)) {
          hazards->hazards = *saved;  // the check again here, for its message
          check_loop(*t, count, hazards->hazards, &*saved);
        }
        if (from_empty) keep_loop_check(std::move(key), count, hazards->hazards);
      }
    }
    // Its launches' device errors name the loop's tape entry (and, launched one by one, the
    // iteration).
    if (hazards) st->get().runtime().set_launch_note("the loop at tape entry", nb::len(st->tape));
    Status run = st->get().launch_loop(body, count, &info);
    st->get().runtime().set_launch_note(nullptr, 0);
    if (!run.ok()) {
      // What did run is in the graph being captured (numbered as the runtime numbered it).
      add_loop_to_capture(info, t->entries.size(), [&](size_t j) { return t->entries[j].k; });
      if (saved) hazards->hazards = std::move(*saved);
      if (hazards && info.launches > 0) {
        // Launched one by one, some ran before one failed: the tape holds none of them, so
        // its backward would leave them out -- refused until the next recording.
        hazards->broken = "a Session.loop failed after " + std::to_string(info.launches) +
                          " of its launches ran (" + run.message() + "); they are not on the tape";
      }
      check(run);
    }
  }
  add_loop_to_capture(info, t->entries.size(), [&](size_t j) { return t->entries[j].k; });
  if (any_recorded) {
    auto* rec = new LoopRecord();
    nb::object obj = nb::cast(rec, nb::rv_policy::take_ownership);
    for (LoopEntry& e : t->entries) {
      if (e.recorded) rec->entries.push_back(std::move(e));
    }
    rec->start = t->start;
    rec->count = count;
    nb::cast<nb::list>(st->tape).append(obj);
  }
}

void Session::adjoint_loop(const LoopRecord& loop, nb::dict grads,
                           const std::unordered_map<uint64_t, Arg>& grad_args, size_t entry) {
  std::vector<Kernel*> kernels;
  auto grad = [&](const Arg& primal, const LoopEntry& e, size_t g,
                  const Kernel& adj) -> std::optional<Arg> {
    if (primal.kind != ParamKind::kNdArray) {
      return scalar_grad_arg(grads, e.k, e.k->gradients[g].first, adj, e.args.size() + g);
    }
    auto found = grad_args.find(primal.array.id);
    if (found != grad_args.end()) return found->second;
    // The converting path, which names what is wrong.
    const size_t p = e.k->gradients[g].first;
    NdArray* arr = nullptr;
    nb::object gv = nb::try_cast<NdArray*>(e.values[p], arr) && arr
                        ? nb::object(grads.get(nb::int_(arr->handle.id), nb::none()))
                        : nb::none();
    return to_arg(adj, *st, e.args.size() + g, gv);
  };
  std::vector<vkad::LoopLaunch> body = *adjoint_body(loop.entries, loop.count, grad, &kernels);
  vkad::LoopInfo info;
  Status run;
  {
    Locked l(*st);
    st->get().runtime().set_launch_note(
        "the adjoint (run from the last iteration) of the loop at tape entry", entry);
    run = st->get().launch_loop(body, loop.count, &info);
    st->get().runtime().set_launch_note(nullptr, 0);
  }
  add_loop_to_capture(info, kernels.size(), [&](size_t j) { return kernels[j]; });
  check(run);
}

void Session::prepare_loops(const LoopTrace& t, std::span<const vkad::LoopLaunch> body,
                            uint32_t count) {
  vkad::Session& s = st->get();
  s.prepare_loop(body, count);
  if (std::optional<std::vector<vkad::LoopLaunch>> adj = adjoint_of_set_grads(t, count)) {
    s.prepare_loop(*adj, count);
  }
}

std::optional<std::vector<vkad::LoopLaunch>> Session::adjoint_of_set_grads(const LoopTrace& t,
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

// vkad.LoopRecord: a tape's record of a Session.loop.
void bind_loop_record(nb::module_& m) {
  nb::class_<LoopRecord>(m, "LoopRecord",
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
  session.def("_loop_begin", &Session::loop_begin, "start"_a)
      .def("_loop_end", &Session::loop_end, "count"_a)
      .def("_loop_abort", &Session::loop_abort)
      .def("_loop_prepare", &Session::loop_prepare, "count"_a);
}

}  // namespace

void bind_loops(nb::module_& m, nb::class_<Session>& session) {
  bind_loop_index(m);
  bind_loop_record(m);
  bind_session_loops(session);
}

}  // namespace vkad_py
