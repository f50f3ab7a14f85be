// libFuzzer target over the text/IR front end (tests/fuzz/text_fuzz.h has the invariants).
// Built with clang when VKAD_BUILD_FUZZERS=ON; docs/architecture.md ("Fuzzing") has the run.
//
//   VKAD_FUZZ_WRITE_CORPUS=DIR  writes the tests' kernel texts into DIR as seeds first.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "fuzz/text_fuzz.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("VKAD_FUZZ_WRITE_CORPUS")) {
    auto corpus = vkad::fuzz::load_corpus(VKAD_SOURCE_DIR);
    for (size_t i = 0; i < corpus.size(); ++i) {
      std::ofstream(std::string(dir) + "/seed_" + std::to_string(i) + ".txt") << corpus[i];
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto o = vkad::fuzz::check_text(text);
  if (!o.ok()) {
    std::fprintf(stderr, "%s\n--- input ---\n%s\n", o.status().to_string().c_str(), text.c_str());
    std::abort();  // libFuzzer saves the input as a crash artifact
  }
  return 0;
}
