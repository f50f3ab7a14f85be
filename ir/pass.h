// The pass contract: a pass has a name and maps a kernel to a kernel (or an error); a Pipeline
// runs passes in order. Every rewrite of the compiler (lowering break / continue, segmented
// checkpointing, reverse and forward mode, ...) is a pass, and the sequences the compiler runs
// (make_adjoint, make_jvp, compile's front) are pipelines, so each step can be run, printed and
// tested alone (tests/kernels/*.vkir name the pipeline they run in their RUN line).
//
// Verification between passes: with verify_each on, the pipeline verifies the kernel after
// every pass, and a kernel that does not verify is reported naming the pass that produced it
// (kInternal: a bug in that pass; kUnsupported when it needs what the target lacks). On by
// default in debug builds (NDEBUG unset) and set by the test harness; release builds verify
// only where a pass's contract says so (make_adjoint verifies its result, for instance).
//
// A PassRegistry maps names to factories, so a pipeline can be written as text:
//   "verify, lower-jumps, adjoint{checkpoint-segment=4}"
// (comma-separated pass names, each with optional `{key=value, ...}` options).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "ir/ir.h"
#include "ir/target.h"

namespace vkad::codegen {

struct Pass {
  std::string name;
  // Takes the kernel by value: a pass that changes nothing may return it as it came.
  std::function<Result<Kernel>(Kernel)> run;
};

// verify(k, target), and the one way a pass's output that does not verify is reported: a
// kUnsupported error becomes kUnsupported "<lacks>: <verifier's message>" (the target lacks
// what the kernel needs), any other kInternal "<broken>: <verifier's message>" (the pass that
// made `k` has a bug).
Status verify_output(const Kernel& k, const Target& target, const std::string& lacks,
                     const std::string& broken);

// "verify": verify(k, target), the kernel unchanged; the verifier's error as it is.
Pass verify_pass(const Target& target);

#ifdef NDEBUG
inline constexpr bool kVerifyEachDefault = false;
#else
inline constexpr bool kVerifyEachDefault = true;
#endif

class Pipeline {
 public:
  // `target`: what verify_each verifies against.
  explicit Pipeline(Target target = Target::host()) : target_(std::move(target)) {}

  Pipeline& add(Pass pass);
  Pipeline& add(std::string name, std::function<Result<Kernel>(Kernel)> run);
  Pipeline& set_verify_each(bool on) {
    verify_each_ = on;
    return *this;
  }
  bool verify_each() const { return verify_each_; }
  std::vector<std::string> names() const;
  size_t size() const { return passes_.size(); }

  // Runs the passes in order on `k`. A pass's error is returned as the pass returned it; with
  // verify_each, a result that does not verify is reported by verify_output naming the pass
  // and the kernel. `failed` (optional) receives the name of the pass that failed or whose
  // output did not verify, "" on success.
  Result<Kernel> run(Kernel k, std::string* failed = nullptr) const;

 private:
  Target target_;
  std::vector<Pass> passes_;
  bool verify_each_ = kVerifyEachDefault;
};

// Options of one pass in a pipeline's text: `key=value` pairs.
using PassOptions = std::map<std::string, std::string>;

class PassRegistry {
 public:
  // A factory makes the pass for a target and options; it refuses options it does not know
  // (kInvalidArgument naming the pass and the option).
  using Factory = std::function<Result<Pass>(const Target&, const PassOptions&)>;

  // `summary`: one line for the pass list (docs/architecture.md, "Passes").
  void add(const std::string& name, std::string summary, Factory factory);
  bool has(const std::string& name) const { return passes_.count(name) != 0; }
  // Registered names, sorted, each with its summary.
  std::vector<std::pair<std::string, std::string>> list() const;

  // The pipeline written in `text` (see above) for `target`. kInvalidArgument naming the
  // position and what is wrong: an unknown pass name (the message lists the known ones), an
  // empty name, malformed options, or an option the pass refuses.
  Result<Pipeline> parse_pipeline(const std::string& text, const Target& target) const;

 private:
  struct Entry {
    std::string summary;
    Factory factory;
  };
  std::map<std::string, Entry> passes_;
};

// The passes written in `text` (the syntax above), each name with its options, in order; kInvalid-
// Argument naming what is malformed (a pass without a name, unbalanced braces, an option not of
// the form key=value). Names are not looked up: the caller's registry does that (graph/
// program.h parses launch-sequence pipelines with it too).
Result<std::vector<std::pair<std::string, PassOptions>>> split_pipeline(const std::string& text);

// For factories: the unsigned integer option `key` of pass `pass` (default `fallback` when it
// is absent); kInvalidArgument when it is not a number.
Result<uint32_t> uint_option(const std::string& pass, const PassOptions& options,
                             const std::string& key, uint32_t fallback);
// kInvalidArgument naming the first key of `options` not in `known`.
Status only_options(const std::string& pass, const PassOptions& options,
                    const std::vector<std::string>& known);

}  // namespace vkad::codegen
