// Binds vkad.Kernel, vkad.Differentiated and Session.compile / differentiate / jvp / release.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autodiff/forward_mode.h"
#include "binding.h"

using namespace nb::literals;

namespace vkad_py {
namespace {

std::vector<ParamInfo> params_of(const vkad::codegen::Kernel& k, const Elements& elements = {}) {
  std::vector<ParamInfo> out;
  for (size_t i = 0; i < k.params.size(); ++i) {
    const auto& p = k.params[i];
    out.push_back({p.name, p.kind == ParamKind::kNdArray, p.dtype, p.rank, p.needs_grad});
    if (i < elements.size() && out.back().array && elements[i].size() <= p.rank) {
      out.back().element = elements[i];
    }
  }
  return out;
}

}  // namespace

nb::object Kernels::make_kernel(KernelHandle h, const std::string& name,
                                std::vector<ParamInfo> params) {
  auto* k = new Kernel();
  k->st = st;
  k->handle = h;
  k->name = name;
  k->params = std::move(params);
  return nb::cast(k, nb::rv_policy::take_ownership);
}

nb::object Kernels::compile(const std::string& text, const Elements& elements) {
  vkad::codegen::Kernel k;
  Result<KernelHandle> h = blocking(*st, [&](vkad::Session& s) -> Result<KernelHandle> {
    VKAD_ASSIGN_OR_RETURN(k, vkad::codegen::parse(text));
    return s.compile(k);
  });
  return make_kernel(take(std::move(h)), k.name, params_of(k, elements));
}

nb::object Kernels::differentiate(const std::string& text, const Elements& elements) {
  vkad::codegen::Kernel k;
  std::shared_ptr<const vkad::codegen::KernelAccess> access;
  Result<vkad::Differentiated> r =
      blocking(*st, [&](vkad::Session& s) -> Result<vkad::Differentiated> {
        VKAD_ASSIGN_OR_RETURN(k, vkad::codegen::parse(text));
        VKAD_ASSIGN_OR_RETURN(vkad::Differentiated d, s.differentiate(k));
        access = s.launch_access(d.forward);
        return d;
      });
  vkad::Differentiated d = take(std::move(r));
  std::vector<ParamInfo> fparams = params_of(k, elements), aparams = fparams;
  nb::object forward = make_kernel(d.forward, k.name, fparams);
  Kernel& fk = nb::cast<Kernel&>(forward);
  fk.access = std::move(access);
  for (const vkad::GradientParam& g : d.gradients) {
    ParamInfo gp = fparams[g.param];
    gp.name = g.name;
    gp.grad = false;
    if (!gp.array) {  // a scalar's gradient: a 1-element array (autodiff/reverse_mode.h)
      gp.array = true;
      gp.rank = 1;
      gp.element.clear();
    }
    aparams.push_back(gp);
    fk.gradients.emplace_back(g.param, g.name);
  }
  fk.adjoint = make_kernel(d.adjoint, k.name + "_adjoint", aparams);
  fk.diff = std::make_shared<const vkad::Differentiated>(std::move(d));
  auto* out = new Differentiated{forward, fk.adjoint};
  return nb::cast(out, nb::rv_policy::take_ownership);
}

nb::object Kernels::jvp(const std::string& text, const Elements& elements) {
  vkad::codegen::Kernel k, j;
  Result<KernelHandle> h = blocking(*st, [&](vkad::Session& s) -> Result<KernelHandle> {
    VKAD_ASSIGN_OR_RETURN(k, vkad::codegen::parse(text));
    VKAD_ASSIGN_OR_RETURN(j, vkad::codegen::make_jvp(k, s.target()));
    return s.compile(j);
  });
  KernelHandle handle = take(std::move(h));
  Elements all(elements.begin(), elements.end());
  all.resize(k.params.size());
  for (size_t p = 0; p < k.params.size(); ++p) {
    if (k.params[p].needs_grad) all.push_back(all[p]);
  }
  return make_kernel(handle, j.name, params_of(j, all));
}

void Kernels::release(Kernel& k) {
  if (k.st != st) invalid("release: kernel '" + k.name + "' belongs to another session");
  Locked l(*st);
  check(st->get().release(k.handle));
  k.released = true;
}

namespace {

// vkad.Kernel.
void bind_kernel(nb::module_& m) {
  nb::class_<Kernel>(m, "Kernel", "A compiled kernel; released when collected.")
      .def_prop_ro("name", [](const Kernel& k) { return k.name; })
      .def_prop_ro("param_names",
                   [](const Kernel& k) {
                     std::vector<std::string> out;
                     for (const ParamInfo& p : k.params) out.push_back(p.name);
                     return out;
                   })
      .def_prop_ro(
          "params",
          [](const Kernel& k) {
            // (name, dtype, rank): rank 0 for a scalar.
            nb::list out;
            for (const ParamInfo& p : k.params) out.append(nb::make_tuple(p.name, p.dtype, p.rank));
            return out;
          },
          "(name, dtype, rank) per parameter; rank 0 for a scalar.")
      .def_prop_ro(
          "_array_params",
          [](const Kernel& k) {
            nb::list out;
            for (size_t i = 0; i < k.params.size(); ++i) {
              if (k.params[i].array) out.append(i);
            }
            return out;
          },
          "Indices of the ndarray parameters (rank 0 ones included).")
      .def_prop_ro(
          "_written_params",
          [](const Kernel& k) {
            nb::list out;
            if (!k.access) return out;
            for (const vkad::codegen::ParamAccess& pa : k.access->params) {
              bool writes = false;
              for (const vkad::codegen::ArrayAccess& a : pa.accesses) {
                writes = writes || a.kind != vkad::codegen::ArrayAccess::Kind::kRead;
              }
              if (writes) out.append(pa.param);
            }
            return out;
          },
          "Indices of the ndarray parameters the kernel writes (differentiated kernels).")
      .def_prop_ro(
          "adjoint", [](const Kernel& k) { return k.adjoint; },
          nb::sig("def adjoint(self) -> Kernel | None"),
          "The adjoint of a kernel from differentiate(), else None.")
      .def_prop_ro(
          "gradients",
          [](const Kernel& k) {
            nb::list out;
            for (const auto& [p, name] : k.gradients) out.append(nb::make_tuple(p, name));
            return out;
          },
          "(forward parameter index, gradient name) per differentiated parameter.")
      .def_prop_ro("signature", &Kernel::signature)
      .def("__repr__", [](const Kernel& k) { return "vkad.Kernel(" + k.signature() + ")"; });
}

// vkad.Differentiated: Session.differentiate's result.
void bind_differentiated(nb::module_& m) {
  nb::class_<Differentiated>(m, "Differentiated",
                             "A forward kernel and its adjoint (Session.differentiate).")
      .def_ro("forward", &Differentiated::forward, nb::sig("def forward(self) -> Kernel"))
      .def_ro("adjoint", &Differentiated::adjoint, nb::sig("def adjoint(self) -> Kernel"))
      .def_prop_ro(
          "gradients",
          [](const Differentiated& d) {
            // {forward parameter name: gradient parameter name}
            const Kernel& k = nb::cast<const Kernel&>(d.forward);
            nb::dict out;
            for (const auto& [p, name] : k.gradients) out[nb::str(k.params[p].name.c_str())] = name;
            return out;
          },
          "{forward parameter name: gradient parameter name} of the adjoint.");
}

void bind_session_kernels(nb::class_<Session>& session) {
  session
      .def("compile", on<&Session::kernels>(&Kernels::compile), "ir"_a, "elements"_a = Elements{},
           nb::sig("def compile(self, ir: str, elements: collections.abc.Sequence["
                   "collections.abc.Sequence[int]] = []) -> Kernel"),
           "Compiles a kernel from the IR text form. `elements`: per parameter, the extents "
           "its array's trailing axes must have at a launch (a KernelBuilder's element shapes).")
      .def("jvp", on<&Session::kernels>(&Kernels::jvp), "ir"_a, "elements"_a = Elements{},
           nb::sig("def jvp(self, ir: str, elements: collections.abc.Sequence["
                   "collections.abc.Sequence[int]] = []) -> Kernel"),
           "Compiles the forward-mode (tangent) kernel of a kernel (IR text): its parameters, "
           "then '<name>_dot' per grad parameter (autodiff/forward_mode.h); `elements` as for "
           "compile.")
      .def("differentiate", on<&Session::kernels>(&Kernels::differentiate), "ir"_a,
           "elements"_a = Elements{},
           nb::sig("def differentiate(self, ir: str, elements: collections.abc.Sequence["
                   "collections.abc.Sequence[int]] = []) -> Differentiated"),
           "Compiles a kernel (IR text) and its adjoint; `elements` as for compile (the "
           "adjoint's gradient parameters take their array's).")
      .def("release", on<&Session::kernels>(&Kernels::release), "kernel"_a);
}

}  // namespace

void bind_kernels(nb::module_& m, nb::class_<Session>& session) {
  bind_kernel(m);
  bind_differentiated(m);
  bind_session_kernels(session);
}

}  // namespace vkad_py
