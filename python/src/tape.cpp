// Binds vkad._TapeHazards and the Session calls behind vkad.Tape (python/vkad/tape.py).
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "binding.h"

using namespace nb::literals;

namespace vkad_py {

nb::tuple Session::scalar_grad_key(const Kernel* fwd, uint32_t param) {
  return nb::make_tuple(nb::find(fwd), param);
}

Arg Session::scalar_grad_arg(nb::dict grads, const Kernel* fwd, uint32_t param, const Kernel& adj,
                             size_t slot) {
  nb::object g = grads.get(scalar_grad_key(fwd, param), nb::none());
  return to_arg(adj, *st, slot, g);
}

std::unordered_map<uint64_t, Arg> Session::gradient_args(nb::dict grads) const {
  std::unordered_map<uint64_t, Arg> out;
  for (auto [key, value] : grads) {
    NdArray* g = nullptr;
    if (!nb::try_cast<NdArray*>(value, g) || !g || g->st != st || g->freed || g->free_deferred) {
      continue;
    }
    uint64_t id = 0;
    if (!nb::try_cast<uint64_t>(key, id)) continue;
    out.emplace(id, Arg::ndarray(g->handle));
  }
  return out;
}

void Session::raise_named(nb::python_error& e, const std::string& prefix) {
  if (!PyObject_IsSubclass(e.type().ptr(), g_error)) throw;
  const std::string msg = prefix + nb::str(e.value()).c_str();
  PyErr_SetString(e.type().ptr(), msg.c_str());
  throw nb::python_error();
}

void Session::launch_adjoints(nb::list launches, nb::dict grads) {
  struct Plan {
    nb::handle adjoint;
    Kernel* k;
  };
  std::unordered_map<const Kernel*, Plan> plans;  // per forward kernel, as tape.py's `plans`
  const std::unordered_map<uint64_t, Arg> grad_args = gradient_args(grads);
  auto plan_of = [&](const Kernel* fwd, size_t nargs) -> const Plan& {
    auto it = plans.find(fwd);
    if (it == plans.end()) {
      if (fwd->adjoint.is_none()) invalid("'" + fwd->name + "' is not differentiated");
      nb::handle adj = fwd->adjoint;
      it = plans.emplace(fwd, Plan{adj, kernel_for(adj, nargs + fwd->gradients.size(), "launch")})
               .first;
    }
    return it->second;
  };
  std::vector<Arg> a;
  for (size_t i = launches.size(); i-- > 0;) {
    LoopRecord* loop = nullptr;
    if (nb::try_cast<LoopRecord*>(launches[i], loop) && loop) {
      try {
        adjoint_loop(*loop, grads, grad_args, i);
      } catch (nb::python_error& e) {
        raise_named(
            e, "tape.backward: adjoint of launch " + std::to_string(i) + " (a Session.loop): ");
      }
      continue;
    }
    nb::tuple rec = nb::cast<nb::tuple>(launches[i]);
    nb::handle kernel = rec[0];
    nb::tuple args = nb::cast<nb::tuple>(rec[1]);
    try {
      const Kernel* fwd = kernel_for(kernel, args.size(), "launch");
      const Plan& plan = plan_of(fwd, args.size());
      a.resize(args.size() + fwd->gradients.size());
      for (size_t j = 0; j < args.size(); ++j) a[j] = to_arg(*plan.k, *st, j, args[j]);
      for (size_t j = 0; j < fwd->gradients.size(); ++j) {
        const Arg& primal = a[fwd->gradients[j].first];  // converted above
        if (primal.kind != ParamKind::kNdArray) {
          a[args.size() + j] =
              scalar_grad_arg(grads, fwd, fwd->gradients[j].first, *plan.k, args.size() + j);
          continue;
        }
        auto found = grad_args.find(primal.array.id);
        if (found != grad_args.end()) {
          a[args.size() + j] = found->second;
          continue;
        }
        nb::handle x = args[fwd->gradients[j].first];
        NdArray* arr = nullptr;
        nb::object g = nb::try_cast<NdArray*>(x, arr) && arr
                           ? nb::object(grads.get(nb::int_(arr->handle.id), nb::none()))
                           : nb::none();
        a[args.size() + j] = to_arg(*plan.k, *st, args.size() + j, g);
      }
      launch_converted(plan.adjoint, plan.k, a, nb::handle(), "the adjoint of tape entry", i);
    } catch (nb::python_error& e) {
      raise_named(e, "tape.backward: adjoint of launch " + std::to_string(i) + ": ");
    }
  }
}

nb::dict Session::tape_differentiated(nb::list launches) {
  nb::dict needed;
  for (nb::handle rec_h : launches) {
    LoopRecord* loop = nullptr;
    if (nb::try_cast<LoopRecord*>(rec_h, loop) && loop) {
      for (const LoopEntry& e : loop->entries) {
        for (const auto& [p, name] : e.k->gradients) {
          if (!e.k->params[p].array) {
            nb::tuple key = scalar_grad_key(e.k, p);
            if (!needed.contains(key)) needed[key] = nb::none();
            continue;
          }
          nb::int_ key(e.args[p].array.id);
          if (!needed.contains(key)) needed[key] = e.values[p];
        }
      }
      continue;
    }
    nb::tuple rec = nb::cast<nb::tuple>(rec_h);
    nb::tuple args = nb::cast<nb::tuple>(rec[1]);
    const Kernel* fwd = kernel_for(rec[0], args.size(), "tape.backward");
    for (const auto& [p, name] : fwd->gradients) {
      if (!fwd->params[p].array) {
        nb::tuple key = scalar_grad_key(fwd, p);
        if (!needed.contains(key)) needed[key] = nb::none();
        continue;
      }
      NdArray* arr = nullptr;
      if (!nb::try_cast<NdArray*>(args[p], arr) || !arr) continue;  // the launch refused it
      nb::int_ key(arr->handle.id);
      if (!needed.contains(key)) needed[key] = args[p];
    }
  }
  return needed;
}

namespace {

// vkad._TapeHazards: the tape's hazard record.
void bind_tape_hazards(nb::module_& m) {
  nb::class_<TapeHazards>(m, "_TapeHazards",
                          "What a Tape's recording read and wrote (vkad::TapeHazards): launch "
                          "refuses a launch that overwrites it.")
      .def(nb::init<>())
      .def("reset",
           [](TapeHazards& h) {
             h.hazards.reset();
             h.broken.clear();
           })
      .def_prop_ro("broken", [](const TapeHazards& h) { return h.broken; })
      .def_prop_ro("launches", [](const TapeHazards& h) { return h.hazards.launches(); });
}

void bind_session_tape(nb::class_<Session>& session) {
  session
      .def(
          "_set_tape",
          [](Session& s, nb::object tape, nb::object hazards, nb::object before_launch) {
            s.st->tape = std::move(tape);
            s.st->hazards = std::move(hazards);
            s.st->before_launch = std::move(before_launch);
          },
          "tape"_a.none(), "hazards"_a.none() = nb::none(), "before_launch"_a.none() = nb::none())
      .def("_launch_adjoints", &Session::launch_adjoints, "launches"_a, "grads"_a,
           nb::sig("def _launch_adjoints(self, launches: list[tuple[Kernel | Differentiated, "
                   "tuple[NdArray | int | float | bool, ...]]], grads: dict[int, NdArray]) "
                   "-> None"),
           "Tape.backward's loop: the adjoints of the recorded launches, last first.")
      .def("_tape_differentiated", &Session::tape_differentiated, "launches"_a,
           nb::sig("def _tape_differentiated(self, launches: list[tuple[Kernel | Differentiated, "
                   "tuple[NdArray | int | float | bool, ...]]]) -> dict[int, NdArray]"),
           "Tape.backward's first pass: each recorded launch's differentiated arrays, by handle.");
}

}  // namespace

void bind_tape(nb::module_& m, nb::class_<Session>& session) {
  bind_tape_hazards(m);
  bind_session_tape(session);
}

}  // namespace vkad_py
