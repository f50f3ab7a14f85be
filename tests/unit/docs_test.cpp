// The README's embedding example is examples/embedding.cpp, verbatim (ctest also builds and
// runs that file), so the docs cannot rot.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace {

// The source tree: $VKAD_SOURCE_DIR where set (a binary carried to another machine, e.g. the GPU
// check), else the tree the test was built from.
std::string source_dir() {
  const char* env = std::getenv("VKAD_SOURCE_DIR");
  return env && *env ? env : VKAD_SOURCE_DIR;
}

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(Docs, ReadmeEmbeddingExampleIsExamplesEmbeddingCpp) {
  std::string readme = read(source_dir() + "/README.md");
  std::string code = read(source_dir() + "/examples/embedding.cpp");
  ASSERT_FALSE(code.empty());
  const std::string begin = "<!-- embedding-example: examples/embedding.cpp -->\n```cpp\n";
  size_t at = readme.find(begin);
  ASSERT_NE(at, std::string::npos) << "README lacks the embedding example marker";
  size_t start = at + begin.size();
  size_t end = readme.find("```\n", start);
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(readme.substr(start, end - start), code)
      << "README.md's embedding example differs from examples/embedding.cpp; copy it over";
}

}  // namespace
