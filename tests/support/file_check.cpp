// CHECK-directive files (tests/support/file_check.h).
#include "support/file_check.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

namespace vkad::test {

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

std::string source_dir(const char* built) {
  const char* env = std::getenv("VKAD_SOURCE_DIR");
  return env && *env ? env : built;
}

std::vector<std::string> files_in(const std::string& source, const char* folder, const char* ext) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(source) / "tests" / folder, ec)) {
    if (e.path().extension() == ext) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string case_name_of(const std::string& path) {
  std::string stem = std::filesystem::path(path).stem().string();
  for (char& c : stem) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return stem;
}

}  // namespace vkad::test
