#include "autodiff/passes.h"

#include "autodiff/accumulations.h"
#include "autodiff/forward_mode.h"
#include "autodiff/forward_stores.h"
#include "autodiff/jumps.h"
#include "autodiff/reverse_mode.h"
#include "ir/text.h"

namespace vkad::codegen {

namespace {

// A factory for a pass that takes no options.
PassRegistry::Factory plain(std::string name, std::function<Pass(const Target&)> make) {
  return [name = std::move(name), make = std::move(make)](const Target& t,
                                                          const PassOptions& o) -> Result<Pass> {
    VKAD_TRY(only_options(name, o, {}));
    return make(t);
  };
}

// A factory for a pass that takes `segment` (AdjointOptions::checkpoint_segment).
PassRegistry::Factory with_segment(std::string name,
                                   std::function<Pass(const Target&, const AdjointOptions&)> make) {
  return [name = std::move(name), make = std::move(make)](const Target& t,
                                                          const PassOptions& o) -> Result<Pass> {
    VKAD_TRY(only_options(name, o, {"segment"}));
    AdjointOptions options;
    VKAD_ASSIGN_OR_RETURN(options.checkpoint_segment, uint_option(name, o, "segment", 0));
    VKAD_TRY(check_adjoint_options(options));
    Pass p = make(t, options);
    p.name = name;
    return p;
  };
}

// "text-roundtrip": parse(print(k)), which must print as k does (the text form loses nothing).
Pass text_roundtrip_pass() {
  return {"text-roundtrip", [](const Kernel& k) -> Result<Kernel> {
            const std::string printed = print(k);
            VKAD_ASSIGN_OR_RETURN(Kernel again, parse(printed));
            if (print(again) != printed) {
              return make_error(ErrorCode::kInternal, "text-roundtrip: kernel '" + k.name +
                                                          "' prints differently once parsed");
            }
            return again;
          }};
}

PassRegistry make_registry() {
  PassRegistry r;
  r.add("verify", "verify() against the target; the kernel unchanged",
        plain("verify", [](const Target& t) { return verify_pass(t); }));
  r.add("text-roundtrip", "print, parse again; the printed forms must agree",
        plain("text-roundtrip", [](const Target&) { return text_roundtrip_pass(); }));
  r.add("lower-jumps", "break / continue rewritten into flags and guards (jumps.h)",
        plain("lower-jumps", [](const Target& t) { return lower_jumps_pass(t); }));
  r.add("accumulate-stores", "updates x[I] = x[I] + v as the atomic adds they compute",
        plain("accumulate-stores", [](const Target&) { return accumulate_stores_pass(); }));
  r.add("forward-stores", "a load of what the invocation stored earlier in its block, forwarded",
        plain("forward-stores", [](const Target&) { return forward_stores_pass(); }));
  r.add("segment-loops", "the loops reverse mode would checkpoint split into segments",
        with_segment("segment-loops",
                     [](const Target&, const AdjointOptions& o) { return segment_loops_pass(o); }));
  r.add("reverse-mode", "plan_adjoint, then the adjoint that applies it (no jumps allowed)",
        plain("reverse-mode", [](const Target& t) { return reverse_mode_pass(t, {}); }));
  r.add("clearing-reverse-mode", "reverse-mode, clearing each store's seed",
        plain("clearing-reverse-mode",
              [](const Target& t) { return reverse_mode_pass(t, {}, true); }));
  r.add("adjoint",
        "make_adjoint: verify, accumulate-stores, check-overwrites, lower-jumps, "
        "forward-stores, segment-loops, reverse-mode",
        with_segment("adjoint", [](const Target& t, const AdjointOptions& o) {
          return Pass{"adjoint", [t, o](const Kernel& k) { return make_adjoint(k, t, o); }};
        }));
  r.add("clearing-adjoint", "make_clearing_adjoint",
        with_segment("clearing-adjoint", [](const Target& t, const AdjointOptions& o) {
          return Pass{"clearing-adjoint",
                      [t, o](const Kernel& k) { return make_clearing_adjoint(k, t, o); }};
        }));
  r.add("jvp", "make_jvp: forward mode", plain("jvp", [](const Target& t) {
          return Pass{"jvp", [t](const Kernel& k) { return make_jvp(k, t); }};
        }));
  return r;
}

}  // namespace

const PassRegistry& compiler_passes() {
  static const PassRegistry registry = make_registry();
  return registry;
}

}  // namespace vkad::codegen
