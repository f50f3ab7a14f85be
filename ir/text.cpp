#include "ir/text.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <string_view>

namespace vkad::codegen {

// ---------------------------------------------------------------- printer

namespace {

std::string vid(ValueId v) { return v == kNoValue ? "%?" : "%" + std::to_string(v); }

std::string param_name(const Kernel& k, uint32_t p) {
  return p < k.params.size() ? k.params[p].name : "<param " + std::to_string(p) + ">";
}

std::string format_const(const Stmt& s) {
  if (s.type == DType::kBool) return s.iimm ? "true" : "false";
  if (!is_float(s.type)) return std::to_string(s.iimm);
  if (std::isnan(s.fimm)) return "nan";
  if (std::isinf(s.fimm)) return s.fimm > 0 ? "inf" : "-inf";
  // The shortest decimal that reads back to the same value.
  char buf[64];
  bool f32 = s.type == DType::kF32;
  for (int prec = f32 ? 6 : 15; prec <= (f32 ? 9 : 17); ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, s.fimm);
    double back = std::strtod(buf, nullptr);
    if (f32 ? static_cast<float>(back) == static_cast<float>(s.fimm) : back == s.fimm) break;
  }
  std::string out = buf;
  // Keep floats recognisable as floats in the text.
  if (out.find_first_of(".eE") == std::string::npos) out += ".0";
  return out;
}

std::string print_bound(const Kernel& k, const RangeBound& b) {
  switch (b.kind) {
    case RangeBound::Kind::kConstant: return std::to_string(b.value);
    case RangeBound::Kind::kScalarParam: return param_name(k, b.param);
    case RangeBound::Kind::kArrayDim:
      return "shape(" + param_name(k, b.param) + ", " + std::to_string(b.dim) + ")";
  }
  return "?";
}

std::string indices(const Stmt& s, size_t n) {
  std::string out = "[";
  for (size_t i = 0; i < n; ++i) out += (i ? ", " : "") + vid(s.args[i]);
  return out + "]";
}

void print_block(const Kernel& k, const Block& b, int depth, std::string& out);

}  // namespace

namespace {
// Printing is bounded, not iterative: what nests deeper than the verifier accepts (and the
// parser reads) prints as this marker, so a kernel built in memory with 10^5 levels prints in
// bounded stack and output instead of overflowing the stack.
constexpr const char* kTooDeep = "...";
std::string print_size_at(const Kernel& k, const SizeExpr& e, uint32_t depth);
std::string print_combination(const Kernel& k, const char* name, const SizeExpr& e, uint32_t depth);
}  // namespace

std::string print_size(const Kernel& k, const SizeExpr& e) { return print_size_at(k, e, 0); }

namespace {
std::string print_size_at(const Kernel& k, const SizeExpr& e, uint32_t depth) {
  if (depth > kMaxNestingDepth) return kTooDeep;
  switch (e.kind) {
    case SizeExpr::Kind::kConst: return std::to_string(e.value);
    case SizeExpr::Kind::kScalar: return param_name(k, e.param);
    case SizeExpr::Kind::kNegScalar: return "neg(" + param_name(k, e.param) + ")";
    case SizeExpr::Kind::kDim:
      return "shape(" + param_name(k, e.param) + ", " + std::to_string(e.dim) + ")";
    case SizeExpr::Kind::kDiv:
      return "div(" +
             (e.operands.empty() ? std::string("?") : print_size_at(k, e.operands[0], depth + 1)) +
             ", " + std::to_string(e.value) + ")";
    case SizeExpr::Kind::kAdd: return print_combination(k, "add", e, depth);
    case SizeExpr::Kind::kMul: return print_combination(k, "mul", e, depth);
    case SizeExpr::Kind::kMax: return print_combination(k, "max", e, depth);
  }
  return kTooDeep;
}
// add / mul / max (operands...)
std::string print_combination(const Kernel& k, const char* name, const SizeExpr& e,
                              uint32_t depth) {
  std::string out = std::string(name) + "(";
  for (size_t i = 0; i < e.operands.size(); ++i) {
    out += (i ? ", " : "") + print_size_at(k, e.operands[i], depth + 1);
  }
  return out + ")";
}
}  // namespace

namespace {
// `[head]name %a, %b[ : type]`: the form of every op without a syntax of its own.
std::string operand_form(const Stmt& s, const std::string& head, const std::string& ty) {
  const OpInfo& info = op_info(s.op);
  std::string out = head + info.name;
  for (size_t i = 0; i < s.args.size(); ++i) out += (i ? ", " : " ") + vid(s.args[i]);
  return info.has_result ? out + ty : out;
}
std::string arg_or_missing(const Stmt& s, size_t i) {
  return i < s.args.size() ? vid(s.args[i]) : std::string("%?");
}

std::string leaf_text(const Kernel& k, const Stmt& s) {
  switch (leaf_op(s.op)) {
    case LeafOp::kConst: return "const " + format_const(s);
    case LeafOp::kArg: return "arg " + param_name(k, s.param);
    case LeafOp::kShape: return "shape " + param_name(k, s.param) + " " + std::to_string(s.dim);
  }
  return "?";
}
// load p[%i, ...] : t; store / atomic_add / atomic_max p[%i, ...], %v
std::string array_text(const Kernel& k, const Stmt& s, const std::string& head,
                       const std::string& ty) {
  if (s.op == Op::kLoad)
    return head + "load " + param_name(k, s.param) + indices(s, s.args.size()) + ty;
  size_t n = s.args.empty() ? 0 : s.args.size() - 1;
  return std::string(op_info(s.op).name) + " " + param_name(k, s.param) + indices(s, n) + ", " +
         (s.args.empty() ? "%?" : vid(s.args.back()));
}
// The statement's head line; print_block prints the blocks.
std::string control_text(const Kernel& k, const Stmt& s) {
  const std::string max_trip = s.has_cap ? " max_trip(" + print_size(k, s.cap) + ")" : "";
  switch (control_op(s.op)) {
    case ControlOp::kFor:
      return "for " + vid(s.result) + " in [" + arg_or_missing(s, 0) + ", " + arg_or_missing(s, 1) +
             ")" + max_trip;
    case ControlOp::kIf: return "if " + arg_or_missing(s, 0);
    case ControlOp::kWhile:
      return "while " + vid(s.result) + " (" + arg_or_missing(s, 0) + ")" + max_trip;
    case ControlOp::kBreak:
    case ControlOp::kContinue:
    case ControlOp::kBarrier: return operand_form(s, "", "");
    case ControlOp::kPrint:
    case ControlOp::kAssert: {  // print "x = {}", %3 / assert "x > 0", %5, %3
      std::string out = std::string(op_info(s.op).name) + " \"" +
                        source_location(static_cast<uint32_t>(s.iimm)) + "\"";
      for (ValueId a : s.args) out += ", " + vid(a);
      return out;
    }
  }
  return "?";
}
std::string stmt_text(const Kernel& k, const Stmt& s);
}  // namespace

std::string print_stmt(const Kernel& k, const Stmt& s) {
  std::string text = stmt_text(k, s);
  if (s.loc != 0) text += " @\"" + source_location(s.loc) + "\"";
  return text;
}

namespace {

std::string stmt_text(const Kernel& k, const Stmt& s) {
  const OpInfo& info = op_info(s.op);
  const bool loop = s.op == Op::kFor || s.op == Op::kWhile;  // the index is not `%r = `
  const std::string head = info.has_result && !loop ? vid(s.result) + " = " : "";
  const std::string ty = std::string(" : ") + abi::dtype_name(s.type);
  switch (info.family) {
    case OpFamily::kLeaf: return head + leaf_text(k, s) + ty;
    case OpFamily::kArray: return array_text(k, s, head, ty);
    case OpFamily::kControl: return control_text(k, s);
    case OpFamily::kStack:
      if (s.op == Op::kStackAlloc)
        return head + "stack_alloc cap(" + print_size(k, s.cap) + ")" + ty;
      break;
    case OpFamily::kUnary:
    case OpFamily::kBinary:
    case OpFamily::kCompare:
    case OpFamily::kSelect:
    case OpFamily::kCast: break;
    case OpFamily::kLocal:
      if (s.op == Op::kSharedAlloc) return head + "shared_alloc " + std::to_string(s.iimm) + ty;
      break;
  }
  return operand_form(s, head, ty);
}

void print_block(const Kernel& k, const Block& b, int depth, std::string& out) {
  std::string pad(2 * static_cast<size_t>(depth), ' ');
  // Tasks print their bodies at depth 2: past kMaxNestingDepth levels below that, a marker.
  if (depth > static_cast<int>(kMaxNestingDepth) + 2 && !b.stmts.empty()) {
    out += pad + kTooDeep + "\n";
    return;
  }
  for (const Stmt& s : b.stmts) {
    out += pad + print_stmt(k, s);
    if (s.op == Op::kFor || s.op == Op::kIf || s.op == Op::kWhile) {
      out += " {\n";
      if (!s.blocks.empty()) print_block(k, s.blocks[0], depth + 1, out);
      out += pad + "}";
      if (s.op == Op::kWhile && s.blocks.size() > 1) {
        out += " do {\n";
        print_block(k, s.blocks[1], depth + 1, out);
        out += pad + "}";
      }
      if (s.op == Op::kIf && s.blocks.size() > 1 && !s.blocks[1].stmts.empty()) {
        out += " else {\n";
        print_block(k, s.blocks[1], depth + 1, out);
        out += pad + "}";
      }
    }
    out += "\n";
  }
}

}  // namespace

std::string print(const Kernel& k) {
  std::string out = "kernel " + k.name + "(";
  for (size_t i = 0; i < k.params.size(); ++i) {
    const Param& p = k.params[i];
    out += (i ? ", " : "") + p.name + ": ";
    if (p.kind == ParamKind::kScalar) {
      out += abi::dtype_name(p.dtype);
      if (p.needs_grad) out += " grad";
    } else {
      out += std::string("ndarray<") + abi::dtype_name(p.dtype) + ", " + std::to_string(p.rank) +
             ">" + (p.needs_grad ? " grad" : "") + (p.read_only ? " readonly" : "");
    }
  }
  out += ") {\n";
  for (const Task& t : k.tasks) {
    if (t.dims.empty()) {
      out += "  task " + t.name + (t.serial ? " serial " : " parallel ") + vid(t.index) + " in [" +
             print_bound(k, t.begin) + ", " + print_bound(k, t.end) + ")";
    } else {  // N-d: `%i in [b0, e0), %j in [b1, e1)`
      out += "  task " + t.name + (t.serial ? " serial " : " parallel ");
      for (size_t d = 0; d < t.dims.size(); ++d) {
        out += (d ? ", " : "") + vid(t.dims[d].index) + " in [" + print_size(k, t.dims[d].begin) +
               ", " + print_size(k, t.dims[d].end) + ")";
      }
    }
    if (t.local_size) out += " local_size " + std::to_string(t.local_size);
    out += " {\n";
    print_block(k, t.body, 2, out);
    out += "  }\n";
  }
  return out + "}\n";
}

// ---------------------------------------------------------------- parser

namespace {

struct Token {
  enum Kind { kIdent, kValue, kNumber, kString, kPunct, kEnd } kind = kEnd;
  std::string text;
  int line = 1, col = 1;
};

// The token reader: splits the text into tokens (values %N, words, numbers, quoted texts,
// punctuation; `//` comments and white space skipped), holds the current one in tok_ with its
// line and column, and reads the small pieces every production uses (a given punctuation or
// word, a name, an integer in range, a type). Errors name the current token's place and text;
// a production may set tok_ back to a token it consumed to report there (the text's position
// stays where it is).
class Lexer {
 protected:
  explicit Lexer(const std::string& src) : src_(src) { advance(); }

  void advance() {
    skip_space();
    tok_ = Token{};
    tok_.line = line_;
    tok_.col = col_;
    if (pos_ >= src_.size()) return;
    char c = src_[pos_];
    size_t start = pos_;
    auto ident_char = [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.';
    };
    if (c == '%') {
      bump();
      while (pos_ < src_.size() && ident_char(src_[pos_])) bump();
      tok_.kind = Token::kValue;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      while (pos_ < src_.size() && ident_char(src_[pos_])) bump();
      tok_.kind = Token::kIdent;
    } else if (starts_number(c)) {
      tok_.kind = lex_number();
    } else if (c == '"') {
      tok_.kind = lex_string();
    } else {
      bump();
      tok_.kind = Token::kPunct;
    }
    tok_.text = src_.substr(start, pos_ - start);
  }
  Status error(const std::string& what) const {
    std::string got = tok_.kind == Token::kEnd ? "end of text" : "'" + tok_.text + "'";
    return make_error(ErrorCode::kInvalidArgument, "line " + std::to_string(tok_.line) +
                                                       ", column " + std::to_string(tok_.col) +
                                                       ": " + what + ", got " + got);
  }
  // An error about a token already consumed (a literal judged once its type is known).
  static Status error_at(const Token& t, const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "line " + std::to_string(t.line) + ", column " +
                                                       std::to_string(t.col) + ": " + what);
  }
  bool is(const char* p) const { return tok_.kind == Token::kPunct && tok_.text == p; }
  Status expect(const char* p) {
    if (!is(p)) return error(std::string("expected '") + p + "'");
    advance();
    return {};
  }
  Status expect_word(const char* w) {
    if (tok_.kind != Token::kIdent || tok_.text != w)
      return error(std::string("expected '") + w + "'");
    advance();
    return {};
  }
  // Consumes the word `w` if it is next; says whether it was.
  bool accept_word(const char* w) {
    if (tok_.kind != Token::kIdent || tok_.text != w) return false;
    advance();
    return true;
  }
  Result<std::string> ident(const char* what) {
    if (tok_.kind != Token::kIdent) return error(std::string("expected ") + what);
    std::string s = tok_.text;
    advance();
    return s;
  }
  // An integer literal in [lo, hi]; out of range is an error, never a truncated value.
  Result<int64_t> integer(const char* what, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
    if (tok_.kind != Token::kNumber) return error(std::string("expected ") + what);
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(tok_.text.c_str(), &end, 10);
    if (*end != '\0') return error(std::string("expected ") + what + " (an integer)");
    if (errno == ERANGE || v < lo || v > hi) {
      return error(std::string(what) + " out of range (" + std::to_string(lo) + " to " +
                   std::to_string(hi) + ")");
    }
    advance();
    return static_cast<int64_t>(v);
  }
  Result<DType> dtype() {
    static const std::pair<const char*, DType> kTypes[] = {
        {"f32", DType::kF32}, {"f64", DType::kF64}, {"i32", DType::kI32},
        {"u32", DType::kU32}, {"i64", DType::kI64}, {"bool", DType::kBool}};
    if (tok_.kind == Token::kIdent) {
      for (const auto& [n, t] : kTypes) {
        if (tok_.text == n) {
          advance();
          return t;
        }
      }
    }
    return error("expected a type (f32, f64, i32, u32, i64, bool)");
  }

  Token tok_;

 private:
  bool starts_number(char c) const {
    return std::isdigit(static_cast<unsigned char>(c)) ||
           ((c == '-' || c == '+') && pos_ + 1 < src_.size() &&
            (std::isdigit(static_cast<unsigned char>(src_[pos_ + 1])) || src_[pos_ + 1] == 'i' ||
             src_[pos_ + 1] == '.'));
  }
  // A number's characters (its sign, digits, letters of inf / nan / hex, '.', an exponent's sign).
  Token::Kind lex_number() {
    bump();
    while (pos_ < src_.size() &&
           (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '.' ||
            ((src_[pos_] == '-' || src_[pos_] == '+') &&
             (src_[pos_ - 1] == 'e' || src_[pos_ - 1] == 'E')))) {
      bump();
    }
    return Token::kNumber;
  }
  // A quoted text (a source location, a print's format): no escapes, one line. Unterminated, it
  // is punctuation, which no rule accepts.
  Token::Kind lex_string() {
    bump();
    while (pos_ < src_.size() && src_[pos_] != '"' && src_[pos_] != '\n') bump();
    if (pos_ >= src_.size() || src_[pos_] != '"') return Token::kPunct;
    bump();
    return Token::kString;
  }
  void bump() {
    if (src_[pos_] == '\n') {
      ++line_;
      col_ = 1;
    } else {
      ++col_;
    }
    ++pos_;
  }
  void skip_space() {
    while (pos_ < src_.size()) {
      if (std::isspace(static_cast<unsigned char>(src_[pos_]))) {
        bump();
      } else if (src_.compare(pos_, 2, "//") == 0) {
        while (pos_ < src_.size() && src_[pos_] != '\n') bump();
      } else {
        break;
      }
    }
  }

  const std::string& src_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
};

// The terms statements and tasks are made of: values (%N or %name, numbered as read),
// references to the kernel's parameters (k_, set while its tasks are read), range bounds and
// size expressions, operand lists, and constants' literals, which are read before their type
// and converted once type_suffix has read it.
class TermParser : public Lexer {
 protected:
  using Lexer::Lexer;

  Result<ValueId> value() {
    if (tok_.kind != Token::kValue) return error("expected a value (%N)");
    std::string name = tok_.text.substr(1);
    ValueId id;
    bool numeric = !name.empty() && name.find_first_not_of("0123456789") == std::string::npos;
    if (numeric && name.size() < 10) {
      uint32_t n = 0;  // under 10 digits: fits (from_chars, which throws nothing)
      std::from_chars(name.data(), name.data() + name.size(), n);
      id = static_cast<ValueId>(n);
    } else {
      auto it = named_.find(name);
      if (it == named_.end()) {
        // Symbolic names get ids far above printed ones, so mixing both never collides.
        it = named_.emplace(name, 1u << 30 | static_cast<ValueId>(named_.size())).first;
      }
      id = it->second;
    }
    max_id_ = std::max(max_id_, id);
    advance();
    return id;
  }
  Result<uint32_t> param_ref(bool want_array) {
    Token at = tok_;
    VKAD_ASSIGN_OR_RETURN(std::string n, ident("a parameter name"));
    int p = k_->find_param(n);
    if (p < 0 || (k_->params[p].kind == ParamKind::kNdArray) != want_array) {
      tok_ = at;  // report at the name
      return error(std::string("expected the name of ") + (want_array ? "an ndarray" : "a scalar") +
                   " parameter");
    }
    return static_cast<uint32_t>(p);
  }
  Result<RangeBound> bound() {
    if (tok_.kind == Token::kNumber) {
      VKAD_ASSIGN_OR_RETURN(int64_t v, integer("an integer bound"));
      return RangeBound::constant(v);
    }
    if (tok_.kind == Token::kIdent && tok_.text == "shape") {
      advance();
      VKAD_TRY(expect("("));
      VKAD_ASSIGN_OR_RETURN(uint32_t p, param_ref(true));
      VKAD_TRY(expect(","));
      VKAD_ASSIGN_OR_RETURN(int64_t d, integer("a dimension", 0, UINT32_MAX));
      VKAD_TRY(expect(")"));
      return RangeBound::array_dim(p, static_cast<uint32_t>(d));
    }
    VKAD_ASSIGN_OR_RETURN(uint32_t p, param_ref(false));
    return RangeBound::scalar(p);
  }
  static RangeBound leaf_bound(const SizeExpr& e) {
    switch (e.kind) {
      case SizeExpr::Kind::kScalar: return RangeBound::scalar(e.param);
      case SizeExpr::Kind::kDim: return RangeBound::array_dim(e.param, e.dim);
      case SizeExpr::Kind::kConst: return RangeBound::constant(e.value);
      // Not leaves: task_dims() keeps those as N-d dimensions and never asks.
      case SizeExpr::Kind::kAdd:
      case SizeExpr::Kind::kMul:
      case SizeExpr::Kind::kMax:
      case SizeExpr::Kind::kDiv:
      case SizeExpr::Kind::kNegScalar: break;
    }
    return RangeBound::constant(e.value);
  }
  Result<SizeExpr> size(uint32_t depth = 1) {
    if (tok_.kind == Token::kIdent && tok_.text == "neg") {  // neg(n): max(-n, 0), n a scalar
      advance();
      VKAD_TRY(expect("("));
      VKAD_ASSIGN_OR_RETURN(uint32_t p, param_ref(false));
      VKAD_TRY(expect(")"));
      return SizeExpr::neg_scalar(p);
    }
    if (tok_.kind == Token::kIdent && tok_.text == "div") {  // div(x, d): floor(x / d), d >= 1
      if (depth > kMaxNestingDepth) {
        return error("size expressions nest deeper than " + std::to_string(kMaxNestingDepth) +
                     " (kMaxNestingDepth)");
      }
      advance();
      VKAD_TRY(expect("("));
      VKAD_ASSIGN_OR_RETURN(SizeExpr a, size(depth + 1));
      VKAD_TRY(expect(","));
      VKAD_ASSIGN_OR_RETURN(SizeExpr d, size(depth + 1));
      VKAD_TRY(expect(")"));
      if (d.kind != SizeExpr::Kind::kConst || d.value < 1) {
        return error("the divisor of a size quotient div(x, d) must be a constant >= 1");
      }
      SizeExpr e;
      e.kind = SizeExpr::Kind::kDiv;
      e.value = d.value;
      e.operands = {std::move(a)};
      return e;
    }
    if (tok_.kind == Token::kIdent &&
        (tok_.text == "add" || tok_.text == "mul" || tok_.text == "max")) {
      if (depth > kMaxNestingDepth) {
        return error("size expressions nest deeper than " + std::to_string(kMaxNestingDepth) +
                     " (kMaxNestingDepth)");
      }
      SizeExpr::Kind kind = tok_.text == "add"   ? SizeExpr::Kind::kAdd
                            : tok_.text == "mul" ? SizeExpr::Kind::kMul
                                                 : SizeExpr::Kind::kMax;
      advance();
      VKAD_TRY(expect("("));
      SizeExpr e;
      e.kind = kind;
      while (true) {
        VKAD_ASSIGN_OR_RETURN(SizeExpr sub, size(depth + 1));
        e.operands.push_back(std::move(sub));
        if (is(")")) break;
        VKAD_TRY(expect(","));
      }
      advance();
      return e;
    }
    VKAD_ASSIGN_OR_RETURN(RangeBound b, bound());
    switch (b.kind) {
      case RangeBound::Kind::kConstant: return SizeExpr::constant(b.value);
      case RangeBound::Kind::kScalarParam: return SizeExpr::scalar(b.param);
      case RangeBound::Kind::kArrayDim: return SizeExpr::array_dim(b.param, b.dim);
    }
    return SizeExpr{};
  }
  Status operands(Stmt& s, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (i) VKAD_TRY(expect(","));
      VKAD_ASSIGN_OR_RETURN(ValueId v, value());
      s.args.push_back(v);
    }
    return {};
  }
  Status index_list(Stmt& s) {
    VKAD_ASSIGN_OR_RETURN(s.param, param_ref(true));
    VKAD_TRY(expect("["));
    while (!is("]")) {
      if (!s.args.empty()) VKAD_TRY(expect(","));
      VKAD_ASSIGN_OR_RETURN(ValueId v, value());
      s.args.push_back(v);
    }
    advance();
    return {};
  }
  // A constant's literal is read here and judged in type_suffix, once its type is known.
  Status constant(Stmt&) {
    literal_ = tok_;
    if (tok_.kind == Token::kIdent &&
        (tok_.text == "true" || tok_.text == "false" || tok_.text == "inf" || tok_.text == "nan")) {
      literal_kind_ = tok_.text == "true" || tok_.text == "false" ? kBoolLit : kFloatLit;
      advance();
      return {};
    }
    if (tok_.kind != Token::kNumber) return error("expected a constant");
    const std::string& t = tok_.text;
    literal_kind_ = t.find_first_of(".eEin") != std::string::npos ? kFloatLit : kIntLit;
    char* end = nullptr;
    errno = 0;
    if (literal_kind_ == kFloatLit) {
      literal_f_ = std::strtod(t.c_str(), &end);
    } else {
      literal_i_ = std::strtoll(t.c_str(), &end, 10);
    }
    if (*end != '\0') return error("expected a constant");
    // Overflow only: an underflow to a denormal or zero is ordinary rounding.
    if (errno == ERANGE && (literal_kind_ == kIntLit || std::isinf(literal_f_))) {
      return error("constant out of range");
    }
    advance();
    return {};
  }
  // Sets the constant's value for its type from literal_: an exact conversion, or an error at
  // the literal (never a silently changed value). Floats round to nearest, as any float
  // literal does, but a finite literal past the type's range is an error.
  Status convert_literal(Stmt& s) {
    if (literal_.kind == Token::kIdent) {
      if (literal_.text == "inf") literal_f_ = INFINITY;
      if (literal_.text == "nan") literal_f_ = NAN;
      if (literal_kind_ == kBoolLit) literal_i_ = literal_.text == "true";
    }
    if (s.type == DType::kBool) return convert_bool_literal(s);
    if (is_float(s.type)) return convert_float_literal(s);
    return convert_int_literal(s);
  }
  Status convert_bool_literal(Stmt& s) {
    if (literal_kind_ == kFloatLit || (literal_i_ != 0 && literal_i_ != 1)) {
      return error_at(literal_,
                      "constant " + literal_.text + " is not a bool (true, false, 0 or 1)");
    }
    s.iimm = literal_i_;
    s.fimm = static_cast<double>(s.iimm);
    return {};
  }
  Status convert_float_literal(Stmt& s) {
    const std::string lit = "constant " + literal_.text;
    if (literal_kind_ == kBoolLit)
      return error_at(literal_, lit + " is a bool, not " + abi::dtype_name(s.type));
    double v = literal_kind_ == kFloatLit ? literal_f_ : static_cast<double>(literal_i_);
    if (s.type == DType::kF32) {
      if (std::isfinite(v) && std::fabs(v) > FLT_MAX) {
        return error_at(literal_, lit + " is out of range for f32");
      }
      v = static_cast<float>(v);  // a f32 constant holds a float value exactly
    }
    s.fimm = v;
    s.iimm = 0;
    return {};
  }
  Status convert_int_literal(Stmt& s) {
    const std::string lit = "constant " + literal_.text;
    const std::string ty = abi::dtype_name(s.type);
    if (literal_kind_ == kBoolLit) return error_at(literal_, lit + " is a bool, not " + ty);
    int64_t lo = s.type == DType::kI32 ? INT32_MIN : s.type == DType::kU32 ? 0 : INT64_MIN;
    int64_t hi = s.type == DType::kI32 ? INT32_MAX : s.type == DType::kU32 ? UINT32_MAX : INT64_MAX;
    int64_t v = literal_i_;
    if (literal_kind_ == kFloatLit) {
      double f = literal_f_;
      // [-2^63, 2^63) is where the conversion is defined; outside it, or with a fraction,
      // the literal has no exact integer value.
      if (!std::isfinite(f) || f != std::trunc(f) || f < -0x1p63 || f >= 0x1p63) {
        return error_at(literal_, lit + " is not exactly representable as " + ty);
      }
      v = static_cast<int64_t>(f);
    }
    if (v < lo || v > hi) {
      return error_at(literal_, lit + " is out of range for " + ty + " (" + std::to_string(lo) +
                                    " to " + std::to_string(hi) + ")");
    }
    s.iimm = v;
    s.fimm = static_cast<double>(v);
    return {};
  }

  Kernel* k_ = nullptr;
  ValueId max_id_ = 0;

 private:
  std::map<std::string, ValueId> named_;
  enum LiteralKind { kIntLit, kFloatLit, kBoolLit };
  Token literal_;  // the last constant's literal, converted once its type is read
  LiteralKind literal_kind_ = kIntLit;
  int64_t literal_i_ = 0;
  double literal_f_ = 0;
};

// The grammar: a kernel, its parameters, its tasks and their dimensions, blocks and
// statements, each op family's syntax after its name, and for / while / if with their nested
// blocks (at most kMaxNestingDepth deep).
class Parser : public TermParser {
 public:
  explicit Parser(const std::string& src) : TermParser(src) {}

  Result<Kernel> kernel() {
    Kernel k;
    VKAD_TRY(expect_word("kernel"));
    VKAD_ASSIGN_OR_RETURN(k.name, ident("a kernel name"));
    VKAD_TRY(expect("("));
    while (!is(")")) {
      if (!k.params.empty()) VKAD_TRY(expect(","));
      VKAD_ASSIGN_OR_RETURN(Param p, param());
      k.params.push_back(std::move(p));
    }
    advance();
    k_ = &k;
    VKAD_TRY(expect("{"));
    while (!is("}")) {
      VKAD_ASSIGN_OR_RETURN(Task t, task());
      k.tasks.push_back(std::move(t));
    }
    advance();
    if (tok_.kind != Token::kEnd) return error("expected the end of the text");
    k.next_id = max_id_ + 1;
    k_ = nullptr;
    return k;
  }

 private:
  // name: ndarray<dtype, rank> [grad] [readonly]  |  name: dtype [grad]
  Result<Param> param() {
    Param p;
    VKAD_ASSIGN_OR_RETURN(p.name, ident("a parameter name"));
    VKAD_TRY(expect(":"));
    if (!accept_word("ndarray")) {
      VKAD_ASSIGN_OR_RETURN(p.dtype, dtype());
      p.needs_grad = accept_word("grad");  // a differentiable scalar
      return p;
    }
    p.kind = ParamKind::kNdArray;
    VKAD_TRY(expect("<"));
    VKAD_ASSIGN_OR_RETURN(p.dtype, dtype());
    VKAD_TRY(expect(","));
    VKAD_ASSIGN_OR_RETURN(int64_t rank, integer("a rank", 0, UINT32_MAX));
    p.rank = static_cast<uint32_t>(rank);
    VKAD_TRY(expect(">"));
    p.needs_grad = accept_word("grad");
    p.read_only = accept_word("readonly");
    return p;
  }
  // task name parallel|serial %i in [b, e)[, %j in [b, e) ...] [local_size n] { body }
  Result<Task> task() {
    Task t;
    VKAD_TRY(expect_word("task"));
    VKAD_ASSIGN_OR_RETURN(t.name, ident("a task name"));
    if (tok_.kind == Token::kIdent && (tok_.text == "serial" || tok_.text == "parallel")) {
      t.serial = tok_.text == "serial";
      advance();
    } else {
      return error("expected 'parallel' or 'serial'");
    }
    VKAD_TRY(task_dims(t));
    if (accept_word("local_size")) {
      VKAD_ASSIGN_OR_RETURN(int64_t ls, integer("a local size", 0, UINT32_MAX));
      t.local_size = static_cast<uint32_t>(ls);
    }
    VKAD_TRY(block(t.body));
    return t;
  }
  // One or more `%i in [begin, end)`, bounds as size expressions; a single dimension with
  // plain bounds is a 1-d task.
  Status task_dims(Task& t) {
    while (true) {
      TaskDim dim;
      VKAD_ASSIGN_OR_RETURN(dim.index, value());
      VKAD_TRY(expect_word("in"));
      VKAD_TRY(expect("["));
      VKAD_ASSIGN_OR_RETURN(dim.begin, size());
      VKAD_TRY(expect(","));
      VKAD_ASSIGN_OR_RETURN(dim.end, size());
      VKAD_TRY(expect(")"));
      t.dims.push_back(std::move(dim));
      if (!is(",")) break;
      if (t.dims.size() == kMaxTaskDims) {
        return error("a task has at most " + std::to_string(kMaxTaskDims) + " dimensions");
      }
      advance();
    }
    t.index = t.dims[0].index;
    auto leaf = [](const SizeExpr& e) {
      return e.kind == SizeExpr::Kind::kConst || e.kind == SizeExpr::Kind::kScalar ||
             e.kind == SizeExpr::Kind::kDim;
    };
    if (t.dims.size() == 1 && leaf(t.dims[0].begin) && leaf(t.dims[0].end)) {
      t.begin = leaf_bound(t.dims[0].begin);
      t.end = leaf_bound(t.dims[0].end);
      t.dims.clear();
    }
    return {};
  }

  Status type_suffix(Stmt& s) {
    VKAD_TRY(expect(":"));
    VKAD_ASSIGN_OR_RETURN(s.type, dtype());
    if (s.op == Op::kConst) VKAD_TRY(convert_literal(s));
    return {};
  }

  Status block(Block& b) {
    VKAD_TRY(expect("{"));
    while (!is("}")) {
      if (tok_.kind == Token::kEnd) return error("expected '}'");
      Stmt s;
      VKAD_TRY(statement(s));
      b.stmts.push_back(std::move(s));
    }
    advance();
    return {};
  }

  // The body of a for / if at `at`: one level deeper, at most kMaxNestingDepth (the parser
  // recurses per level, so this bounds its stack too).
  Status nested_block(const Token& at, Block& b) {
    if (depth_ + 1 > kMaxNestingDepth) {
      return error_at(at, "for / if bodies nest deeper than " + std::to_string(kMaxNestingDepth) +
                              " (kMaxNestingDepth)");
    }
    ++depth_;
    Status s = block(b);
    --depth_;
    return s;
  }

  Status statement(Stmt& s) {
    if (tok_.kind == Token::kValue) {
      VKAD_ASSIGN_OR_RETURN(s.result, value());
      VKAD_TRY(expect("="));
    }
    if (tok_.kind != Token::kIdent) return error("expected an operation");
    Token op_tok = tok_;
    if (!op_from_name(tok_.text, &s.op)) return error("unknown operation");
    advance();
    const OpInfo& info = op_info(s.op);
    if (info.has_result != (s.result != kNoValue) && s.op != Op::kFor && s.op != Op::kWhile) {
      tok_ = op_tok;
      return error(info.has_result ? "this operation needs a result ('%N = ...')"
                                   : "this operation has no result");
    }
    switch (info.family) {
      case OpFamily::kLeaf: VKAD_TRY(leaf(s)); break;
      case OpFamily::kUnary:
      case OpFamily::kCast: VKAD_TRY(operands(s, 1)); break;
      case OpFamily::kBinary:
      case OpFamily::kCompare: VKAD_TRY(operands(s, 2)); break;
      case OpFamily::kSelect: VKAD_TRY(operands(s, 3)); break;
      case OpFamily::kLocal:
        if (s.op == Op::kSharedAlloc) {
          VKAD_TRY(shared_size(s));
          break;
        }
        VKAD_TRY(operands(s, s.op == Op::kAlloca ? 0 : num_operands(s)));
        break;
      case OpFamily::kArray: VKAD_TRY(array_access(s)); break;
      case OpFamily::kStack: VKAD_TRY(stack(s)); break;
      case OpFamily::kControl: return control(s, op_tok);
    }
    if (info.has_result) VKAD_TRY(type_suffix(s));
    return location(s);
  }
  // [@"file.py:12:5"]: where the statement came from (Stmt::loc).
  Status location(Stmt& s) {
    if (!is("@")) return {};
    advance();
    if (tok_.kind != Token::kString) return error("expected a quoted source location after '@'");
    s.loc = intern_source_location(std::string_view(tok_.text).substr(1, tok_.text.size() - 2));
    advance();
    return {};
  }
  // How many value operands a local or adstack op takes after its name.
  static size_t num_operands(const Stmt& s) {
    if (s.op == Op::kStoreShared) return 3;
    return s.op == Op::kStoreLocal || s.op == Op::kStackPush || s.op == Op::kStackAccAdj ||
                   s.op == Op::kLoadShared
               ? 2
               : 1;
  }
  // shared_alloc <count>: the element count, a positive integer literal.
  Status shared_size(Stmt& s) {
    if (tok_.kind != Token::kNumber) return error("expected the shared array's element count");
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(tok_.text.c_str(), &end, 10);
    if (*end != '\0' || errno == ERANGE || n <= 0 || n > (1LL << 24))
      return error("a shared array's element count is an integer from 1 to 2^24");
    s.iimm = n;
    advance();
    return {};
  }
  // const <literal>; arg <param>; shape <param> <dim>
  Status leaf(Stmt& s) {
    switch (leaf_op(s.op)) {
      case LeafOp::kConst: return constant(s);
      case LeafOp::kArg: {
        VKAD_ASSIGN_OR_RETURN(s.param, param_ref(false));
        return {};
      }
      case LeafOp::kShape: {
        VKAD_ASSIGN_OR_RETURN(s.param, param_ref(true));
        VKAD_ASSIGN_OR_RETURN(int64_t d, integer("a dimension", 0, UINT32_MAX));
        s.dim = static_cast<uint32_t>(d);
        return {};
      }
    }
    return {};
  }
  // load p[%i, ...]; store / atomic_add / atomic_max p[%i, ...], %v
  Status array_access(Stmt& s) {
    VKAD_TRY(index_list(s));
    if (s.op == Op::kLoad) return {};
    VKAD_TRY(expect(","));
    VKAD_ASSIGN_OR_RETURN(ValueId v, value());
    s.args.push_back(v);
    return {};
  }
  // stack_alloc cap(<size>); the others: their operands
  Status stack(Stmt& s) {
    if (s.op != Op::kStackAlloc) return operands(s, num_operands(s));
    VKAD_TRY(expect_word("cap"));
    VKAD_TRY(expect("("));
    VKAD_ASSIGN_OR_RETURN(s.cap, size());
    VKAD_TRY(expect(")"));
    s.has_cap = true;
    return {};
  }
  // An optional `max_trip(<size>)` after a loop's head.
  Status max_trip(Stmt& s) {
    if (tok_.kind != Token::kIdent || tok_.text != "max_trip") return {};
    advance();
    VKAD_TRY(expect("("));
    VKAD_ASSIGN_OR_RETURN(s.cap, size());
    VKAD_TRY(expect(")"));
    s.has_cap = true;
    return {};
  }
  Status control(Stmt& s, const Token& op_tok) {
    switch (control_op(s.op)) {
      case ControlOp::kFor: return for_loop(s, op_tok);
      case ControlOp::kWhile: return while_loop(s, op_tok);
      case ControlOp::kIf: return branch(s, op_tok);
      case ControlOp::kBreak:
      case ControlOp::kContinue:
      case ControlOp::kBarrier: return location(s);
      case ControlOp::kPrint:
      case ControlOp::kAssert: VKAD_TRY(text_operands(s)); return location(s);
    }
    return {};
  }
  // print / assert: "text" [, %value]...; the text is interned (Stmt::iimm).
  Status text_operands(Stmt& s) {
    if (tok_.kind != Token::kString) return error("expected a quoted text");
    s.iimm = intern_source_location(std::string_view(tok_.text).substr(1, tok_.text.size() - 2));
    advance();
    while (is(",")) {
      advance();
      VKAD_ASSIGN_OR_RETURN(ValueId v, value());
      s.args.push_back(v);
    }
    return {};
  }
  // A loop's index after its op word (`for %i`, `while %i`); `%r = for` is an error saying
  // `usage`.
  Status loop_index(Stmt& s, const Token& op_tok, const char* usage) {
    if (s.result != kNoValue) {
      tok_ = op_tok;
      return error(usage);
    }
    s.type = DType::kI32;
    VKAD_ASSIGN_OR_RETURN(s.result, value());
    return {};
  }
  // for %i in [%begin, %end) [max_trip(<size>)] { body }
  Status for_loop(Stmt& s, const Token& op_tok) {
    VKAD_TRY(loop_index(s, op_tok, "write a for loop as 'for %i in [%begin, %end) { ... }'"));
    VKAD_TRY(expect_word("in"));
    VKAD_TRY(expect("["));
    VKAD_TRY(operands(s, 2));
    VKAD_TRY(expect(")"));
    VKAD_TRY(max_trip(s));
    VKAD_TRY(location(s));
    s.blocks.resize(1);
    return nested_block(op_tok, s.blocks[0]);
  }
  // while %i (%c) [max_trip(<size>)] { test, defining %c } do { body }
  Status while_loop(Stmt& s, const Token& op_tok) {
    VKAD_TRY(
        loop_index(s, op_tok, "write a while loop as 'while %i (%cond) { test } do { body }'"));
    VKAD_TRY(expect("("));
    VKAD_TRY(operands(s, 1));
    VKAD_TRY(expect(")"));
    VKAD_TRY(max_trip(s));
    VKAD_TRY(location(s));
    s.blocks.resize(2);
    VKAD_TRY(nested_block(op_tok, s.blocks[0]));
    VKAD_TRY(expect_word("do"));
    return nested_block(op_tok, s.blocks[1]);
  }
  // if %c { then } [else { else }]
  Status branch(Stmt& s, const Token& op_tok) {
    s.type = DType::kBool;
    VKAD_TRY(operands(s, 1));
    VKAD_TRY(location(s));
    s.blocks.resize(2);
    VKAD_TRY(nested_block(op_tok, s.blocks[0]));
    if (tok_.kind == Token::kIdent && tok_.text == "else") {
      advance();
      VKAD_TRY(nested_block(op_tok, s.blocks[1]));
    }
    return {};
  }

  uint32_t depth_ = 0;  // for / if bodies around the statement being parsed
};

}  // namespace

Result<Kernel> parse(const std::string& text) {
  Parser p(text);
  return p.kernel();
}

std::string whole_array_kernel_text(const std::string& name, const std::string& params,
                                    const std::string& task, const std::string& array,
                                    uint32_t axes, const std::string& prologue,
                                    const std::function<std::string(const std::string&)>& body) {
  std::string ir = "kernel " + name + "(" + params + ") {\n  task " + task + " parallel ";
  std::string index, close;
  for (uint32_t a = 0; a < axes; ++a) index += (a ? ", %i" : "%i") + std::to_string(a);
  for (uint32_t a = 0; a < std::min(axes, 3u); ++a) {
    ir += (a ? ", %i" : "%i") + std::to_string(a) + " in [0, shape(" + array + ", " +
          std::to_string(a) + "))";
  }
  ir += " {\n" + prologue;
  if (axes > 3) ir += "    %zero = const 0 : i32\n";
  for (uint32_t a = 3; a < axes; ++a) {
    const std::string n = std::to_string(a);
    ir += "    %n" + n + " = shape " + array + " " + n + " : i32\n    for %i" + n +
          " in [%zero, %n" + n + ") {\n";
    close += "    }\n";
  }
  return ir + body(index) + close + "  }\n}\n";
}

std::string unrolled_array_kernel_text(
    const std::string& name, const std::string& params, const std::string& task,
    const std::string& array, const std::vector<uint32_t>& shape, uint32_t first, uint32_t last,
    const std::string& prologue,
    const std::function<std::string(const std::string&, uint64_t)>& body) {
  const uint32_t rank = static_cast<uint32_t>(shape.size());
  auto tasked = [&](uint32_t a) { return a >= first && a < last; };
  std::string ir = "kernel " + name + "(" + params + ") {\n  task " + task + " parallel ";
  for (uint32_t a = first; a < last; ++a) {
    ir += std::string(a > first ? ", " : "") + "%i" + std::to_string(a) + " in [0, shape(" + array +
          ", " + std::to_string(a) + "))";
  }
  ir += " {\n" + prologue;
  uint32_t widest = 1;
  for (uint32_t a = 0; a < rank; ++a) widest = tasked(a) ? widest : std::max(widest, shape[a]);
  for (uint32_t c = 0; c < widest; ++c)
    ir += "    %k" + std::to_string(c) + " = const " + std::to_string(c) + " : i32\n";
  std::vector<uint32_t> at(rank, 0);  // the unrolled axes' coordinates
  for (uint64_t e = 0;; ++e) {
    std::string index;
    for (uint32_t a = 0; a < rank; ++a) {
      index += std::string(a ? ", " : "") + (tasked(a) ? "%i" : "%k") +
               std::to_string(tasked(a) ? a : at[a]);
    }
    ir += body(index, e);
    uint32_t a = rank;
    while (a-- > 0) {
      if (tasked(a)) continue;
      if (++at[a] < shape[a]) break;
      at[a] = 0;
    }
    if (a == UINT32_MAX) break;  // every coordinate wrapped: done
  }
  return ir + "  }\n}\n";
}

std::string copy_kernel_text(const std::string& t, uint32_t rank) {
  const std::string r = std::to_string(rank);
  const std::string array = "ndarray<" + t + ", " + r + ">";
  return whole_array_kernel_text("vkad_copy_" + t + "_" + r, "src: " + array + ", dst: " + array,
                                 "copy", "src", rank, "", [&](const std::string& index) {
                                   return "    %v = load src[" + index + "] : " + t +
                                          "\n    store dst[" + index + "], %v\n";
                                 });
}

}  // namespace vkad::codegen
