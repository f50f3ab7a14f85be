// Kernels as files with CHECK lines (tests/kernels/*.vkir), one gtest case per file.
//
// A .vkir file is a kernel in the IR's text form (ir/text.h, where `//` starts a comment)
// plus directives in comment lines:
//   // RUN: <pipeline>      exactly one; the passes to run on parse(file), by their registered
//                          names (autodiff/passes.h), comma-separated, each with optional
//                          {key=value} options: `verify, lower-jumps, adjoint{segment=4}`.
//                          The pipeline verifies after every pass (a pass whose output does not
//                          verify fails the case, naming it). The output is print(result).
//   // RUN: not <pipeline>  the pipeline must fail, in its last pass (a failure earlier is a
//                          RUN failure naming that pass): the output is the status,
//                          "CODE: message".
//   // CHECK: <s>           substring s occurs after the previous match
//   // CHECK-NEXT: <s>      s occurs on the line right after the previous match's line
//   // CHECK-NOT: <s>       s does not occur between the previous match and the next one (or
//                          the end of the output)
//   // CHECK-ABSENT: <s>    s occurs nowhere in the output
// An unknown pass name or option is a failure of the case (the message lists the known
// passes). Patterns are plain substrings (no regexes), leading and trailing blanks trimmed. A
// failure names the file, the directive's line and the output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "autodiff/passes.h"
#include "ir/pass.h"
#include "ir/text.h"
#include "support/file_check.h"

namespace vkad::codegen {
namespace {

using test::CheckFile;
using test::Directive;
using test::match;
using test::parse_directives;
using test::trim;

// The output of the RUN line's pipeline on the kernel text, or a failure message starting
// with "RUN failed".
std::string run_pipeline(const std::string& run, const std::string& text, bool* ok) {
  *ok = false;
  std::string spec = run;
  const bool expect_failure = spec.rfind("not ", 0) == 0;
  if (expect_failure) spec = trim(spec.substr(4));
  auto pipeline = compiler_passes().parse_pipeline(spec, Target::host());
  if (!pipeline.ok()) return "RUN failed: " + pipeline.status().to_string();
  pipeline->set_verify_each(true);  // the test harness verifies after every pass
  auto k = parse(text);
  if (!k.ok()) return "RUN failed: the kernel does not parse: " + k.status().to_string();
  std::string failed;
  auto out = pipeline->run(*k, &failed);
  const std::string last = pipeline->names().back();
  if (expect_failure) {
    if (out.ok()) return "RUN failed: the pipeline succeeded; its result:\n" + print(*out);
    if (failed != last) {
      return "RUN failed: pass '" + failed + "' failed before '" + last +
             "': " + out.status().to_string();
    }
    *ok = true;
    return out.status().to_string();
  }
  if (!out.ok()) return "RUN failed: pass '" + failed + "': " + out.status().to_string();
  *ok = true;
  return print(*out);
}

// The source tree: $VKAD_SOURCE_DIR where set (a binary carried to another machine, e.g. the GPU
// check), else the tree the test was built from.
std::string source_dir() { return test::source_dir(VKAD_SOURCE_DIR); }
std::vector<std::string> kernel_files() { return test::files_in(source_dir(), "kernels", ".vkir"); }

// ---- the runner's own behaviour -----------------------------------------------------------

std::string check_text(const std::string& output, const std::string& directives) {
  CheckFile f = parse_directives("// RUN: verify\n" + directives);
  if (!f.error.empty()) return "directives: " + f.error;
  return match(output, f.checks);
}

TEST(VkirCheckRunner, MatchesInOrderAndReportsTheFailingLine) {
  const std::string out = "alpha\nbeta gamma\ndelta\n";
  EXPECT_EQ(check_text(out, "// CHECK: alpha\n// CHECK: gamma\n// CHECK: delta\n"), "");
  // Out of order: alpha after gamma is not found.
  std::string e = check_text(out, "// CHECK: gamma\n// CHECK: alpha\n");
  EXPECT_NE(e.find("line 3: CHECK: 'alpha' not found"), std::string::npos) << e;
}

TEST(VkirCheckRunner, CheckNextWantsTheVeryNextLine) {
  const std::string out = "alpha\nbeta\ngamma\n";
  EXPECT_EQ(check_text(out, "// CHECK: alpha\n// CHECK-NEXT: beta\n// CHECK-NEXT: gamma\n"), "");
  std::string e = check_text(out, "// CHECK: alpha\n// CHECK-NEXT: gamma\n");
  EXPECT_NE(e.find("CHECK-NEXT: 'gamma' not found on the next line"), std::string::npos) << e;
  // CHECK-NEXT without a CHECK before it is a malformed file, not a pass.
  EXPECT_NE(check_text(out, "// CHECK-NEXT: alpha\n").find("must follow"), std::string::npos);
}

TEST(VkirCheckRunner, CheckNotIsScopedBetweenMatchesAndAbsentIsGlobal) {
  const std::string out = "alpha\nbeta\ngamma\nbeta\n";
  // beta lies between alpha and gamma.
  std::string e = check_text(out, "// CHECK: alpha\n// CHECK-NOT: beta\n// CHECK: gamma\n");
  EXPECT_NE(e.find("CHECK-NOT: 'beta' found"), std::string::npos) << e;
  // After gamma there is a beta too; a NOT at the end looks there.
  e = check_text(out, "// CHECK: gamma\n// CHECK-NOT: beta\n");
  EXPECT_NE(e.find("CHECK-NOT: 'beta' found"), std::string::npos) << e;
  // Nothing between beta and gamma: passes.
  EXPECT_EQ(check_text(out, "// CHECK: beta\n// CHECK-NOT: alpha\n// CHECK: gamma\n"), "");
  EXPECT_EQ(check_text(out, "// CHECK-ABSENT: delta\n// CHECK: alpha\n"), "");
  e = check_text(out, "// CHECK: gamma\n// CHECK-ABSENT: alpha\n");
  EXPECT_NE(e.find("CHECK-ABSENT: 'alpha' occurs"), std::string::npos) << e;
}

TEST(VkirCheckRunner, MalformedFilesFail) {
  EXPECT_NE(parse_directives("// CHECK: x\n").error.find("no RUN line"), std::string::npos);
  EXPECT_NE(parse_directives("// RUN: verify\n").error.find("no CHECK lines"), std::string::npos);
  EXPECT_NE(
      parse_directives("// RUN: verify\n// CHECK-NXT: x\n").error.find("line 2: unknown directive"),
      std::string::npos);
  EXPECT_NE(
      parse_directives("// RUN: verify\n// RUN: adjoint\n// CHECK: x\n").error.find("second RUN"),
      std::string::npos);
}

TEST(VkirCheckRunner, UnknownPassOrOptionFails) {
  bool ok = true;
  std::string e = run_pipeline("verify, adjiont", "kernel k() {\n}\n", &ok);
  EXPECT_NE(e.find("RUN failed"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown pass 'adjiont'"), std::string::npos) << e;
  EXPECT_NE(e.find("adjoint"), e.find("adjiont")) << e;  // the known names are listed
  EXPECT_FALSE(ok);
  e = run_pipeline("adjoint{segmnet=4}", "kernel k() {\n}\n", &ok);
  EXPECT_NE(e.find("pass 'adjoint' has no option 'segmnet'"), std::string::npos) << e;
  EXPECT_FALSE(ok);
  e = run_pipeline("adjoint{segment=1}", "kernel k() {\n}\n", &ok);
  EXPECT_NE(e.find("checkpoint_segment is 1"), std::string::npos) << e;
  EXPECT_FALSE(ok);
  e = run_pipeline("verify,", "kernel k() {\n}\n", &ok);
  EXPECT_NE(e.find("pass 2 has no name"), std::string::npos) << e;
  EXPECT_FALSE(ok);
}

// `not` wants the last pass to fail: a kernel refused earlier (here by verify, before the
// adjoint is tried) is a failure of the case, not a pass.
TEST(VkirCheckRunner, NotWantsTheLastPassToFail) {
  const char* bad =
      "kernel k(x: ndarray<f32, 1>) {\n  task main parallel %0 in [0, 4) {\n"
      "    %1 = add %9, %9 : f32\n  }\n}\n";
  bool ok = true;
  std::string e = run_pipeline("not verify, adjoint", bad, &ok);
  EXPECT_FALSE(ok);
  EXPECT_NE(e.find("pass 'verify' failed before 'adjoint'"), std::string::npos) << e;
  e = run_pipeline("not verify", bad, &ok);
  EXPECT_TRUE(ok) << e;
  EXPECT_NE(e.find("invalid argument"), std::string::npos) << e;
  const char* good =
      "kernel k(x: ndarray<f32, 1>) {\n  task main parallel %0 in [0, 4) {\n"
      "    %1 = const 1 : f32\n    store x[%0], %1\n  }\n}\n";
  e = run_pipeline("not verify", good, &ok);
  EXPECT_FALSE(ok);
  EXPECT_NE(e.find("the pipeline succeeded"), std::string::npos) << e;
}

// The pipeline (ir/pass.h) names the pass whose output does not verify.
TEST(VkirCheckRunner, PipelineNamesThePassThatBrokeTheKernel) {
  auto k = parse(
      "kernel k(x: ndarray<f32, 1>) {\n  task main parallel %0 in [0, 4) {\n"
      "    %1 = const 1 : f32\n    store x[%0], %1\n  }\n}\n");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  Pipeline p;
  p.set_verify_each(true);
  p.add(verify_pass(Target::host()));
  p.add("drop-a-definition", [](Kernel in) -> Result<Kernel> {
    in.tasks[0].body.stmts.erase(in.tasks[0].body.stmts.begin());  // the const the store uses
    return in;
  });
  std::string failed;
  auto out = p.run(*k, &failed);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(failed, "drop-a-definition");
  EXPECT_EQ(out.status().code(), ErrorCode::kInternal);
  EXPECT_NE(out.status().message().find("pass 'drop-a-definition' on kernel 'k' produced a kernel "
                                        "that does not verify"),
            std::string::npos)
      << out.status().to_string();
  // Without verify_each the broken kernel comes out (release builds trust the passes).
  p.set_verify_each(false);
  EXPECT_TRUE(p.run(*k).ok());
}

TEST(VkirCheckRunner, FindsTheKernelFiles) {
  // A wrong source dir or an emptied folder would otherwise run zero cases and pass.
  // VKAD_KERNEL_FILES: how many the build saw (tests/CMakeLists.txt).
  EXPECT_EQ(kernel_files().size(), size_t{VKAD_KERNEL_FILES}) << source_dir();
  EXPECT_GE(kernel_files().size(), 10u) << source_dir();
}

// ---- one case per tests/kernels/*.vkir ---------------------------------------------------

class VkirFile : public ::testing::TestWithParam<std::string> {};

TEST_P(VkirFile, Checks) {
  const std::string& path = GetParam();
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  CheckFile f = parse_directives(ss.str());
  ASSERT_EQ(f.error, "") << path;
  bool ok = false;
  std::string output = run_pipeline(f.run, ss.str(), &ok);
  ASSERT_TRUE(ok) << path << ": " << output;
  std::string failure = match(output, f.checks);
  EXPECT_EQ(failure, "") << path << ":" << failure << "\n--- output (RUN: " << f.run << ") ---\n"
                         << output;
}

std::string case_name(const ::testing::TestParamInfo<std::string>& info) {
  return test::case_name_of(info.param);
}

INSTANTIATE_TEST_SUITE_P(Kernels, VkirFile, ::testing::ValuesIn(kernel_files()), case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(VkirFile);

}  // namespace
}  // namespace vkad::codegen
