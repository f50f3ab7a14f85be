#include "fuzz/text_fuzz.h"

#include <array>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "autodiff/reverse_mode.h"
#include "ir/ir.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "spirv/compiler.h"

namespace vkad::fuzz {

std::vector<std::string> load_corpus(const std::string& source_dir) {
  std::vector<std::string> out;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path root = fs::path(source_dir) / "tests";
  for (auto it = fs::recursive_directory_iterator(root, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::string ext = it->path().extension().string();
    if (ext != ".cpp" && ext != ".h" && ext != ".vkir") continue;
    std::ifstream f(it->path());
    std::stringstream ss;
    ss << f.rdbuf();
    std::string src = ss.str();
    if (ext == ".vkir") {  // tests/kernels: a whole kernel file (its CHECK lines are comments)
      out.push_back(src);
      continue;
    }
    const std::string open = "R\"(kernel ";
    for (size_t at = src.find(open); at != std::string::npos; at = src.find(open, at + 1)) {
      size_t begin = at + 3, end = src.find(")\"", begin);
      if (end == std::string::npos) break;
      out.push_back(src.substr(begin, end - begin));
    }
  }
  return out;
}

namespace {

// Values at the edges of every field and type: sign, 32/64-bit limits, f32 range, specials.
const std::array<const char*, 18> kNumbers = {"0",
                                              "1",
                                              "-1",
                                              "2",
                                              "63",
                                              "64",
                                              "65",
                                              "2147483647",
                                              "2147483648",
                                              "4294967295",
                                              "4294967296",
                                              "9223372036854775807",
                                              "99999999999999999999",
                                              "1.5",
                                              "1e39",
                                              "-0.0",
                                              "inf",
                                              "nan"};
const std::array<const char*, 6> kTypes = {"f32", "f64", "i32", "u32", "i64", "bool"};
const char kSyntax[] = "%(){}[],:=<>-+.0123456789 \nabcdefxyz_";

struct Token {
  size_t begin, end;
};

std::vector<Token> tokens(const std::string& t) {
  std::vector<Token> out;
  for (size_t i = 0; i < t.size();) {
    unsigned char c = static_cast<unsigned char>(t[i]);
    if (std::isspace(c)) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    if (std::isalnum(c) || c == '%' || c == '_' || c == '.' || c == '-') {
      while (j < t.size() &&
             (std::isalnum(static_cast<unsigned char>(t[j])) || t[j] == '_' || t[j] == '.'))
        ++j;
    }
    out.push_back({i, j});
    i = j;
  }
  return out;
}

// Every op of the table, the barrier included: it verifies only in a one-workgroup task, which
// the corpus holds (tests/kernels/reverse_mode_refuses_barrier.vkir), and reverse mode refuses
// it as bad input, so a mutation that moves it or makes an op of it must end in an input error.
std::vector<std::string> op_names() {
  std::vector<std::string> out;
  for (size_t i = 0; i < codegen::kNumOps; ++i) {
    out.push_back(codegen::op_info(static_cast<codegen::Op>(i)).name);
  }
  return out;
}

size_t pick(std::mt19937_64& rng, size_t n) {
  return n ? std::uniform_int_distribution<size_t>(0, n - 1)(rng) : 0;
}

std::vector<std::pair<size_t, size_t>> lines(const std::string& t) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t start = 0;
  for (size_t i = 0; i <= t.size(); ++i) {
    if (i == t.size() || t[i] == '\n') {
      out.push_back({start, i + (i < t.size())});
      start = i + 1;
    }
  }
  return out;
}

void mutate_once(std::string& t, std::mt19937_64& rng) {
  static const std::vector<std::string> kOps = op_names();
  auto toks = tokens(t);
  // Byte-level kinds (0-2) mostly make syntax errors, so they are drawn less often than the
  // token- and line-level kinds, which keep more inputs parseable and reach the later stages.
  size_t kind = pick(rng, 20);
  kind = kind < 3 ? kind : 3 + kind % 7;
  switch (kind) {
    case 0: {  // replace a byte
      if (!t.empty()) t[pick(rng, t.size())] = kSyntax[pick(rng, sizeof kSyntax - 1)];
      break;
    }
    case 1: {  // delete a short range
      if (t.empty()) break;
      size_t at = pick(rng, t.size());
      t.erase(at, 1 + pick(rng, 8));
      break;
    }
    case 2: {  // insert syntax bytes
      size_t at = pick(rng, t.size() + 1);
      std::string ins;
      for (size_t n = 1 + pick(rng, 4); n; --n) ins += kSyntax[pick(rng, sizeof kSyntax - 1)];
      t.insert(at, ins);
      break;
    }
    case 3: {  // a number token becomes an edge value
      std::vector<Token> nums;
      for (const Token& k : toks) {
        unsigned char c = static_cast<unsigned char>(t[k.begin]);
        if (std::isdigit(c) || ((c == '-') && k.end > k.begin + 1)) nums.push_back(k);
      }
      if (nums.empty()) break;
      Token k = nums[pick(rng, nums.size())];
      t.replace(k.begin, k.end - k.begin, kNumbers[pick(rng, kNumbers.size())]);
      break;
    }
    case 4: {  // a type name becomes another
      std::vector<Token> types;
      for (const Token& k : toks) {
        std::string w = t.substr(k.begin, k.end - k.begin);
        for (const char* ty : kTypes) {
          if (w == ty) types.push_back(k);
        }
      }
      if (types.empty()) break;
      Token k = types[pick(rng, types.size())];
      t.replace(k.begin, k.end - k.begin, kTypes[pick(rng, kTypes.size())]);
      break;
    }
    case 5: {  // an operation becomes another
      std::vector<Token> ops;
      for (const Token& k : toks) {
        std::string w = t.substr(k.begin, k.end - k.begin);
        for (const std::string& op : kOps) {
          if (w == op) ops.push_back(k);
        }
      }
      if (ops.empty()) break;
      Token k = ops[pick(rng, ops.size())];
      t.replace(k.begin, k.end - k.begin, kOps[pick(rng, kOps.size())]);
      break;
    }
    case 6: {  // a token becomes a copy of another (ids, names, punctuation)
      if (toks.size() < 2) break;
      Token a = toks[pick(rng, toks.size())], b = toks[pick(rng, toks.size())];
      t.replace(a.begin, a.end - a.begin, t.substr(b.begin, b.end - b.begin));
      break;
    }
    case 7: {  // delete a line
      auto ls = lines(t);
      auto [b, e] = ls[pick(rng, ls.size())];
      t.erase(b, e - b);
      break;
    }
    case 8: {  // duplicate a line elsewhere
      auto ls = lines(t);
      auto [b, e] = ls[pick(rng, ls.size())];
      std::string line = t.substr(b, e - b);
      if (line.empty() || line.back() != '\n') line += '\n';
      t.insert(ls[pick(rng, ls.size())].first, line);
      break;
    }
    default: {  // swap two lines
      auto ls = lines(t);
      if (ls.size() < 2) break;
      auto x = ls[pick(rng, ls.size())], y = ls[pick(rng, ls.size())];
      if (x.first > y.first) std::swap(x, y);
      if (x.second > y.first) break;
      std::string a = t.substr(x.first, x.second - x.first),
                  b = t.substr(y.first, y.second - y.first);
      t.replace(y.first, b.size(), a);
      t.replace(x.first, a.size(), b);
      break;
    }
  }
}

bool input_error(const Status& s) {
  return s.code() == ErrorCode::kInvalidArgument || s.code() == ErrorCode::kUnsupported;
}

Status broken(const std::string& stage, const Status& s) {
  return make_error(ErrorCode::kInternal, stage + ": " + s.to_string());
}

}  // namespace

std::string mutate(const std::string& text, std::mt19937_64& rng) {
  std::string t = text;
  // Mostly one mutation, sometimes up to four.
  size_t r = pick(rng, 10), n = r < 6 ? 1 : r < 9 ? 2 : 4;
  for (; n; --n) mutate_once(t, rng);
  return t;
}

Result<Outcome> check_text(const std::string& text, const codegen::Target& target) {
  Outcome o;
  auto k = codegen::parse(text);
  if (!k.ok()) {
    if (!input_error(k.status())) return broken("parse", k.status());
    return o;
  }
  o.parsed = true;
  Status v = codegen::verify(*k, target);
  if (!v.ok()) {
    if (!input_error(v)) return broken("verify", v);
    return o;
  }
  o.verified = true;
  // The printer and parser round-trip every verified kernel.
  std::string printed = codegen::print(*k);
  auto again = codegen::parse(printed);
  if (!again.ok()) return broken("parse(print(k)) of a verified kernel", again.status());
  if (codegen::print(*again) != printed) {
    return make_error(ErrorCode::kInternal,
                      "print(parse(print(k))) differs from print(k):\n" + printed);
  }
  auto ck = codegen::compile(*k, target);
  if (!ck.ok()) return broken("compile of a verified kernel", ck.status());
  o.compiled = true;
  auto adj = codegen::make_adjoint(*k, target);
  if (!adj.ok()) {
    if (!input_error(adj.status())) return broken("make_adjoint", adj.status());
    return o;
  }
  Status av = codegen::verify(*adj, target);
  if (!av.ok()) return broken("verify of the adjoint of a verified kernel", av);
  auto ack = codegen::compile(*adj, target);
  if (!ack.ok()) return broken("compile of the adjoint of a verified kernel", ack.status());
  o.adjoint = true;
  return o;
}

}  // namespace vkad::fuzz
