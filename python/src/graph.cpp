// Binds vkad.Graph and Session's capture and replay (docs/graphs.md).
#include <climits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "binding.h"

using namespace nb::literals;

namespace vkad_py {
namespace {

// Graph.launch_names: each launch's kernel name, '#k' on its k-th repeat (as
// vkad::Session::graph_launch_names names them); nullopt for a Session.loop's rolled launch
// and a checkpointing tape's copies.
std::vector<std::optional<std::string>> launch_names(const Graph& g) {
  std::vector<std::optional<std::string>> out;
  std::unordered_map<std::string, uint32_t> seen;
  out.reserve(g.kernels.size());
  for (const Kernel* k : g.kernels) {
    if (!k) {
      out.emplace_back();
      continue;
    }
    const uint32_t n = seen[k->name]++;
    out.emplace_back(n == 0 ? k->name : k->name + "#" + std::to_string(n));
  }
  return out;
}

}  // namespace

nb::object Graphs::begin_capture(const std::string& name, bool background, bool run) {
  {
    Locked l(*st);
    check(st->get().begin_capture(
        name, vkad::CaptureOptions{.background_rework = background, .run = run}));
  }
  auto* g = new Graph();
  g->st = st;
  g->name = name.empty() ? "graph" : name;
  nb::object obj = nb::cast(g, nb::rv_policy::take_ownership);
  st->capture = obj;
  return obj;
}

void Graphs::end_capture() {
  Graph* g = st->capture.is_none() ? nullptr : nb::cast<Graph*>(st->capture);
  // GIL released: end_capture may wait for the previous background rework.
  Result<vkad::GraphHandle> h =
      blocking(*st, [](vkad::Session& s) -> Result<vkad::GraphHandle> { return s.end_capture(); });
  st->capture = nb::none();
  vkad::GraphHandle got = take(std::move(h));
  if (g) g->handle = got;
}

void Graphs::finish_rework(Graph& g) {
  if (g.st != st)
    invalid("finish_rework of graph '" + g.name + "': the graph belongs to another session");
  if (g.released || g.handle.id == 0) return;
  const vkad::GraphHandle h = g.handle;
  check(blocking(*st, [&](vkad::Session& s) { return s.finish_rework(h); }));
}

uint32_t Graphs::update_index(nb::handle v, const std::string& what) {
  if (!nb::isinstance<nb::int_>(v) || nb::isinstance<nb::bool_>(v)) {
    invalid(what + " index " + nb::repr(v).c_str() + " is not an int");
  }
  long long i = 0;
  if (!nb::try_cast<long long>(v, i) || i < 0 || i > static_cast<long long>(UINT32_MAX)) {
    invalid(what + " index " + nb::repr(v).c_str() + " is out of range");
  }
  return static_cast<uint32_t>(i);
}

uint32_t Graphs::update_launch(const Graph& g, nb::handle v, const std::string& which) {
  if (!nb::isinstance<nb::str>(v)) return update_index(v, which + "launch");
  const std::string name = nb::cast<std::string>(v);
  const std::vector<std::optional<std::string>> names = launch_names(g);
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<uint32_t>(i);
  }
  std::string some;
  for (size_t i = 0; i < names.size() && i < 8; ++i)
    some += (i ? ", " : "") + (names[i] ? "'" + *names[i] + "'" : std::string("None"));
  invalid(which + "the graph has no launch named '" + name + "' (Graph.launch_names: " + some +
          (names.size() > 8 ? ", ...)" : ")"));
}

void Graphs::replay(Graph& g, nb::handle updates) {
  if (g.st != st) invalid("replay of graph '" + g.name + "': the graph belongs to another session");
  if (g.released || g.handle.id == 0) {
    invalid("replay of graph '" + g.name +
            "': " + (g.released ? "the graph was released" : "its capture is still open"));
  }
  std::vector<vkad::GraphUpdate> u;
  if (!updates.is_none()) {
    const std::string what = "replay of graph '" + g.name + "': ";
    if (!nb::isinstance<nb::list>(updates) && !nb::isinstance<nb::tuple>(updates)) {
      invalid(what + "updates are a list of (launch, param, value) tuples, not " +
              nb::inst_name(updates).c_str());
    }
    size_t n = 0;
    for (nb::handle item : updates) {
      const std::string which = what + "update " + std::to_string(n++) + ": ";
      if (!nb::isinstance<nb::tuple>(item) || nb::len(item) != 3) {
        invalid(which + nb::repr(item).c_str() +
                " is not a (launch, param, value) tuple (updates are a list of such tuples)");
      }
      auto t = nb::borrow<nb::tuple>(item);
      const uint32_t launch = update_launch(g, t[0], which),
                     param = update_index(t[1], which + "parameter");
      if (launch >= g.kernels.size()) {
        invalid("replay of graph '" + g.name + "': update of launch " + std::to_string(launch) +
                "; the graph has " + std::to_string(g.kernels.size()) + " launches");
      }
      Kernel* k = g.kernels[launch];
      if (!k) {
        invalid("replay of graph '" + g.name + "': update of launch " + std::to_string(launch) +
                ": a checkpointing tape's copy (no scalars), or a launch made by a Session.loop "
                "that runs as one resident kernel or as its reworked launches "
                "(Session.prepare_loop): its scalars are fixed (replace them through an array, "
                "or capture the loop's launches one by one)");
      }
      if (param >= k->params.size() || k->params[param].array) {
        invalid("replay of graph '" + g.name + "', launch " + std::to_string(launch) + " ('" +
                k->name + "'): parameter " + std::to_string(param) +
                " is not a scalar parameter of the kernel");
      }
      u.push_back({launch, param, to_arg(*k, *st, param, t[2])});
    }
  }
  Locked l(*st);
  check(st->get().replay(g.handle, u));
}

namespace {

// vkad.Graph.
void bind_graph(nb::module_& m) {
  nb::class_<Graph>(m, "Graph", "A captured launch sequence (Session.capture).")
      .def_prop_ro("name", [](const Graph& g) { return g.name; })
      .def_prop_ro("launches", [](const Graph& g) { return g.kernels.size(); })
      .def_prop_ro(
          "launch_names",
          [](const Graph& g) {
            nb::list out;
            for (const std::optional<std::string>& n : launch_names(g))
              out.append(n ? nb::object(nb::str(n->c_str())) : nb::none());
            return out;
          },
          nb::sig("def launch_names(self) -> list[str | None]"),
          "A unique name for each captured launch, by the index replay updates take (capture "
          "order: a tape's backward adds its adjoints, '<kernel>_adjoint', last launch first): "
          "the kernel's name, '#k' appended to its k-th repeat ('step', 'step#1', ...); None "
          "for a Session.loop's rolled launch and a checkpointing tape's copies. A replay update "
          "may name its launch by it: "
          "g.replay([('step_adjoint#2', 0, 0.5)]). vkad::Session::graph_launch_names in C++.")
      .def(
          "release",
          [](Graph& g) {
            if (g.released || g.handle.id == 0) return;
            Locked l(*g.st);
            check(g.st->get().release_graph(g.handle));
            g.released = true;
          },
          "Drops the graph now (otherwise when collected).")
      .def("__repr__", [](const Graph& g) {
        return "vkad.Graph('" + g.name + "', " + std::to_string(g.kernels.size()) + " launches" +
               (g.released ? ", released" : "") + ")";
      });
}

void bind_session_graphs(nb::class_<Session>& session) {
  session
      .def("_begin_capture", on<&Session::graphs>(&Graphs::begin_capture), "name"_a,
           "background"_a = false, "run"_a = false)
      .def("finish_rework", on<&Session::graphs>(&Graphs::finish_rework), "graph"_a,
           "Waits for the graph's background rework (capture(background=True)) and installs "
           "it: replays run the reworked graph from now on. Nothing for other graphs.")
      .def("_end_capture", on<&Session::graphs>(&Graphs::end_capture))
      .def("replay", on<&Session::graphs>(&Graphs::replay), "graph"_a, "updates"_a = nb::none(),
           nb::sig("def replay(self, graph: Graph, updates: list[tuple[int, int, int | float | "
                   "bool]] | None = None) -> None"),
           "Runs a captured graph (asynchronous). updates: (launch index, parameter index, "
           "value) triples replacing scalar arguments, kept for later replays.");
}

}  // namespace

void bind_graphs(nb::module_& m, nb::class_<Session>& session) {
  bind_graph(m);
  bind_session_graphs(session);
}

}  // namespace vkad_py
