#include "ir/pass.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "ir/verifier.h"

namespace vkad::codegen {

Status verify_output(const Kernel& k, const Target& target, const std::string& lacks,
                     const std::string& broken) {
  Status v = verify(k, target);
  if (v.ok()) return v;
  if (v.code() == ErrorCode::kUnsupported) {
    return make_error(ErrorCode::kUnsupported, lacks + ": " + v.message());
  }
  return make_error(ErrorCode::kInternal, broken + ": " + v.message());
}

Pass verify_pass(const Target& target) {
  return {"verify", [target](Kernel k) -> Result<Kernel> {
            VKAD_TRY(verify(k, target));
            return k;
          }};
}

Pipeline& Pipeline::add(Pass pass) {
  passes_.push_back(std::move(pass));
  return *this;
}

Pipeline& Pipeline::add(std::string name, std::function<Result<Kernel>(Kernel)> run) {
  return add(Pass{std::move(name), std::move(run)});
}

std::vector<std::string> Pipeline::names() const {
  std::vector<std::string> out;
  out.reserve(passes_.size());
  for (const Pass& p : passes_) out.push_back(p.name);
  return out;
}

Result<Kernel> Pipeline::run(Kernel k, std::string* failed) const {
  if (failed) failed->clear();
  for (const Pass& pass : passes_) {
    const std::string name = k.name;
    Result<Kernel> next = pass.run(std::move(k));
    if (!next.ok()) {
      if (failed) *failed = pass.name;
      return next;
    }
    k = std::move(next).value();
    if (!verify_each_) continue;
    Status v = verify_output(
        k, target_, "pass '" + pass.name + "' on kernel '" + name + "' needs what the device lacks",
        "pass '" + pass.name + "' on kernel '" + name +
            "' produced a kernel that does not verify (a bug in vkad)");
    if (!v.ok()) {
      if (failed) *failed = pass.name;
      return v;
    }
  }
  return k;
}

void PassRegistry::add(const std::string& name, std::string summary, Factory factory) {
  passes_[name] = {std::move(summary), std::move(factory)};
}

std::vector<std::pair<std::string, std::string>> PassRegistry::list() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, e] : passes_) out.emplace_back(name, e.summary);
  return out;
}

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

Status bad_pipeline(const std::string& text, const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, "pipeline '" + text + "': " + what);
}

// Splits "a, b{k=v, l=w}, c" at the commas outside braces.
Result<std::vector<std::string>> split_passes(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '{') ++depth;
    if (c == '}' && --depth < 0) return bad_pipeline(text, "a '}' without its '{'");
    if (c == ',' && depth == 0) {
      out.push_back(trim(cur));
      cur.clear();
      continue;
    }
    cur += c;
  }
  if (depth != 0) return bad_pipeline(text, "a '{' without its '}'");
  out.push_back(trim(cur));
  return out;
}

Status parse_options(const std::string& text, const std::string& pass, const std::string& body,
                     PassOptions* out) {
  size_t at = 0;
  while (at <= body.size()) {
    size_t comma = std::min(body.find(',', at), body.size());
    const std::string item = trim(body.substr(at, comma - at));
    at = comma + 1;
    if (item.empty() && comma == body.size() && out->empty()) break;  // "name{}"
    const size_t eq = item.find('=');
    if (eq == std::string::npos || trim(item.substr(0, eq)).empty()) {
      return bad_pipeline(
          text, "pass '" + pass + "': option '" + item + "' is not of the form key=value");
    }
    (*out)[trim(item.substr(0, eq))] = trim(item.substr(eq + 1));
  }
  return {};
}

}  // namespace

Result<std::vector<std::pair<std::string, PassOptions>>> split_pipeline(const std::string& text) {
  VKAD_ASSIGN_OR_RETURN(std::vector<std::string> specs, split_passes(text));
  std::vector<std::pair<std::string, PassOptions>> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string& spec = specs[i];
    const size_t brace = spec.find('{');
    const std::string name = trim(spec.substr(0, brace));
    if (name.empty()) {
      return bad_pipeline(text, "pass " + std::to_string(i + 1) + " has no name");
    }
    PassOptions options;
    if (brace != std::string::npos) {
      if (spec.back() != '}') return bad_pipeline(text, "text after the options of '" + name + "'");
      VKAD_TRY(
          parse_options(text, name, spec.substr(brace + 1, spec.size() - brace - 2), &options));
    }
    out.emplace_back(name, std::move(options));
  }
  return out;
}

Result<Pipeline> PassRegistry::parse_pipeline(const std::string& text, const Target& target) const {
  VKAD_ASSIGN_OR_RETURN(auto specs, split_pipeline(text));
  Pipeline pipeline(target);
  for (auto& [name, options] : specs) {
    auto it = passes_.find(name);
    if (it == passes_.end()) {
      std::string known;
      for (const auto& [n, e] : passes_) known += (known.empty() ? "" : ", ") + n;
      return bad_pipeline(text, "unknown pass '" + name + "' (known: " + known + ")");
    }
    Result<Pass> pass = it->second.factory(target, options);
    if (!pass.ok()) return bad_pipeline(text, pass.status().message());
    pipeline.add(std::move(pass).value());
  }
  return pipeline;
}

Result<uint32_t> uint_option(const std::string& pass, const PassOptions& options,
                             const std::string& key, uint32_t fallback) {
  auto it = options.find(key);
  if (it == options.end()) return fallback;
  const std::string& v = it->second;
  if (v.empty() || v.size() > 9 || !std::all_of(v.begin(), v.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      })) {
    return make_error(ErrorCode::kInvalidArgument, "pass '" + pass + "': option " + key + "=" + v +
                                                       " is not an unsigned number");
  }
  uint32_t n = 0;  // at most 9 digits: fits (from_chars, which throws nothing)
  std::from_chars(v.data(), v.data() + v.size(), n);
  return n;
}

Status only_options(const std::string& pass, const PassOptions& options,
                    const std::vector<std::string>& known) {
  for (const auto& [key, value] : options) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      return make_error(ErrorCode::kInvalidArgument,
                        "pass '" + pass + "' has no option '" + key + "'" +
                            (known.empty() ? " (it takes none)" : " (it takes " + list + ")"));
    }
  }
  return {};
}

}  // namespace vkad::codegen
