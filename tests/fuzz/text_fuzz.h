// The text/IR fuzzer's core, shared by the seeded unit test (tests/unit/text_fuzz_test.cpp) and
// the libFuzzer target (tests/fuzz/text_fuzzer.cpp, built with clang and VKAD_BUILD_FUZZERS).
//
// One input runs the whole front end: parse -> verify -> compile -> make_adjoint -> verify ->
// compile. Rejections (parse errors, verifier errors, reverse-mode rejections) are fine; what
// check_text reports is a broken invariant:
//   - a kernel that verifies but does not compile (e.g. emitted SPIR-V fails validation);
//   - an adjoint of a verified kernel that does not verify or does not compile;
//   - print(parse(text)) that does not parse back to the same text;
//   - an error that is not kInvalidArgument / kUnsupported where the input is at fault.
// A crash, a hang or a sanitizer report is a finding of the harness around it.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/status.h"
#include "ir/target.h"

namespace vkad::fuzz {

// Every kernel text in the repository's tests (raw strings starting `R"(kernel ` and the
// kernel files tests/kernels/*.vkir) under `source_dir`/tests: the fuzzer's seeds, so new test
// kernels become seeds by themselves.
std::vector<std::string> load_corpus(const std::string& source_dir);

// 1 to 4 byte- or token-level mutations of `text` (see text_fuzz.cpp for the kinds).
std::string mutate(const std::string& text, std::mt19937_64& rng);

// What happened to one input (for statistics), or a broken invariant as kInternal with the
// stage named.
struct Outcome {
  bool parsed = false, verified = false, compiled = false, adjoint = false;
};
Result<Outcome> check_text(const std::string& text, const codegen::Target& target = {});

}  // namespace vkad::fuzz
