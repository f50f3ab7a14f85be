// Binds vkad.Timeline and Session's debugging calls (docs/debugging.md): print sink, timeline.
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "binding.h"

using namespace nb::literals;

namespace vkad_py {

void Session::set_print_sink(nb::object fn) {
  if (!fn.is_none() && !PyCallable_Check(fn.ptr()))
    invalid("set_print_sink: a callable taking one str, or None");
  std::function<void(std::string_view)> sink;
  if (!fn.is_none()) {
    State* raw = st.get();  // outlives its session, which holds the sink
    sink = [raw](std::string_view line) {
      nb::gil_scoped_acquire gil;
      try {
        raw->print_sink(nb::str(line.data(), line.size()));
      } catch (nb::python_error& e) {
        e.discard_as_unraisable("vkad: the print sink");
      }
    };
  }
  Locked l(*st);
  st->print_sink = fn;
  st->get().set_print_sink(std::move(sink));
}

void Session::begin_timeline(uint64_t max_events, uint32_t replay_sample) {
  check(
      blocking(*st, [&](vkad::Session& s) { return s.begin_timeline(max_events, replay_sample); }));
}

vkad::Timeline Session::end_timeline() {
  return take(blocking(*st, [](vkad::Session& s) { return s.end_timeline(); }));
}

namespace {

// vkad::Timeline (runtime/timeline.h): what Session.end_timeline returns.
void bind_timeline(nb::module_& m) {
  nb::class_<vkad::Timeline>(m, "Timeline",
                             "Device and host events recorded between Session.begin_timeline "
                             "and end_timeline (docs/debugging.md).")
      .def_prop_ro(
          "events",
          [](const vkad::Timeline& t) {
            nb::list out;
            for (const vkad::TimelineEvent& e : t.events) {
              nb::dict d;
              d["name"] = e.name;
              d["category"] = e.category;
              d["gpu"] = e.gpu;
              d["launch"] = e.launch;
              d["graph"] = e.graph;
              d["begin_us"] = e.begin_us;
              d["end_us"] = e.end_us;
              out.append(d);
            }
            return out;
          },
          nb::sig("def events(self) -> list[dict[str, str | bool | int | float]]"),
          "Each event as a dict: name, category, gpu, launch, graph, begin_us, end_us "
          "(microseconds since begin_timeline on the host's clock). Device events first, in "
          "recording order, then host spans.")
      .def_ro("dropped", &vkad::Timeline::dropped, "Events past max_events, not kept.")
      .def_ro("replay_sample", &vkad::Timeline::replay_sample,
              "A graph's first replay and every replay_sample-th were timed launch by launch.")
      .def_ro("replays_timed", &vkad::Timeline::replays_timed,
              "Graph replays timed launch by launch.")
      .def_ro("replays_spanned", &vkad::Timeline::replays_spanned,
              "Graph replays timed as one event (category 'replay').")
      .def_ro("spanned_launches", &vkad::Timeline::spanned_launches,
              "The launches of those replays (not events of their own).")
      .def_ro("gpu_timestamps", &vkad::Timeline::gpu_timestamps,
              "False when the device has no timestamp queries (host spans only).")
      .def_ro("device", &vkad::Timeline::device)
      .def_ro("note", &vkad::Timeline::note)
      .def_ro("clock_uncertainty_us", &vkad::Timeline::clock_uncertainty_us,
              "How far device events may sit from the host clock (durations are exact).")
      .def("chrome_trace_json", &vkad::Timeline::chrome_trace_json)
      .def(
          "save",
          [](const vkad::Timeline& t, const std::string& path) {
            check(t.write_chrome_trace(path));
          },
          "path"_a, "Writes the Chrome trace / Perfetto JSON file.")
      .def("summary", &vkad::Timeline::summary,
           "A table of device time per name: count, total, mean, share.")
      .def(
          "kernels",
          [](const vkad::Timeline& t) {
            nb::list out;
            for (const vkad::TimelineKernelSummary& k : t.summarize()) {
              nb::dict d;
              d["name"] = k.name;
              d["count"] = k.count;
              d["total_us"] = k.total_us;
              d["mean_us"] = k.mean_us;
              d["share"] = k.share;
              out.append(d);
            }
            return out;
          },
          nb::sig("def kernels(self) -> list[dict[str, str | int | float]]"),
          "summary() as data: device time per name, largest total first.");
}

void bind_session_debugging(nb::class_<Session>& session) {
  session
      .def("set_print_sink", &Session::set_print_sink, "fn"_a.none(),
           nb::sig("def set_print_sink(self, fn: typing.Callable[[str], object] | None) -> None"),
           "Where kernels' print lines go (docs/debugging.md): fn(line) per line, called when "
           "the launch retires, inside the session call that retired it (it must not call the "
           "session); None: stdout.")
      .def("begin_timeline", &Session::begin_timeline,
           "max_events"_a = vkad::runtime::kTimelineMaxEvents,
           "replay_sample"_a = vkad::runtime::kTimelineReplaySample,
           "Starts a timeline (docs/debugging.md): every launch, fill, copy and upload until "
           "end_timeline() is timed on the device -- of a graph's replays, the first and every "
           "replay_sample-th after it launch by launch, the others as one event each (1: every "
           "replay). Waits for the device once. vkad.profile() is the context manager around "
           "it.")
      .def("end_timeline", &Session::end_timeline,
           "Waits for the device and returns the Timeline recorded since begin_timeline().");
}

}  // namespace

void bind_debugging(nb::module_& m, nb::class_<Session>& session) {
  bind_timeline(m);
  bind_session_debugging(session);
}

}  // namespace vkad_py
