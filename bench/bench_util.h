// Small helpers shared by the benchmarks: timing, medians, argument parsing, JSON output, seeded
// random inputs, output checks and bandwidth figures held against the measured copy.
//
// The rules every benchmark that reports a speed follows (issue 49, "benchmarks that cannot
// flatter"): its inputs are seeded random data (random_floats/random_words; a constant array can
// move more cheaply than real data, and proves nothing about the result); after timing it checks
// its outputs against a closed form or the CPU evaluator (reference/cpu_eval.h) and exits
// non-zero through check_failed() when they are wrong; a bandwidth is printed beside the copy
// bandwidth measured in the same run on the same random data (bandwidth_note), and a figure
// above that copy is flagged as suspect, never printed as a plain result.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
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

// The q-quantile (0 <= q <= 1) of v, the nearest rank: a spread to print beside a median.
inline double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
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

// Seeded random data (splitmix64: the same sequence on every platform and standard library, and
// fast enough for 2^26 elements). Nothing here is for cryptography.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi), 24 random bits.
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }

 private:
  uint64_t state_;
};

inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  Random r(seed);
  std::vector<float> v(n);
  for (float& x : v) x = r.uniform(lo, hi);
  return v;
}

inline std::vector<double> random_doubles(size_t n, uint64_t seed, double lo = -1.0,
                                          double hi = 1.0) {
  Random r(seed);
  std::vector<double> v(n);
  for (double& x : v) x = lo + (hi - lo) * static_cast<double>(r.next() >> 11) * 0x1p-53;
  return v;
}

// Loud failure of a benchmark's output check: prints what was wrong and exits 3 (a benchmark
// whose result is wrong has measured nothing; its figures must not be read).
[[noreturn]] inline void check_failed(const std::string& what) {
  std::fprintf(stderr, "vkad bench: CHECK FAILED: %s\n", what.c_str());
  std::fflush(stdout);
  std::exit(3);
}

// Compares `got` against `want(i)` element by element with |got - want| <= tol(i); on the first
// mismatch fails loudly through check_failed, naming `what`, the index and both values. Returns
// the largest |got - want| otherwise.
template <typename T, typename Want, typename Tol>
double check_close(const std::string& what, const std::vector<T>& got, Want want, Tol tol) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double w = want(i), d = std::fabs(static_cast<double>(got[i]) - w);
    if (!(d <= tol(i))) {  // NaN fails too
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s: element %zu is %.9g, expected %.9g (tolerance %.3g)",
                    what.c_str(), i, static_cast<double>(got[i]), w, static_cast<double>(tol(i)));
      check_failed(buf);
    }
    worst = std::max(worst, d);
  }
  return worst;
}

// What `steps` additions of `add` to `y` give in f32, each rounded in order: the exact result
// of a kernel that runs y += add `steps` times, when `add` itself is exact (a * x with a a power
// of two: then a fused multiply-add rounds the same as a multiply and an add).
inline float repeated_add(float y, float add, long steps) {
  for (long k = 0; k < steps; ++k) y += add;
  return y;
}

// A bandwidth beside the copy bandwidth measured in the same run on the same random data.
// `above_copy` holds when the figure exceeds the copy: no kernel that moves its bytes can, so the
// figure is suspect (data the hardware compresses, work skipped, a timing that missed the
// device) and is printed flagged, not as a result.
struct BandwidthNote {
  double fraction_of_copy = 0;
  bool above_copy = false;
  std::string text;  // "  87% of copy" or "  129% of copy  FLAGGED: above the measured copy ..."
};

inline BandwidthNote bandwidth_note(double gbs, double copy_gbs) {
  BandwidthNote n;
  n.fraction_of_copy = copy_gbs > 0 ? gbs / copy_gbs : 0;
  n.above_copy = gbs > copy_gbs;
  char buf[160];
  std::snprintf(
      buf, sizeof buf, "%5.0f%% of copy%s", 100 * n.fraction_of_copy,
      n.above_copy ? "  FLAGGED: above the copy measured on the same data, not a result" : "");
  n.text = buf;
  return n;
}

}  // namespace vkad::bench
