// CHECK-directive files (tests/kernels/*.vkir, tests/programs/*.vkprog): a text with `// RUN:`
// and `// CHECK...:` lines, and the matching of an output against the CHECK lines.
//   // RUN: <pipeline>      exactly one (what the file's runner runs)
//   // CHECK: <s>           substring s occurs after the previous match
//   // CHECK-NEXT: <s>      s occurs on the line right after the previous match's line
//   // CHECK-NOT: <s>       s does not occur between the previous match and the next one (or
//                          the end of the output)
//   // CHECK-ABSENT: <s>    s occurs nowhere in the output
// Patterns are plain substrings (no regexes), leading and trailing blanks trimmed; an unknown
// CHECK directive, a second RUN line or no CHECK line is a malformed file (CheckFile::error).
#pragma once

#include <string>
#include <vector>

namespace vkad::test {

struct Directive {
  enum class Kind { kCheck, kNext, kNot, kAbsent } kind;
  std::string pattern;
  int line;  // 1-based, in the file
};

struct CheckFile {
  std::string run;
  std::vector<Directive> checks;
  std::string error;  // a malformed directive, naming its line
};

std::string trim(const std::string& s);
// The directives of a file's text (comment lines starting `//`; other comments are ignored).
CheckFile parse_directives(const std::string& contents);
// "" when `output` satisfies the directives in order, else what failed, naming the line.
std::string match(const std::string& output, const std::vector<Directive>& checks);

// The source tree: $VKAD_SOURCE_DIR where set (a test binary carried to another machine, e.g.
// the GPU check), else `built` (the tree the test was built from).
std::string source_dir(const char* built);
// The files of folder `folder` of the source tree whose names end in `ext` (".vkir"), sorted.
std::vector<std::string> files_in(const std::string& source, const char* folder, const char* ext);
// A file's whole text ("" where it cannot be read).
std::string read_file(const std::string& path);
// A gtest case name from a file's stem (what is not a letter or digit becomes '_').
std::string case_name_of(const std::string& path);

}  // namespace vkad::test
