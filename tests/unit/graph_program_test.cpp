// The launch-sequence pass contract (graph/program.h): the registry and pipeline text, and
// programs as files with CHECK lines (tests/programs/*.vkprog), one gtest case per file.
//
// A .vkprog file is a program in text (graph/program_text.h) plus directives in comment lines:
//   // RUN: <pipeline>       exactly one: the graph passes to run, as SessionOptions::
//                           graph_passes writes them ("rename, roll, block, recompute, prune,
//                           schedule, fuse"; "none" for no pass)
//   // LIMITS: k=v, ...     optional: loop-passes=N (the device cuts loops past N passes, as
//                           lavapipe does; default 0, none), local-size=N (default 1024),
//                           bounds-checks=0|1 (default 1), storage-buffers=N (one pipeline
//                           binds; default 0, not known: the 32 push descriptors)
//   // CHECK...: as in tests/kernels/*.vkir (tests/support/file_check.h)
// The output is a summary line and the plan, one step a line as the install records it:
//   changed: yes | no; merged 8 (blocked 0), recomputed 0, reordered 0, relaxed 1, fused 0
//   launch fused_scale_x2#1001(x, y, z)
//   dropped fill y 0
// (graph/program.h, print_plan; kernels the passes made have ids from 1001 on, stashes are
// `stash0`, ...). No device: the sink only names the kernels it is given, so these files test
// what the passes decide, and the GPU tests what the decided kernels compute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "graph/graph_passes.h"
#include "graph/program.h"
#include "graph/program_text.h"
#include "ir/text.h"
#include "support/file_check.h"

namespace vkad {
namespace {

using test::CheckFile;
using test::match;
using test::parse_directives;
using test::trim;

// Names the kernels it is given (once per printed IR, as the session's sink compiles them) and
// notes them in the catalog; `refuse` makes it fail kernels whose name starts with it.
class NamingSink final : public KernelSink {
 public:
  explicit NamingSink(KernelCatalog& catalog) : catalog_(catalog) {}
  std::vector<Result<KernelHandle>> make(std::span<const codegen::Kernel> ks,
                                         bool keep_ir) override {
    std::vector<Result<KernelHandle>> out;
    for (const codegen::Kernel& k : ks) {
      if (!refuse.empty() && k.name.rfind(refuse, 0) == 0) {
        out.push_back(make_error(ErrorCode::kInvalidArgument, "refused " + k.name));
        continue;
      }
      const std::string key = std::to_string(keep_ir) + codegen::print(k);
      auto [it, fresh] = made_.try_emplace(key, KernelHandle{next_});
      if (fresh) {
        ++next_;
        names[it->second.id] = k.name;
        if (keep_ir) {
          catalog_.add(it->second.id, k, false);
        } else {
          catalog_.add_access(it->second.id, k, false);
        }
      }
      out.push_back(it->second);
    }
    return out;
  }
  std::map<uint64_t, std::string> names;
  std::string refuse;

 private:
  KernelCatalog& catalog_;
  std::map<std::string, KernelHandle> made_;
  uint64_t next_ = 1001;
};

struct Limits {
  ProgramTarget target;
  std::string error;
};

Limits parse_limits(const std::string& contents) {
  Limits out;
  std::istringstream in(contents);
  for (std::string line; std::getline(in, line);) {
    std::string t = trim(line);
    if (t.rfind("// LIMITS:", 0) != 0) continue;
    std::stringstream items(t.substr(10));
    for (std::string item; std::getline(items, item, ',');) {
      const size_t eq = item.find('=');
      const std::string key = trim(item.substr(0, eq));
      const uint32_t v =
          eq == std::string::npos
              ? 0
              : static_cast<uint32_t>(std::strtoul(item.c_str() + eq + 1, nullptr, 10));
      if (key == "loop-passes") {
        out.target.max_loop_passes = v;
      } else if (key == "local-size") {
        out.target.max_local_size = v;
      } else if (key == "bounds-checks") {
        out.target.bounds_checks = v != 0;
      } else if (key == "storage-buffers") {
        out.target.max_storage_buffers = v;
      } else {
        out.error = "unknown LIMITS key '" + key + "'";
      }
    }
  }
  return out;
}

// The RUN line's pipeline over the program, as the summary line and the plan, or a failure
// message starting with "RUN failed".
std::string run_program(const std::string& run, const std::string& contents,
                        const ProgramTarget& target, bool* ok, const std::string& refuse = "") {
  *ok = false;
  Result<GraphPipeline> pipeline =
      GraphPassRegistry::standard().parse(run == "none" ? std::string() : run);
  if (!pipeline.ok()) return "RUN failed: " + pipeline.status().to_string();
  Result<ProgramText> text = parse_program(contents);
  if (!text.ok()) return "RUN failed: " + text.status().to_string();
  KernelCatalog catalog;
  for (size_t k = 0; k < text->kernels.size(); ++k) catalog.add(k + 1, text->kernels[k], false);
  NamingSink sink(catalog);
  sink.refuse = refuse;
  for (size_t k = 0; k < text->kernels.size(); ++k) sink.names[k + 1] = text->kernels[k].name;
  const std::vector<ProgramText::Array>& arrays = text->arrays;
  PassContext ctx(
      catalog, sink, target,
      [&](uint64_t id) -> const std::vector<uint32_t>* {
        return id >= 1 && id <= arrays.size() ? &arrays[id - 1].extents : nullptr;
      },
      [&](uint64_t id) -> std::optional<runtime::DType> {
        if (id >= 1 && id <= arrays.size()) return arrays[id - 1].dtype;
        return std::nullopt;
      });
  Program p = Program::of(text->steps);
  if (!pipeline->run(p, ctx)) return "RUN failed: a pass kept the program as captured";
  std::map<uint64_t, size_t> stash_number;
  for (const StashNeed& s : p.stashes) stash_number.emplace(s.placeholder, stash_number.size());
  auto array_name = [&](uint64_t id) -> std::string {
    if (id >= 1 && id <= arrays.size()) return arrays[id - 1].name;
    auto it = stash_number.find(id);
    return it != stash_number.end() ? "stash" + std::to_string(it->second)
                                    : "a" + std::to_string(id);
  };
  auto kernel_name = [&](uint64_t id) {
    return sink.names[id] + (id > 1000 ? "#" + std::to_string(id) : "");
  };
  const size_t merged = static_cast<size_t>(std::count(p.merged.begin(), p.merged.end(), true));
  std::ostringstream out;
  out << "changed: " << (p.changed() ? "yes" : "no") << "; merged " << merged << " (blocked "
      << p.blocked << ", dropped " << p.dropped << "), renamed " << p.renamed << ", recomputed "
      << p.recompute_pins.size() / 2 << ", reordered " << p.reordered << ", relaxed " << p.relaxed
      << ", fused " << p.fused << ", sliced " << p.sliced << ", hoisted " << p.hoisted << "\n";
  out << print_plan(p.w, kernel_name, array_name);
  *ok = true;
  return out.str();
}

std::string source_dir() { return test::source_dir(VKAD_SOURCE_DIR); }
std::vector<std::string> program_files() {
  return test::files_in(source_dir(), "programs", ".vkprog");
}
using test::read_file;

// ---- the registry and the pipeline text ----------------------------------------------------

TEST(GraphPipeline, TheDefaultTextParsesAndPrintsBack) {
  Result<GraphPipeline> p = GraphPassRegistry::standard().parse(kDefaultGraphPipeline);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->text(), "rename, roll, block, recompute, prune, slice, hoist, schedule, fuse");
  EXPECT_EQ(p->names(), (std::vector<std::string>{"rename", "roll", "block", "recompute", "prune",
                                                  "slice", "hoist", "schedule", "fuse"}));
  Result<GraphPipeline> q =
      GraphPassRegistry::standard().parse("roll{max-range=64}, block{shared=49152, min-tiles=4}");
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->text(), "roll{max-range=64}, block{shared=49152, min-tiles=4}");
  EXPECT_EQ(roll_max_range(*q), 64u);
  EXPECT_EQ(roll_max_range(*GraphPassRegistry::standard().parse("fuse")), 0u);
  EXPECT_EQ(GraphPassRegistry::standard().parse("")->names().size(), 0u);
}

TEST(GraphPipeline, BadTextIsRefusedNamingWhatIsWrong) {
  const GraphPassRegistry& r = GraphPassRegistry::standard();
  auto message = [&](const std::string& text) {
    Result<GraphPipeline> p = r.parse(text);
    EXPECT_FALSE(p.ok()) << text;
    EXPECT_EQ(p.status().code(), ErrorCode::kInvalidArgument) << text;
    return p.status().message();
  };
  EXPECT_NE(message("roll, fusion")
                .find("unknown pass 'fusion' (known: block, fuse, hoist, prune, recompute, "
                      "rename, roll, schedule, slice)"),
            std::string::npos);
  EXPECT_NE(message("fuse, fuse").find("pass 'fuse' appears twice"), std::string::npos);
  EXPECT_NE(message("fuse, schedule").find("'schedule' must come before 'fuse'"),
            std::string::npos);
  EXPECT_NE(message("recompute, roll").find("'roll' must come before 'recompute'"),
            std::string::npos);
  EXPECT_NE(message("roll{range=3}").find("pass 'roll' has no option 'range'"), std::string::npos);
  EXPECT_NE(message("roll{max-range=x}").find("is not an unsigned number"), std::string::npos);
  EXPECT_NE(message("schedule{x=1}").find("(it takes none)"), std::string::npos);
  EXPECT_NE(message("roll, {").find("'{' without its '}'"), std::string::npos);
}

TEST(GraphPipeline, APassThatCannotMakeItsKernelKeepsTheProgramAsCaptured) {
  // Two element-wise launches fuse; with the fused kernel refused the program stays as it was.
  const std::string text = read_file(source_dir() + "/tests/programs/fuse_a_chain.vkprog");
  bool ok = false;
  std::string out = run_program("schedule, fuse", text, ProgramTarget{}, &ok);
  ASSERT_TRUE(ok) << out;
  EXPECT_NE(out.find("launch fused_"), std::string::npos) << out;
  out = run_program("schedule, fuse", text, ProgramTarget{}, &ok, "fused_");
  EXPECT_FALSE(ok);
  EXPECT_NE(out.find("kept the program as captured"), std::string::npos) << out;
}

TEST(GraphProgramText, ErrorsNameTheLine) {
  auto message = [](const std::string& text) {
    Result<ProgramText> p = parse_program(text);
    EXPECT_FALSE(p.ok()) << text;
    return p.status().message();
  };
  EXPECT_NE(message("array x: f32[4]\nlaunch nope(x)\n").find("line 2: no kernel 'nope' above"),
            std::string::npos);
  EXPECT_NE(message("array x: q8[4]\n").find("line 1: unknown dtype"), std::string::npos);
  EXPECT_NE(message("fill y 0\n").find("line 1: no array 'y' above"), std::string::npos);
  EXPECT_NE(message("kernel k(x: ndarray<f32, 1>) {\n").find("no closing '}'"), std::string::npos);
  EXPECT_NE(message("array x: f32[4]\nkernel k(x: ndarray<f32, 1>) {\n}\nlaunch k(x, 1)\n")
                .find("line 4: 'k' takes 1 arguments, got 2"),
            std::string::npos);
  EXPECT_NE(message("jump x\n").find("expected kernel, array, launch or fill"), std::string::npos);
}

TEST(GraphProgramFiles, AreFound) {
  // A wrong source dir or an emptied folder would otherwise run zero cases and pass.
  EXPECT_EQ(program_files().size(), size_t{VKAD_PROGRAM_FILES}) << source_dir();
  EXPECT_GE(program_files().size(), 5u) << source_dir();
}

// ---- one case per tests/programs/*.vkprog --------------------------------------------------

class ProgramFile : public ::testing::TestWithParam<std::string> {};

TEST_P(ProgramFile, Checks) {
  const std::string& path = GetParam();
  const std::string contents = read_file(path);
  ASSERT_FALSE(contents.empty()) << "cannot read " << path;
  CheckFile f = parse_directives(contents);
  ASSERT_EQ(f.error, "") << path;
  Limits limits = parse_limits(contents);
  ASSERT_EQ(limits.error, "") << path;
  bool ok = false;
  const std::string output = run_program(f.run, contents, limits.target, &ok);
  ASSERT_TRUE(ok) << path << ": " << output;
  const std::string failure = match(output, f.checks);
  EXPECT_EQ(failure, "") << path << ":" << failure << "\n--- output (RUN: " << f.run << ") ---\n"
                         << output;
}

std::string case_name(const ::testing::TestParamInfo<std::string>& info) {
  return test::case_name_of(info.param);
}

INSTANTIATE_TEST_SUITE_P(Programs, ProgramFile, ::testing::ValuesIn(program_files()), case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ProgramFile);

}  // namespace
}  // namespace vkad
