// Small helpers shared by the benchmarks: timing, medians, argument parsing, JSON output.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace vkad::bench {

inline double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// --key value / --flag arguments. Every benchmark states its usage and its flags: --help prints
// the usage and exits 0; an unknown flag or a stray word prints it and exits 2 (never a silent
// full run with the wrong settings).
class Args {
 public:
  Args(int argc, char** argv, const char* usage, std::initializer_list<const char*> flags) {
    std::set<std::string> known(flags.begin(), flags.end());
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::printf("%s", usage);
        std::exit(0);
      }
      if (a.rfind("--", 0) != 0 || !known.count(a.substr(2))) {
        std::fprintf(stderr, "unknown argument '%s'\n%s", a.c_str(), usage);
        std::exit(2);
      }
      std::string key = a.substr(2);
      if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) {
        values_[key] = argv[++i];
      } else {
        values_[key] = "1";
      }
    }
  }
  std::string get(const std::string& key, const std::string& fallback) const {
    auto it = values_.find(key);
    return it == values_.end() ? fallback : it->second;
  }
  long get_int(const std::string& key, long fallback) const {
    auto it = values_.find(key);
    return it == values_.end() ? fallback : std::stol(it->second);
  }
  bool has(const std::string& key) const { return values_.count(key) != 0; }

 private:
  std::map<std::string, std::string> values_;
};

// Flat JSON: a list of records, each a map of string -> number-or-string.
class JsonRecords {
 public:
  void begin() { rows_.emplace_back(); }
  void field(const std::string& k, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    rows_.back().emplace_back(k, buf);
  }
  void field(const std::string& k, const std::string& v) {
    rows_.back().emplace_back(k, "\"" + v + "\"");
  }
  bool write(const std::string& path, const std::string& device) const {
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return false;
    std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"results\": [\n", device.c_str());
    for (size_t i = 0; i < rows_.size(); ++i) {
      std::fprintf(f, "    {");
      for (size_t j = 0; j < rows_[i].size(); ++j) {
        std::fprintf(f, "%s\"%s\": %s", j ? ", " : "", rows_[i][j].first.c_str(),
                     rows_[i][j].second.c_str());
      }
      std::fprintf(f, "}%s\n", i + 1 < rows_.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
    return true;
  }

 private:
  std::vector<std::vector<std::pair<std::string, std::string>>> rows_;
};

}  // namespace vkad::bench
