// A launch sequence in text (graph/program_text.h).
#include "graph/program_text.h"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <sstream>

#include "ir/text.h"

namespace vkad {

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// The text before a `//` comment.
std::string code_of(const std::string& line) { return trim(line.substr(0, line.find("//"))); }

// "a, b, c" split at the commas, each trimmed; "" gives none.
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  if (trim(s).empty()) return out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(trim(item));
  return out;
}

bool parse_dtype(const std::string& s, runtime::DType* out) {
  static const std::pair<const char*, runtime::DType> kNames[] = {
      {"f32", runtime::DType::kF32}, {"f64", runtime::DType::kF64},
      {"i32", runtime::DType::kI32}, {"u32", runtime::DType::kU32},
      {"i64", runtime::DType::kI64}, {"bool", runtime::DType::kBool}};
  for (const auto& [name, t] : kNames) {
    if (s == name) {
      *out = t;
      return true;
    }
  }
  return false;
}

class Parser {
 public:
  explicit Parser(ProgramText* out) : out_(out) {}

  Status line(int n, const std::string& code) {
    line_ = n;
    std::string word = code.substr(0, code.find_first_of(" \t("));
    if (word == "array") return array(trim(code.substr(5)));
    if (word == "launch") return launch(trim(code.substr(6)));
    if (word == "fill") return fill(trim(code.substr(4)));
    return bad("expected kernel, array, launch or fill, got '" + code + "'");
  }

  Status kernel(int first_line, const std::string& text) {
    line_ = first_line;
    Result<codegen::Kernel> k = codegen::parse(text);
    if (!k.ok()) return bad("the kernel does not parse: " + k.status().message());
    out_->kernels.push_back(std::move(*k));
    return {};
  }

 private:
  Status bad(const std::string& what) const {
    return make_error(ErrorCode::kInvalidArgument,
                      "program text, line " + std::to_string(line_) + ": " + what);
  }

  // "x: f32[64]" or "p: f32[10, 20, 13]"
  Status array(const std::string& s) {
    const size_t colon = s.find(':'), open = s.find('['), close = s.rfind(']');
    if (colon == std::string::npos || open == std::string::npos || close == std::string::npos ||
        open < colon || close < open) {
      return bad("expected 'array <name>: <dtype>[<extents>]'");
    }
    ProgramText::Array a;
    a.name = trim(s.substr(0, colon));
    if (!parse_dtype(trim(s.substr(colon + 1, open - colon - 1)), &a.dtype))
      return bad("unknown dtype in '" + s + "'");
    for (const std::string& e : split_list(s.substr(open + 1, close - open - 1))) {
      uint32_t v = 0;
      auto [end, ec] = std::from_chars(e.data(), e.data() + e.size(), v);
      if (ec != std::errc() || end != e.data() + e.size()) return bad("extent '" + e + "'");
      a.extents.push_back(v);
    }
    if (a.extents.empty()) return bad("array '" + a.name + "' has no extents");
    if (find_array(a.name) != 0) return bad("array '" + a.name + "' declared twice");
    out_->arrays.push_back(std::move(a));
    return {};
  }

  uint64_t find_array(const std::string& name) const {
    for (size_t i = 0; i < out_->arrays.size(); ++i) {
      if (out_->arrays[i].name == name) return i + 1;
    }
    return 0;
  }

  // "k(x, 3, 0.5)"
  Status launch(const std::string& s) {
    const size_t open = s.find('('), close = s.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close < open)
      return bad("expected 'launch <kernel>(<args>)'");
    const std::string name = trim(s.substr(0, open));
    size_t k = 0;
    while (k < out_->kernels.size() && out_->kernels[k].name != name) ++k;
    if (k == out_->kernels.size()) return bad("no kernel '" + name + "' above");
    const codegen::Kernel& kernel = out_->kernels[k];
    const std::vector<std::string> args = split_list(s.substr(open + 1, close - open - 1));
    if (args.size() != kernel.params.size()) {
      return bad("'" + name + "' takes " + std::to_string(kernel.params.size()) +
                 " arguments, got " + std::to_string(args.size()));
    }
    CapturedStep step;
    step.kernel = runtime::KernelHandle{k + 1};
    for (size_t i = 0; i < args.size(); ++i) {
      VKAD_ASSIGN_OR_RETURN(Arg a, argument(kernel.params[i], args[i]));
      step.args.push_back(a);
    }
    out_->steps.push_back(std::move(step));
    return {};
  }

  Result<Arg> argument(const codegen::Param& p, const std::string& text) const {
    if (p.kind == abi::ParamKind::kNdArray) {
      const uint64_t id = find_array(text);
      if (id == 0) return bad("no array '" + text + "' above");
      return Arg::ndarray(runtime::NdArrayHandle{id});
    }
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size())
      return bad("parameter '" + p.name + "': '" + text + "' is not a number");
    switch (p.dtype) {
      case runtime::DType::kF32: return Arg::f32(static_cast<float>(v));
      case runtime::DType::kF64: return Arg::f64(v);
      case runtime::DType::kI32: return Arg::i32(static_cast<int32_t>(v));
      case runtime::DType::kU32: return Arg::u32(static_cast<uint32_t>(v));
      case runtime::DType::kI64: return Arg::i64(static_cast<int64_t>(v));
      case runtime::DType::kBool: return Arg::boolean(v != 0);
    }
    return bad("parameter '" + p.name + "': unknown dtype");
  }

  // "y 0"
  Status fill(const std::string& s) {
    std::istringstream in(s);
    std::string name, value;
    in >> name >> value;
    const uint64_t id = find_array(name);
    if (id == 0) return bad("no array '" + name + "' above");
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || end != value.c_str() + value.size())
      return bad("fill value '" + value + "'");
    CapturedStep step;
    step.launch = false;
    step.args.push_back(Arg::ndarray(runtime::NdArrayHandle{id}));
    step.value = v;
    out_->steps.push_back(std::move(step));
    return {};
  }

  ProgramText* out_;
  int line_ = 0;
};

}  // namespace

Result<ProgramText> parse_program(const std::string& text) {
  ProgramText out;
  Parser parser(&out);
  std::istringstream in(text);
  int n = 0;
  std::string kernel;  // the kernel being read
  int kernel_line = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (!kernel.empty()) {
      kernel += line + "\n";
      if (trim(line) == "}" && line.find('}') == 0) {
        VKAD_TRY(parser.kernel(kernel_line, kernel));
        kernel.clear();
      }
      continue;
    }
    const std::string code = code_of(line);
    if (code.empty()) continue;
    if (code.rfind("kernel ", 0) == 0) {
      kernel = line + "\n";
      kernel_line = n;
      continue;
    }
    VKAD_TRY(parser.line(n, code));
  }
  if (!kernel.empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "program text, line " + std::to_string(kernel_line) +
                          ": the kernel has no closing '}' at the start of a line");
  }
  return out;
}

}  // namespace vkad
