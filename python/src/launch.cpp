// Binds Session.launch, prepare and bind (vkad.BoundLaunch), converting launch arguments.
// A launch is checked by the tape, recorded on it and added to the graph being captured.
#include <algorithm>
#include <climits>
#include <iterator>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"

using namespace nb::literals;

namespace vkad_py {

// A tape keeps one (kernel, args) tuple per recorded launch, ~10^4 an iteration. Tracked, they
// pile up in the cyclic GC's older generations, and that growth is what makes CPython run full
// collections (several ms each, over every tracked object of the process) in the middle of a
// recording. Their items are kernels and numbers, which the GC does not track, and NdArrays. An
// NdArray shows the GC two references (ndarray.cpp): the tape a gradient view keeps (`owner`)
// and the caller's gradient (`grad`); one with neither can close no cycle, so a tuple of such
// arrays, kernels and numbers can be in no collectable cycle -- CPython's own rule (it untracks
// a tuple of untracked items once it survives a collection), with those arrays counted as
// atomic -- and is untracked at once. A tuple holding anything else stays tracked. Not seen: an
// array given a `grad` after a tuple holding it was untracked (a cycle through it needs that
// gradient to be a view of the very tape that recorded the tuple; such a tape then stays until
// exit).
static bool gc_atomic(PyObject* item) {
  if (!(PyObject_IS_GC(item) && PyObject_GC_IsTracked(item))) return true;
  NdArray* a = nullptr;
  return nb::try_cast<NdArray*>(nb::handle(item), a) && a && a->owner.is_none() &&
         a->grad.is_none();
}
void untrack_if_atomic(nb::handle tuple) {
  PyObject* t = tuple.ptr();
  if (t == nullptr || !PyTuple_Check(t) || !PyObject_GC_IsTracked(t)) return;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); ++i) {
    if (!gc_atomic(PyTuple_GET_ITEM(t, i))) return;
  }
  PyObject_GC_UnTrack(t);
}

namespace {

// The "<call> '<kernel>', argument i ('name': type)" that begins an argument's error; built only
// when one is raised (a launch passes ~10 arguments, ~10^4 times an iteration).
struct ArgWhere {
  const Kernel& k;
  size_t i;
  const char* call;
  std::string operator()() const {
    const ParamInfo& p = k.params[i];
    return std::string(call) + " '" + k.name + "', argument " + std::to_string(i) + " ('" + p.name +
           "': " +
           (p.array ? "ndarray<" + std::string(tname(p.dtype)) + ", " + std::to_string(p.rank) + ">"
                    : std::string(tname(p.dtype))) +
           ")";
  }
};

std::string type_name_of(nb::handle v) { return nb::type_name(v.type()).c_str(); }

Arg array_arg(const ParamInfo& p, const State& st, nb::handle v, const ArgWhere& where) {
  NdArray* a = nullptr;
  if (!nb::try_cast<NdArray*>(v, a) || a == nullptr) {
    invalid(where() + ": expected a vkad ndarray, got " + type_name_of(v));
  }
  if (a->st.get() != &st) invalid(where() + ": " + a->label() + " belongs to another session");
  if (a->free_deferred) a->check_live(where());
  // The IR sees only the rank: an element of 2 components read from an array with 3 would
  // drop the third without an error.
  if (!p.element.empty() && a->shape.size() == p.rank &&
      !std::equal(p.element.begin(), p.element.end(), a->shape.end() - p.element.size())) {
    invalid(where() + ": " + a->label() + " has shape " + shape_string(a->shape) +
            "; the parameter's elements are of shape " + shape_string(p.element) +
            " (KernelBuilder.ndarray(..., element=...)), held in its last " +
            std::to_string(p.element.size()) + " axes, so those must be " +
            shape_string(p.element));
  }
  return Arg::ndarray(a->handle);
}

// Integers: Python ints and numpy integers (anything with __index__), range checked.
Arg integer_arg(const ParamInfo& p, nb::handle v, const ArgWhere& where) {
  if (!PyIndex_Check(v.ptr())) invalid(where() + ": expected an integer, got " + type_name_of(v));
  nb::object idx = nb::steal(PyNumber_Index(v.ptr()));
  if (!idx.is_valid()) throw nb::python_error();
  int overflow = 0;
  long long x = PyLong_AsLongLongAndOverflow(idx.ptr(), &overflow);
  long long lo = p.dtype == DType::kI32 ? INT32_MIN : p.dtype == DType::kU32 ? 0 : LLONG_MIN;
  long long hi = p.dtype == DType::kI32   ? INT32_MAX
                 : p.dtype == DType::kU32 ? UINT32_MAX
                                          : LLONG_MAX;
  if (overflow || x < lo || x > hi) {
    invalid(where() + ": " + nb::str(idx).c_str() + " is out of range for " + tname(p.dtype));
  }
  if (p.dtype == DType::kI32) return Arg::i32(static_cast<int32_t>(x));
  if (p.dtype == DType::kU32) return Arg::u32(static_cast<uint32_t>(x));
  return Arg::i64(x);
}

}  // namespace

Arg to_arg(const Kernel& k, const State& st, size_t i, nb::handle v, const char* call) {
  const ParamInfo& p = k.params[i];
  const ArgWhere where{k, i, call};
  if (p.array) return array_arg(p, st, v, where);
  if (p.dtype == DType::kF32 || p.dtype == DType::kF64) {
    double d = PyFloat_AsDouble(v.ptr());
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      invalid(where() + ": expected a number, got " + type_name_of(v));
    }
    // Passed on as a double: the runtime's range check (a finite value past FLT_MAX does not
    // fit f32) must see the value the caller gave, not one narrowed to +-inf here.
    Arg a = Arg::f64(d);
    a.dtype = p.dtype;
    return a;
  }
  if (p.dtype == DType::kBool) {
    if (!PyBool_Check(v.ptr()) && !PyIndex_Check(v.ptr())) {
      invalid(where() + ": expected a bool, got " + type_name_of(v));
    }
    return Arg::boolean(PyObject_IsTrue(v.ptr()) == 1);
  }
  return integer_arg(p, v, where);
}

Kernel* Launches::kernel_for(nb::handle kernel, size_t nargs, const char* where, bool check_count) {
  Kernel* k = nullptr;
  if (!nb::try_cast<Kernel*>(kernel, k) || !k) {
    Differentiated* d = nullptr;
    if (nb::try_cast<Differentiated*>(kernel, d) && d) k = nb::cast<Kernel*>(d->forward);
  }
  if (!k)
    invalid(std::string(where) + ": expected a vkad Kernel, got " +
            nb::type_name(kernel.type()).c_str());
  if (k->st != st)
    invalid(std::string(where) + " '" + k->name + "': the kernel belongs to another session");
  if (check_count && nargs != k->params.size()) {
    invalid(std::string(where) + " '" + k->name + "': " + std::to_string(nargs) +
            " arguments given, the kernel takes " + std::to_string(k->params.size()) + ": " +
            k->signature());
  }
  return k;
}

template <typename Value>
void Launches::trace(nb::handle kernel, Kernel* k, Value&& value) {
  LoopTrace& t = *st->loop;
  LoopEntry e;
  e.kernel = nb::borrow(kernel);
  e.k = k;
  const size_t n = k->params.size();
  e.args.resize(n);
  e.step.assign(n, 0);
  nb::tuple values = nb::steal<nb::tuple>(PyTuple_New(static_cast<Py_ssize_t>(n)));
  for (size_t i = 0; i < n; ++i) {
    nb::handle v = value(i);
    nb::object pv;
    LoopIndex* li = nullptr;
    if (nb::try_cast<LoopIndex*>(v, li) && li) {
      const ParamInfo& p = k->params[i];
      if (p.array || p.dtype != DType::kI32) {
        invalid("Session.loop: launch '" + k->name + "', argument " + std::to_string(i) + " ('" +
                p.name + "'): the loop index steps an i32 scalar; this parameter is " +
                (p.array ? "an ndarray" : std::string("a ") + tname(p.dtype) + " scalar"));
      }
      pv = nb::int_(t.start + li->offset);
      e.step[i] = 1;
    } else {
      pv = nb::borrow(v);
    }
    e.args[i] = to_arg(*k, *st, i, pv);
    PyTuple_SET_ITEM(values.ptr(), static_cast<Py_ssize_t>(i), pv.release().ptr());
  }
  e.values = std::move(values);
  e.recorded = st->recording != nullptr && !k->adjoint.is_none();
  t.entries.push_back(std::move(e));
}

void Launches::launch(nb::handle kernel, nb::args args) {
  Kernel* k = kernel_for(kernel, args.size(), "launch");
  if (st->loop && st->loop->mine()) {
    trace(kernel, k, [&](size_t i) { return nb::handle(args[i]); });
    return;
  }
  Arg buf[16];
  std::vector<Arg> heap;
  Arg* a = buf;
  if (args.size() > 16) {
    heap.resize(args.size());
    a = heap.data();
  }
  for (size_t i = 0; i < args.size(); ++i) a[i] = to_arg(*k, *st, i, args[i]);
  launch_converted(kernel, k, std::span<const Arg>(a, args.size()), args);
}

void Launches::launch_converted(nb::handle kernel, Kernel* k, std::span<const Arg> span,
                                nb::handle args, const char* note, uint64_t note_index) {
  // A differentiated kernel's launch inside `with t:` is vkad::Tape::launch's: its check
  // (refused before anything runs), checkpoint copies, launch and record.
  Tape* tape = k->diff ? st->recording : nullptr;
  if (tape && !args.is_valid()) {
    invalid("launch '" + k->name +
            "': a differentiated kernel launched on a recording tape "
            "without its Python arguments");
  }
  uint32_t captured = 0;  // launches in the open capture after this one
  {
    Locked l(*st);
    if (tape) {
      (void)st->get();  // a closed session's message first
      check(tape->get().launch(*k->diff, span));
    } else {
      vkad::runtime::Runtime& rt = st->get().runtime();
      rt.set_launch_note(note, note_index);
      const Status launched = st->get().launch(k->handle, span);
      rt.set_launch_note(nullptr, 0);
      check(launched);
    }
    // Only a capture has launches to mirror: the launch path reads nothing more without one.
    if (!st->capture.is_none()) captured = st->get().captured_launches();
  }
  if (tape) tape->record(kernel, k, args);
  if (!st->capture.is_none()) {
    // A checkpointing tape's copies before the launch: launches of copy kernels there.
    if (captured > 0) pad_capture(*st, captured - 1);
    nb::cast<Graph*>(st->capture)->add(k);
  }
}

void Launches::prepare(nb::handle kernel, nb::args args) {
  Kernel* k = kernel_for(kernel, args.size(), "prepare");
  std::vector<Arg> a(args.size());
  for (size_t i = 0; i < args.size(); ++i) a[i] = to_arg(*k, *st, i, args[i]);
  const KernelHandle h = k->handle;
  check(blocking(*st, [&](vkad::Session& s) { return s.prepare(h, a); }));
}

namespace {

// Session.bind's result (docs/python.md, "Bound launches"): a launch with some arguments fixed. A
// step loop launches the same kernels with the same arrays thousands of times and only the step
// changes; calling a Bound converts only what changes and goes straight to the launch, where
// Session.launch converts every argument behind a Python call that builds the argument list.
struct Bound {
  nb::object session;  // the Python Session: keeps it (and `s`, its launches) alive
  Launches* s = nullptr;
  nb::object kernel;  // as given to bind (a Kernel or a Differentiated)
  Kernel* k = nullptr;
  std::vector<Arg> args;           // per parameter (the free ones' filled per call, in a copy)
  std::vector<nb::object> values;  // per parameter: the bound Python value, None where free
  std::vector<uint32_t> free;      // the free parameters, in parameter order
  std::vector<NdArray*> arrays;    // the bound arrays (held by `values`), checked per call

  std::string free_names() const {
    std::string out;
    for (uint32_t i : free) out += (out.empty() ? "" : ", ") + k->params[i].name;
    return out.empty() ? "none" : out;
  }

  void call(nb::args rest) {
    if (rest.size() != free.size()) {
      invalid("launch '" + k->name + "' (bound): " + std::to_string(rest.size()) +
              " arguments given, the bound launch takes " + std::to_string(free.size()) + " (" +
              free_names() + ")");
    }
    for (NdArray* a : arrays) {
      if (a->free_deferred) a->check_live("launch '" + k->name + "' (bound)");
    }
    if (s->st->loop && s->st->loop->mine()) {  // Session.loop's body: traced, not run
      size_t r = 0;
      s->trace(kernel, k, [&](size_t i) { return values[i].is_none() ? rest[r++] : values[i]; });
      return;
    }
    // The bound arguments copied: another thread may call this Bound while this call runs
    // Python (the tape's hook), so nothing of it is written per call.
    Arg local[16];
    std::vector<Arg> heap;
    Arg* a = local;
    if (args.size() > std::size(local)) {
      heap.assign(args.begin(), args.end());
      a = heap.data();
    } else {
      std::copy(args.begin(), args.end(), local);
    }
    for (size_t i = 0; i < free.size(); ++i) a[free[i]] = to_arg(*k, *s->st, free[i], rest[i]);
    // A tape records the launch with its Python arguments (its backward launches the adjoint
    // with them): built only when one is recording this kernel.
    nb::object recorded;
    if (s->st->recording != nullptr && k->diff) {
      nb::tuple t = nb::steal<nb::tuple>(PyTuple_New(static_cast<Py_ssize_t>(values.size())));
      for (size_t i = 0, r = 0; i < values.size(); ++i) {
        nb::object v = values[i].is_none() ? nb::borrow(rest[r++]) : values[i];
        PyTuple_SET_ITEM(t.ptr(), static_cast<Py_ssize_t>(i), v.release().ptr());
      }
      recorded = std::move(t);
    }
    s->launch_converted(kernel, k, std::span<const Arg>(a, args.size()), recorded);
  }
};

}  // namespace

nb::object Launches::bind(nb::handle self, nb::handle kernel, nb::kwargs named) {
  {
    Locked l(*st);
    (void)st->get();  // a closed session binds nothing, as it launches nothing
  }
  Kernel* k = kernel_for(kernel, 0, "bind", /*check_count=*/false);
  auto* b = new Bound();
  nb::object out = nb::cast(b, nb::rv_policy::take_ownership);
  b->session = nb::borrow(self);
  b->s = this;
  b->kernel = nb::borrow(kernel);
  b->k = k;
  b->args.resize(k->params.size());
  b->values.assign(k->params.size(), nb::none());
  std::vector<bool> given(k->params.size(), false);
  for (auto [key, value] : named) {
    std::string name;
    if (!nb::try_cast<std::string>(key, name)) invalid("bind: parameter names are strings");
    auto it = std::find_if(k->params.begin(), k->params.end(),
                           [&](const ParamInfo& p) { return p.name == name; });
    if (it == k->params.end())
      invalid("bind '" + k->name + "': no parameter '" + name + "' (" + k->signature() + ")");
    const auto i = static_cast<size_t>(it - k->params.begin());
    b->args[i] = to_arg(*k, *st, i, value, "bind");
    b->values[i] = nb::borrow(value);
    given[i] = true;
    NdArray* a = nullptr;
    if (it->array && nb::try_cast<NdArray*>(value, a) && a) b->arrays.push_back(a);
  }
  for (uint32_t i = 0; i < k->params.size(); ++i) {
    if (!given[i]) b->free.push_back(i);
  }
  return out;
}

namespace {

// Session.bind's vkad.BoundLaunch.
void bind_bound(nb::module_& m) {
  nb::class_<Bound>(m, "BoundLaunch", "A kernel with some arguments fixed (Session.bind).")
      .def("__call__", &Bound::call, "args"_a,
           nb::sig("def __call__(self, *args: NdArray | int | float | bool) -> None"),
           "Launches the kernel with the fixed arguments and these (the free parameters, in "
           "order).")
      .def_prop_ro("kernel", [](const Bound& b) { return b.kernel; })
      .def_prop_ro("free_params",
                   [](const Bound& b) {
                     std::vector<std::string> out;
                     for (uint32_t i : b.free) out.push_back(b.k->params[i].name);
                     return out;
                   })
      .def("__repr__", [](const Bound& b) {
        return "vkad.BoundLaunch('" + b.k->name + "', free: " + b.free_names() + ")";
      });
}

void bind_session_launches(nb::class_<Session>& session) {
  session
      .def("launch", on<&Session::launches>(&Launches::launch), "kernel"_a, "args"_a,
           nb::sig("def launch(self, kernel: Kernel | Differentiated, "
                   "*args: NdArray | int | float | bool) -> None"),
           "Records a launch (asynchronous). Scalars are converted to the parameter's dtype.")
      .def(
          "bind",
          [](nb::handle self, nb::handle kernel, nb::kwargs named) {
            return nb::cast<Session&>(self).launches.bind(self, kernel, std::move(named));
          },
          "kernel"_a, "args"_a,
          nb::sig("def bind(self, kernel: Kernel | Differentiated, "
                  "**args: NdArray | int | float | bool) -> BoundLaunch"),
          "The kernel with the arguments named here fixed (checked now): calling the result "
          "with the others, positionally in parameter order, launches it as launch() would "
          "(taped, captured), converting only those. docs/python.md, 'Bound launches'.")
      .def("prepare", on<&Session::launches>(&Launches::prepare), "kernel"_a, "args"_a,
           nb::sig("def prepare(self, kernel: Kernel | Differentiated, "
                   "*args: NdArray | int | float | bool) -> None"),
           "Makes the pipelines a launch with these arguments uses (specialized variants "
           "included), launching nothing; blocks while the driver compiles them.");
}

}  // namespace

void bind_launches(nb::module_& m, nb::class_<Session>& session) {
  bind_bound(m);
  bind_session_launches(session);
}

void pad_capture(State& st, uint32_t captured) {
  if (st.capture.is_none()) return;
  Graph* g = nb::cast<Graph*>(st.capture);
  while (g->kernels.size() < captured) g->add(nullptr);
}

}  // namespace vkad_py
