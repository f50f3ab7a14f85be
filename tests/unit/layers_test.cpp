// The folders are layers (docs/architecture.md): each may include only the layers below it, and
// the ones below rhi/ never see Vulkan. This test reads every source file's #include lines.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#ifndef VKAD_SOURCE_DIR
#define VKAD_SOURCE_DIR "."
#endif

namespace {

std::string source_dir() {
  const char* env = std::getenv("VKAD_SOURCE_DIR");
  return env && *env ? env : VKAD_SOURCE_DIR;
}

// Layer -> the project folders its files may include (itself included).
const std::map<std::string, std::set<std::string>>& allowed() {
  static const std::map<std::string, std::set<std::string>> m = {
      {"base", {"base"}},
      {"adstack", {"base", "adstack"}},
      {"abi", {"base", "adstack", "abi"}},
      {"rhi", {"base", "rhi"}},
      // The compiler: ir/ is the floor its three stages share; a stage sees ir/ and never
      // another stage, so each can be read, tested and replaced alone.
      {"ir", {"base", "adstack", "abi", "ir"}},
      {"autodiff", {"base", "adstack", "abi", "ir", "autodiff"}},
      {"spirv", {"base", "adstack", "abi", "ir", "spirv"}},
      {"reference", {"base", "adstack", "abi", "ir", "reference"}},
      // The launch-sequence compiler (fusion, gather recompute, resident loops, the rework and
      // its schedule): passes over captured programs that see kernels as IR, never a device.
      {"graph", {"base", "adstack", "abi", "ir", "graph"}},
      {"runtime", {"base", "adstack", "abi", "rhi", "runtime"}},
      {"api",
       {"base", "adstack", "abi", "rhi", "ir", "autodiff", "spirv", "reference", "graph", "runtime",
        "api"}},
  };
  return m;
}
// Layers that must compile without Vulkan headers.
const std::set<std::string> kNoVulkan = {"base",     "adstack", "abi",       "ir",
                                         "autodiff", "spirv",   "reference", "graph"};
// Forwarding headers kept while branches in flight still include old paths (none now).
const std::set<std::string> kForwarding = {};

TEST(Layers, EachFolderIncludesOnlyTheLayersBelowIt) {
  namespace fs = std::filesystem;
  size_t files = 0;
  std::string violations;
  for (const auto& [layer, ok] : allowed()) {
    const fs::path dir = fs::path(source_dir()) / layer;
    ASSERT_TRUE(fs::is_directory(dir)) << dir;
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string ext = entry.path().extension().string();
      if (ext != ".h" && ext != ".cpp" && ext != ".c") continue;
      const std::string rel = layer + "/" + entry.path().filename().string();
      if (kForwarding.count(rel)) continue;
      ++files;
      std::ifstream in(entry.path());
      std::string line;
      int n = 0;
      while (std::getline(in, line)) {
        ++n;
        if (line.rfind("#include", 0) != 0) continue;
        const size_t q = line.find('"');
        const size_t a = line.find('<');
        if (q != std::string::npos) {
          const std::string inc = line.substr(q + 1, line.find('"', q + 1) - q - 1);
          const size_t slash = inc.find('/');
          if (slash == std::string::npos) continue;  // same-folder or generated
          const std::string target = inc.substr(0, slash);
          if (allowed().count(target) && !ok.count(target)) {
            violations += rel + ":" + std::to_string(n) + " includes " + inc + "\n";
          }
        } else if (a != std::string::npos && kNoVulkan.count(layer)) {
          const std::string inc = line.substr(a + 1, line.find('>', a + 1) - a - 1);
          if (inc.rfind("vulkan/", 0) == 0 || inc == "volk.h") {
            violations +=
                rel + ":" + std::to_string(n) + " includes <" + inc + "> (no Vulkan below rhi/)\n";
          }
        }
      }
    }
  }
  EXPECT_GT(files, 50u);  // the walk found the sources
  EXPECT_TRUE(violations.empty()) << violations;
}

}  // namespace
