// Binds the module (NB_MODULE): error classes, _devices and DType, then each source's part.
// Defines the error helpers, outside_loop and shape_string binding.h declares.
#include <string>
#include <vector>

#include "binding.h"
#include "vkad_version.h"

namespace vkad_py {

PyObject* g_error = PyExc_RuntimeError;
PyObject* g_errors[kCodes] = {};

[[noreturn]] void raise(const Status& s) {
  int c = static_cast<int>(s.code());
  PyObject* cls = c > 0 && c < kCodes && g_errors[c] ? g_errors[c] : g_error;
  PyErr_SetString(cls, s.message().c_str());
  throw nb::python_error();
}
[[noreturn]] void invalid(const std::string& message) {
  raise(Status(ErrorCode::kInvalidArgument, message));
}

void outside_loop() {
  invalid(
      "Session.loop: its body may only launch kernels (it is traced once, with a symbolic loop "
      "index, and its launches repeated); zero, fill, copy, upload, read back, capture, bind or "
      "compile before or after the loop");
}

std::string shape_string(const std::vector<uint32_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

namespace {

// vkad::devices() as a list of dicts (vkad/devices.py makes them Device records).
nb::list list_devices() {
  Result<std::vector<vkad::DeviceInfo>> list = [] {
    nb::gil_scoped_release unlocked;  // the first call creates the Vulkan instance
    return vkad::devices();
  }();
  nb::list out;
  for (const vkad::DeviceInfo& d : take(std::move(list))) {
    nb::dict e;
    e["index"] = d.index;
    e["name"] = d.name;
    e["kind"] = d.kind;
    e["cpu"] = d.cpu;
    e["uuid"] = d.uuid;
    e["driver_name"] = d.driver_name;
    e["driver_info"] = d.driver_info;
    e["vendor_id"] = d.vendor_id;
    e["device_id"] = d.device_id;
    e["api_version"] = std::to_string(d.api_version >> 22) + "." +
                       std::to_string((d.api_version >> 12) & 0x3ff) + "." +
                       std::to_string(d.api_version & 0xfff);
    e["usable"] = d.usable;
    e["unusable"] = d.unusable;
    e["automatic"] = d.automatic;
    out.append(e);
  }
  return out;
}

// The error classes, the device list and DType (NB_MODULE, in parts of a screen each).
void bind_errors_and_types(nb::module_& m) {
  // The exception classes live in vkad/errors.py (typed, documented); vkad/__init__.py hands
  // them over here: the base class, and {error_code_name(code): class}. Until then (and for a
  // code without a class) errors are RuntimeErrors.
  m.def("_set_errors", [](nb::handle base, nb::dict by_name) {
    g_error = nb::borrow(base).release().ptr();  // kept for the life of the process
    for (int c = 1; c < kCodes; ++c) {
      const char* name = vkad::error_code_name(static_cast<ErrorCode>(c));
      g_errors[c] = by_name.contains(name) ? nb::borrow(by_name[name]).release().ptr() : g_error;
    }
  });

  m.def(
      "_devices", &list_devices, nb::sig("def _devices() -> list[dict[str, int | str | bool]]"),
      "vkad::devices(): every Vulkan device, in the order of the indices Session(device=) takes.");

  nb::enum_<DType>(m, "DType", "Element and scalar types.")
      .value("f32", DType::kF32)
      .value("f64", DType::kF64)
      .value("i32", DType::kI32)
      .value("u32", DType::kU32)
      .value("i64", DType::kI64)
      .value("bool", DType::kBool);
}

}  // namespace
}  // namespace vkad_py

NB_MODULE(_vkad, m) {
  using namespace vkad_py;
  m.doc() = "vkad's native binding; use the vkad package, which wraps and re-exports it.";
  Py_AtExit([] { g_interpreter_gone.store(true); });  // release_export's guard
  m.attr("__version__") = VKAD_VERSION_STRING;        // from the file VERSION (vkad_version.h)

  bind_errors_and_types(m);
  nb::class_<Session> session = bind_session(m);
  bind_ndarrays(m, session);
  bind_interop(session);
  bind_kernels(m, session);
  bind_launches(m, session);
  bind_loops(m, session);
  bind_tape(m, session);
  bind_graphs(m, session);
  bind_debugging(m, session);
}
