// Kernels as files with CHECK lines (tests/kernels/*.vkir), one gtest case per file.
//
// A .vkir file is a kernel in the IR's text form (ir/text.h, where `//` starts a comment)
// plus directives in comment lines:
//   // RUN: <mode>        exactly one; what the output is:
//        print            print(parse(file)) (and print(parse(print)) must be the same text)
//        verify-error     verify() must fail: its status, "CODE: message"
//        adjoint          verify(), make_adjoint() and verify(adjoint) must pass: print(adjoint)
//        adjoint-error    make_adjoint() must fail: its status, "CODE: message"
//   // CHECK: <s>         substring s occurs after the previous match
//   // CHECK-NEXT: <s>    s occurs on the line right after the previous match's line
//   // CHECK-NOT: <s>     s does not occur between the previous match and the next one (or the
//                         end of the output)
//   // CHECK-ABSENT: <s>  s occurs nowhere in the output
// Patterns are plain substrings (no regexes), leading and trailing blanks trimmed. A failure
// names the file, the directive's line and the output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "ir/verifier.h"

namespace vkad::codegen {
namespace {

struct Directive {
  enum class Kind { kCheck, kNext, kNot, kAbsent } kind;
  std::string pattern;
  int line;  // 1-based, in the .vkir file
};

struct CheckFile {
  std::string run;
  std::vector<Directive> checks;
  std::string error;  // a malformed directive, naming its line
};

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

CheckFile parse_directives(const std::string& contents) {
  static const std::pair<const char*, Directive::Kind> kPrefixes[] = {
      {"CHECK:", Directive::Kind::kCheck},
      {"CHECK-NEXT:", Directive::Kind::kNext},
      {"CHECK-NOT:", Directive::Kind::kNot},
      {"CHECK-ABSENT:", Directive::Kind::kAbsent}};
  CheckFile f;
  std::istringstream in(contents);
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    std::string t = trim(line);
    if (t.rfind("//", 0) != 0) continue;
    t = trim(t.substr(2));
    auto fail = [&](const std::string& what) {
      if (f.error.empty()) f.error = "line " + std::to_string(n) + ": " + what;
    };
    if (t.rfind("RUN:", 0) == 0) {
      if (!f.run.empty()) fail("a second RUN line");
      f.run = trim(t.substr(4));
      continue;
    }
    if (t.rfind("CHECK", 0) != 0) continue;  // an ordinary comment
    bool known = false;
    for (const auto& [prefix, kind] : kPrefixes) {
      std::string p = prefix;
      if (t.rfind(p, 0) != 0) continue;
      known = true;
      std::string pattern = trim(t.substr(p.size()));
      if (pattern.empty()) fail(p + " with an empty pattern");
      if (kind == Directive::Kind::kNext &&
          (f.checks.empty() || (f.checks.back().kind != Directive::Kind::kCheck &&
                                f.checks.back().kind != Directive::Kind::kNext))) {
        fail("CHECK-NEXT must follow a CHECK or CHECK-NEXT");
      }
      f.checks.push_back({kind, pattern, n});
    }
    // A misspelt directive (CHECK-NXT:, CHECK without a colon) must not pass silently.
    if (!known) fail("unknown directive '" + t + "'");
  }
  if (f.run.empty()) f.error = f.error.empty() ? "no RUN line" : f.error;
  if (f.checks.empty() && f.error.empty()) f.error = "no CHECK lines";
  return f;
}

// "" when `output` satisfies the directives in order, else what failed.
std::string match(const std::string& output, const std::vector<Directive>& checks) {
  auto at_line = [](const Directive& d) { return "line " + std::to_string(d.line) + ": "; };
  size_t pos = 0;
  bool matched = false;
  std::vector<const Directive*> pending_not;
  auto check_nots = [&](size_t end) -> std::string {
    for (const Directive* d : pending_not) {
      size_t found = output.find(d->pattern, pos);
      if (found != std::string::npos && found + d->pattern.size() <= end) {
        return at_line(*d) + "CHECK-NOT: '" + d->pattern + "' found at offset " +
               std::to_string(found);
      }
    }
    pending_not.clear();
    return "";
  };
  for (const Directive& d : checks) {
    switch (d.kind) {
      case Directive::Kind::kAbsent:
        if (output.find(d.pattern) != std::string::npos) {
          return at_line(d) + "CHECK-ABSENT: '" + d.pattern + "' occurs in the output";
        }
        break;
      case Directive::Kind::kNot: pending_not.push_back(&d); break;
      case Directive::Kind::kCheck:
      case Directive::Kind::kNext: {
        size_t from = pos, limit = output.size();
        if (d.kind == Directive::Kind::kNext) {
          size_t nl = matched ? output.find('\n', pos) : std::string::npos;
          if (nl == std::string::npos)
            return at_line(d) + "CHECK-NEXT: no line after the previous match";
          from = nl + 1;
          limit = std::min(output.find('\n', from), output.size());
        }
        size_t found = output.find(d.pattern, from);
        if (found == std::string::npos || found + d.pattern.size() > limit) {
          return at_line(d) + (d.kind == Directive::Kind::kNext ? "CHECK-NEXT: '" : "CHECK: '") +
                 d.pattern + "' not found " +
                 (d.kind == Directive::Kind::kNext ? "on the next line"
                                                   : "after offset " + std::to_string(pos));
        }
        if (std::string e = check_nots(found); !e.empty()) return e;
        pos = found + d.pattern.size();
        matched = true;
        break;
      }
    }
  }
  return check_nots(output.size());
}

// The output of `mode` on the kernel text, or a failure message starting with "RUN failed".
std::string run_mode(const std::string& mode, const std::string& text, bool* ok) {
  *ok = false;
  auto k = parse(text);
  if (!k.ok()) return "RUN failed: the kernel does not parse: " + k.status().to_string();
  if (mode == "print") {
    std::string printed = print(*k);
    auto again = parse(printed);
    if (!again.ok())
      return "RUN failed: the printed kernel does not parse: " + again.status().to_string();
    if (print(*again) != printed) return "RUN failed: print(parse(print(k))) differs from print(k)";
    *ok = true;
    return printed;
  }
  if (mode == "verify-error") {
    Status s = verify(*k);
    if (s.ok()) return "RUN failed: verify() accepted the kernel";
    *ok = true;
    return s.to_string();
  }
  if (mode == "adjoint" || mode == "adjoint-error") {
    if (Status s = verify(*k); !s.ok())
      return "RUN failed: the forward kernel does not verify: " + s.to_string();
    auto a = make_adjoint(*k);
    if (mode == "adjoint-error") {
      if (a.ok())
        return "RUN failed: make_adjoint() accepted the kernel; its adjoint:\n" + print(*a);
      *ok = true;
      return a.status().to_string();
    }
    if (!a.ok()) return "RUN failed: make_adjoint(): " + a.status().to_string();
    if (Status s = verify(*a); !s.ok())
      return "RUN failed: the adjoint does not verify: " + s.to_string() + "\n" + print(*a);
    *ok = true;
    return print(*a);
  }
  return "RUN failed: unknown mode '" + mode + "' (print, verify-error, adjoint, adjoint-error)";
}

// The source tree: $VKAD_SOURCE_DIR where set (a binary carried to another machine, e.g. the GPU
// check), else the tree the test was built from.
std::string source_dir() {
  const char* env = std::getenv("VKAD_SOURCE_DIR");
  return env && *env ? env : VKAD_SOURCE_DIR;
}

std::vector<std::string> kernel_files() {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(source_dir()) / "tests" / "kernels", ec)) {
    if (e.path().extension() == ".vkir") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---- the runner's own behaviour -----------------------------------------------------------

std::string check_text(const std::string& output, const std::string& directives) {
  CheckFile f = parse_directives("// RUN: print\n" + directives);
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
  EXPECT_NE(parse_directives("// RUN: print\n").error.find("no CHECK lines"), std::string::npos);
  EXPECT_NE(
      parse_directives("// RUN: print\n// CHECK-NXT: x\n").error.find("line 2: unknown directive"),
      std::string::npos);
  EXPECT_NE(
      parse_directives("// RUN: print\n// RUN: adjoint\n// CHECK: x\n").error.find("second RUN"),
      std::string::npos);
  bool ok = true;
  EXPECT_NE(run_mode("adjiont", "kernel k() {\n}\n", &ok).find("unknown mode 'adjiont'"),
            std::string::npos);
  EXPECT_FALSE(ok);
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
  std::string output = run_mode(f.run, ss.str(), &ok);
  ASSERT_TRUE(ok) << path << ": " << output;
  std::string failure = match(output, f.checks);
  EXPECT_EQ(failure, "") << path << ":" << failure << "\n--- output (RUN: " << f.run << ") ---\n"
                         << output;
}

std::string case_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string stem = std::filesystem::path(info.param).stem().string();
  for (char& c : stem) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return stem;
}

INSTANTIATE_TEST_SUITE_P(Kernels, VkirFile, ::testing::ValuesIn(kernel_files()), case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(VkirFile);

}  // namespace
}  // namespace vkad::codegen
