// Binds vkad.NdArray and Session's array calls: make, upload, read back, zero, fill, copy, free.
#include <climits>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"

using namespace nb::literals;

namespace vkad_py {

bool dtype_of(const nb::dlpack::dtype& d, DType* out) {
  using C = nb::dlpack::dtype_code;
  auto code = static_cast<C>(d.code);
  if (d.lanes != 1) return false;
  if (code == C::Float && d.bits == 32)
    *out = DType::kF32;
  else if (code == C::Float && d.bits == 64)
    *out = DType::kF64;
  else if (code == C::Int && d.bits == 32)
    *out = DType::kI32;
  else if (code == C::UInt && d.bits == 32)
    *out = DType::kU32;
  else if (code == C::Int && d.bits == 64)
    *out = DType::kI64;
  else if (code == C::Bool && d.bits == 8)
    *out = DType::kBool;
  else
    return false;
  return true;
}

namespace {

// numpy's name of each dtype.
const char* numpy_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kI32: return "int32";
    case DType::kU32: return "uint32";
    case DType::kI64: return "int64";
    case DType::kBool: return "bool";
  }
  return "?";
}

std::string describe(const nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>& a) {
  std::vector<uint32_t> shape;
  for (size_t i = 0; i < a.ndim(); ++i) shape.push_back(static_cast<uint32_t>(a.shape(i)));
  DType t;
  return "a numpy array of shape " + shape_string(shape) + " and dtype " +
         (dtype_of(a.dtype(), &t) ? numpy_name(t) : "unsupported by vkad");
}

// Host -> device from the numpy buffer itself (vkad copies it into staging before returning);
// only a bool array is converted first (the device holds one u32 per bool).
void upload(NdArray& a, const HostArray& host) {
  a.check_live("upload");
  DType t;
  bool same_shape = host.ndim() == a.shape.size();
  for (size_t i = 0; same_shape && i < host.ndim(); ++i) same_shape = host.shape(i) == a.shape[i];
  if (!dtype_of(host.dtype(), &t) || t != a.dtype || !same_shape) {
    invalid("upload to " + a.label() + " (" + tname(a.dtype) + ", shape " + shape_string(a.shape) +
            "): got " + describe(host));
  }
  State& st = *a.st;
  if (t == DType::kBool) {
    const auto* b = static_cast<const uint8_t*>(host.data());
    std::vector<uint32_t> words(host.size());
    for (size_t i = 0; i < words.size(); ++i) words[i] = b[i] != 0;
    Locked l(st);
    check(st.get().upload(a.handle, words.data(), words.size() * 4));
    return;
  }
  Locked l(st);
  check(st.get().upload(a.handle, host.data(), host.nbytes()));
}

nb::object numpy_module() {
  static PyObject* np = nullptr;  // leaked on purpose: module objects outlive static destructors
  if (!np) np = nb::module_::import_("numpy").release().ptr();
  return nb::borrow(np);
}

// Device -> a new numpy array (the one copy); blocks with the GIL released.
nb::object download(NdArray& a) {
  a.check_live("numpy");
  nb::object np = numpy_module();
  nb::list shape;
  for (uint32_t e : a.shape) shape.append(e);
  bool is_bool = a.dtype == DType::kBool;
  nb::object out = np.attr("empty")(nb::tuple(shape), is_bool ? "uint32" : numpy_name(a.dtype));
  auto view = nb::cast<nb::ndarray<nb::c_contig, nb::device::cpu>>(out);
  void* data = view.data();
  uint64_t bytes = view.nbytes();
  Status status =
      blocking(*a.st, [&](vkad::Session& s) { return s.download(a.handle, data, bytes); });
  check(status);
  return is_bool ? out.attr("astype")("bool") : out;
}

}  // namespace

nb::object new_array(const StatePtr& st, std::vector<uint32_t> shape, DType dtype,
                     const std::string& name) {
  NdArrayHandle h;
  {
    Locked l(*st);
    h = take(st->get().ndarray(dtype, shape, name));
  }
  auto* a = new NdArray();
  a->st = st;
  a->handle = h;
  a->dtype = dtype;
  a->shape = std::move(shape);
  a->name = name;
  return nb::cast(a, nb::rv_policy::take_ownership);
}

nb::object Arrays::empty(nb::handle shape_obj, DType dtype, const std::string& name) {
  std::vector<uint32_t> shape;
  nb::object extents =
      PyIndex_Check(shape_obj.ptr()) ? nb::make_tuple(shape_obj) : nb::borrow(shape_obj);
  for (nb::handle e : extents) {
    nb::object index = nb::steal(PyNumber_Index(e.ptr()));
    if (!index.is_valid()) throw nb::python_error();
    int overflow = 0;  // past long long: out of range like any other (not OverflowError)
    long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (PyErr_Occurred()) throw nb::python_error();
    if (overflow != 0 || v < 0 || v > UINT32_MAX) {
      invalid("ndarray '" + name + "': extent " + std::string(nb::str(index).c_str()) +
              " out of range (0 .. " + std::to_string(UINT32_MAX) + ")");
    }
    shape.push_back(static_cast<uint32_t>(v));
  }
  return new_array(st, std::move(shape), dtype, name);
}

nb::object Arrays::from_numpy(const HostArray& host, const std::string& name) {
  DType t;
  if (!dtype_of(host.dtype(), &t)) {
    invalid("ndarray '" + name + "': " + describe(host) +
            "; vkad holds float32, float64, int32, uint32, int64 and bool");
  }
  nb::list shape;
  for (size_t i = 0; i < host.ndim(); ++i) shape.append(host.shape(i));
  nb::object a = empty(shape, t, name);
  upload(nb::cast<NdArray&>(a), host);
  return a;
}

NdArray& Arrays::own(nb::handle obj, const char* what) {
  NdArray* a = nullptr;
  if (!nb::try_cast<NdArray*>(obj, a) || !a) {
    invalid(std::string(what) + ": expected a vkad ndarray, got " +
            nb::type_name(obj.type()).c_str());
  }
  if (a->st != st) invalid(std::string(what) + ": " + a->label() + " belongs to another session");
  a->check_live(what);
  return *a;
}

void Arrays::free(nb::handle obj) {
  NdArray& a = own(obj, "free");
  if (!a.owner.is_none()) {
    invalid("free: " + a.label() +
            " is a tape's gradient: the tape frees it (with itself, or "
            "once its array is freed)");
  }
  if (a.exports > 0) {  // DLPack consumers still use its memory: freed after the last one
    a.freed = a.free_deferred = true;
    return;
  }
  Locked l(*st);
  check(st->get().free(a.handle));
  a.freed = true;
}

// Inside `with t:` a zero or fill goes through the tape (vkad::Tape::fill): a checkpointing
// tape records it, and any tape refuses one of an array the recording read or wrote.
void Arrays::zero(nb::handle obj) {
  NdArray& a = own(obj, "zero");
  if (st->recording) {
    (void)st->get();  // a closed session's message first
    st->recording->fill(obj, a.handle, 0.0);
    return;
  }
  Locked l(*st);
  check(st->get().zero(a.handle));
}

void Arrays::zero_many(nb::handle arrays) {
  std::vector<NdArrayHandle> handles;
  for (nb::handle obj : arrays) handles.push_back(own(obj, "zero_many").handle);
  if (st->recording) {
    for (nb::handle obj : arrays) fill(obj, 0.0);
    return;
  }
  Locked l(*st);
  check(st->get().zero(std::span<const NdArrayHandle>(handles)));
}

void Arrays::fill(nb::handle obj, double value) {
  NdArray& a = own(obj, "fill");
  if (st->recording) {
    (void)st->get();  // a closed session's message first
    st->recording->fill(obj, a.handle, value);
    return;
  }
  Locked l(*st);
  check(st->get().fill(a.handle, value));
}

void Arrays::copy(nb::handle src, nb::handle dst) {
  NdArray& a = own(src, "copy");
  NdArray& b = own(dst, "copy");
  if (st->recording) {  // vkad::Tape::copy: recorded where the gradient must flow through it
    (void)st->get();    // a closed session's message first
    st->recording->copy(src, dst, a.handle, b.handle);
    return;
  }
  uint32_t captured = 0;
  {
    Locked l(*st);
    check(st->get().copy(a.handle, b.handle));
    captured = st->get().captured_launches();
  }
  pad_capture(*st, captured);  // inside a capture a copy is a launch of a copy kernel
}

namespace {

// The cyclic GC sees what an array holds: a view's tape (`owner`), which may record the view
// among its launches (a cycle through the binding that would otherwise keep the tape and its
// gradients until the process ends), and the caller's gradient (`grad`, which may be an array
// whose own `grad` is this one). tp_clear drops `grad` only: clearing `owner` would make the
// view free the tape's gradient; a cycle through a view is broken at the tape's record
// (tape.cpp).
int ndarray_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  const NdArray* a = nb::inst_ptr<NdArray>(self);
  Py_VISIT(a->owner.ptr());
  Py_VISIT(a->grad.ptr());
  return 0;
}

int ndarray_clear(PyObject* self) {
  if (!nb::inst_ready(self)) return 0;
  NdArray* a = nb::inst_ptr<NdArray>(self);
  if (a->grad.is_none()) return 0;
  if (a->st) a->st->with_grad.erase(a->handle.id);  // as the setter does for None
  a->grad = nb::none();
  return 0;
}

PyType_Slot ndarray_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(ndarray_traverse)},
                               {Py_tp_clear, reinterpret_cast<void*>(ndarray_clear)},
                               {0, nullptr}};

// vkad.NdArray.
void bind_ndarray(nb::module_& m) {
  nb::class_<NdArray>(m, "NdArray", nb::is_weak_referenceable(), nb::type_slots(ndarray_slots),
                      "A device array owned by a Session; freed when collected.")
      .def_prop_ro("shape",
                   [](const NdArray& a) {
                     nb::list l;
                     for (uint32_t e : a.shape) l.append(e);
                     return nb::tuple(l);
                   })
      .def_prop_ro("dtype", [](const NdArray& a) { return a.dtype; })
      .def_prop_ro("name", [](const NdArray& a) { return a.name; })
      .def_prop_ro("size", &NdArray::size)
      .def_prop_ro("nbytes", &NdArray::nbytes)
      .def_prop_ro("handle", [](const NdArray& a) { return a.handle.id; })
      .def_prop_ro(
          "freed", [](const NdArray& a) { return a.freed; }, "Whether Session.free released it.")
      .def_prop_rw(
          "grad", [](const NdArray& a) { return a.grad; },
          [](NdArray& a, nb::object g) {
            if (!g.is_none()) {
              NdArray* ga = nullptr;
              if (!nb::try_cast<NdArray*>(g, ga) || !ga) {
                invalid("NdArray.grad of " + a.label() + ": expected a vkad ndarray or None, got " +
                        nb::type_name(g.type()).c_str());
              }
              if (ga == &a) invalid("NdArray.grad: " + a.label() + " cannot be its own gradient");
              if (ga->st != a.st) {
                invalid("NdArray.grad of " + a.label() + ": " + ga->label() +
                        " belongs to another session");
              }
              if (ga->dtype != a.dtype || ga->shape != a.shape) {
                invalid("NdArray.grad: the gradient " + ga->label() + " is " + tname(ga->dtype) +
                        " of shape " + shape_string(ga->shape) + ", " + a.label() + " is " +
                        tname(a.dtype) + " of shape " + shape_string(a.shape) +
                        "; a gradient has its array's dtype and shape");
              }
            }
            a.grad = std::move(g);
            // Where a tape's backward finds it (Tape::set_grad).
            if (a.grad.is_none()) {
              a.st->with_grad.erase(a.handle.id);
            } else {
              a.st->with_grad[a.handle.id] = &a;
            }
          },
          nb::arg("grad").none(),
          "The caller's gradient array (same dtype and shape), which a Tape uses; None when "
          "unset (the tape then keeps its own).")
      .def("numpy", &download, nb::sig("def numpy(self) -> numpy.typing.NDArray"),
           "Waits for the array's last writer (GIL released) and returns a new numpy array.")
      .def("upload", &upload, "array"_a,
           "Copies a numpy array of the same dtype and shape in (recorded, no wait).")
      .def("__dlpack__", &ndarray_dlpack, "stream"_a.none() = nb::none(),
           "max_version"_a.none() = nb::none(), "dl_device"_a.none() = nb::none(),
           "copy"_a.none() = nb::none(),
           nb::sig("def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, "
                   "int] | None = None, dl_device: tuple[int, int] | None = None, copy: bool | "
                   "None = None) -> object"),
           "A DLPack capsule viewing the array's memory (no copy): kDLCPU on host-visible "
           "devices (after a host wait for the array's last vkad use), kDLCUDA on NVIDIA GPUs "
           "(the consumer's `stream` waits for it on the GPU). The array lives while the "
           "consumer holds it. docs/interop.md.")
      .def("__dlpack_device__", &ndarray_dlpack_device,
           nb::sig("def __dlpack_device__(self) -> tuple[int, int]"),
           "(1, 0) for a host-visible array (kDLCPU), (2, ordinal) for CUDA (kDLCUDA).")
      .def_prop_ro("_dlpack_exports", [](const NdArray& a) { return a.exports; })
      .def("__repr__", [](const NdArray& a) {
        return "vkad.NdArray(" + (a.name.empty() ? "" : "'" + a.name + "', ") +
               std::string(tname(a.dtype)) + ", shape " + shape_string(a.shape) +
               (a.freed ? ", freed" : "") + ")";
      });
}

void bind_session_arrays(nb::class_<Session>& session) {
  session
      .def("empty", on<&Session::arrays>(&Arrays::empty), "shape"_a, "dtype"_a, "name"_a = "",
           nb::sig("def empty(self, shape: int | collections.abc.Sequence[int], dtype: DType, "
                   "name: str = '') -> NdArray"),
           "A new device array (contents undefined until written).")
      .def(
          "_owns", [](const Session& s, const NdArray& a) { return a.st == s.st; }, "array"_a,
          "Whether `array` is one of this session's arrays.")
      .def("_from_numpy", on<&Session::arrays>(&Arrays::from_numpy), "array"_a, "name"_a = "",
           nb::sig("def _from_numpy(self, array: numpy.typing.NDArray, name: str = '') -> NdArray"))
      .def("free", on<&Session::arrays>(&Arrays::free), "array"_a,
           nb::sig("def free(self, array: NdArray) -> None"))
      .def("zero", on<&Session::arrays>(&Arrays::zero), "array"_a,
           nb::sig("def zero(self, array: NdArray) -> None"))
      .def("zero_many", on<&Session::arrays>(&Arrays::zero_many), "arrays"_a,
           nb::sig("def zero_many(self, arrays: collections.abc.Iterable[NdArray]) -> None"),
           "Zeroes every array with one barrier pair (recorded, no wait); checks them all first.")
      .def("fill", on<&Session::arrays>(&Arrays::fill), "array"_a, "value"_a,
           nb::sig("def fill(self, array: NdArray, value: float) -> None"))
      .def("copy", on<&Session::arrays>(&Arrays::copy), "src"_a, "dst"_a,
           nb::sig("def copy(self, src: NdArray, dst: NdArray) -> None"),
           "Copies src into dst (same dtype and shape) on the device; asynchronous.");
}

}  // namespace

void bind_ndarrays(nb::module_& m, nb::class_<Session>& session) {
  bind_ndarray(m);
  bind_session_arrays(session);
}

}  // namespace vkad_py
