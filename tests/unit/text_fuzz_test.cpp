// The text/IR fuzzer as a seeded test: mutations of every kernel text in the tests go through
// parse -> verify -> compile -> make_adjoint -> verify -> compile (tests/fuzz/text_fuzz.h has
// the invariants). VKAD_TEXT_FUZZ_SEED and VKAD_TEXT_FUZZ_COUNT choose the run; the default is
// a few thousand inputs, well under a minute. docs/architecture.md describes longer runs.
#include "fuzz/text_fuzz.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>

namespace vkad::fuzz {
namespace {

// The source tree: $VKAD_SOURCE_DIR where set (a binary carried to another machine, e.g. the GPU
// check), else the tree the test was built from.
std::string source_dir() {
  const char* env = std::getenv("VKAD_SOURCE_DIR");
  return env && *env ? env : VKAD_SOURCE_DIR;
}

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

TEST(TextFuzz, CorpusIsTheTestsKernelTexts) {
  auto corpus = load_corpus(source_dir());
  EXPECT_GE(corpus.size(), 50u);
  // Unmutated, the corpus exercises every stage (many of its kernels verify and differentiate).
  size_t adjoints = 0;
  for (const std::string& text : corpus) {
    auto o = check_text(text);
    ASSERT_TRUE(o.ok()) << o.status().to_string() << "\n--- input ---\n" << text;
    adjoints += o->adjoint;
  }
  EXPECT_GE(adjoints, 10u);
}

TEST(TextFuzz, MutatedKernelsNeverBreakAnInvariant) {
  const uint64_t seed = env_or("VKAD_TEXT_FUZZ_SEED", 20261122);
  const uint64_t count = env_or("VKAD_TEXT_FUZZ_COUNT", 5000);
  auto corpus = load_corpus(source_dir());
  ASSERT_FALSE(corpus.empty());
  std::mt19937_64 rng(seed);
  uint64_t parsed = 0, verified = 0, compiled = 0, adjoints = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const std::string& base =
        corpus[std::uniform_int_distribution<size_t>(0, corpus.size() - 1)(rng)];
    std::string text = mutate(base, rng);
    auto o = check_text(text);
    ASSERT_TRUE(o.ok()) << "input " << i << " of seed " << seed << ": " << o.status().to_string()
                        << "\n--- input ---\n"
                        << text;
    parsed += o->parsed;
    verified += o->verified;
    compiled += o->compiled;
    adjoints += o->adjoint;
  }
  std::printf(
      "text fuzz, seed %llu: %llu inputs, %llu parsed, %llu verified and compiled, %llu adjoints "
      "compiled\n",
      static_cast<unsigned long long>(seed), static_cast<unsigned long long>(count),
      static_cast<unsigned long long>(parsed), static_cast<unsigned long long>(compiled),
      static_cast<unsigned long long>(adjoints));
  // The mutations must leave enough valid kernels to reach the emitter and reverse mode.
  EXPECT_GE(verified, count / 20);
  EXPECT_GE(adjoints, count / 40);
}

}  // namespace
}  // namespace vkad::fuzz
