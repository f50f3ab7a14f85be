#include "abi/print_records.h"

#include <algorithm>
#include <charconv>
#include <cstring>

namespace vkad::abi {

namespace {

uint32_t value_words(DType t) { return t == DType::kF64 || t == DType::kI64 ? 2 : 1; }

std::string value_text(DType t, const uint32_t* w) {
  switch (t) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, w, 4);
      return print_value(t, f);
    }
    case DType::kF64: {
      double f;
      std::memcpy(&f, w, 8);
      return print_value(t, f);
    }
    case DType::kI32: return std::to_string(static_cast<int32_t>(*w));
    case DType::kU32: return std::to_string(*w);
    case DType::kI64: {
      int64_t v;
      std::memcpy(&v, w, 8);
      return std::to_string(v);
    }
    case DType::kBool: return *w != 0 ? "True" : "False";
  }
  return "?";
}

}  // namespace

std::string print_value(DType t, double v) {
  char buf[64];
  switch (t) {
    case DType::kF32:
      return std::string(buf, std::to_chars(buf, buf + sizeof buf, static_cast<float>(v)).ptr);
    case DType::kF64: return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
    case DType::kBool: return v != 0 ? "True" : "False";
    case DType::kI32:
    case DType::kU32:
    case DType::kI64: return std::to_string(static_cast<int64_t>(v));
  }
  return "?";
}

std::string print_text(const std::string& format, const std::vector<std::string>& values) {
  std::string text;
  size_t next = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format.compare(i, 2, "{}") == 0 && next < values.size()) {
      text += values[next++];
      ++i;
      continue;
    }
    text += format[i];
  }
  for (; next < values.size(); ++next) text += (text.empty() ? "" : " ") + values[next];
  return text;
}

std::string print_prefix(const std::string& kernel, const std::string& task,
                         const std::vector<int64_t>& index) {
  std::string out = "[kernel '" + kernel + "', task '" + task + "', thread (";
  for (size_t i = 0; i < index.size(); ++i) out += (i ? ", " : "") + std::to_string(index[i]);
  return out + ")] ";
}

uint32_t print_record_words(const PrintSite& site) {
  uint32_t n = 1 + site.dims;
  for (DType t : site.values) n += value_words(t);
  return n;
}

PrintArea read_print_area(const CompiledKernel& d, const std::byte* args) {
  PrintArea out;
  if (d.print_bytes == 0) return out;
  const std::byte* area = args + d.print_offset();
  uint32_t used = 0, dropped = 0;
  std::memcpy(&used, area, 4);
  std::memcpy(&dropped, area + 4, 4);
  out.dropped = dropped;
  const uint32_t capacity = d.print_bytes / 4 - kPrintHeaderWords;
  std::vector<uint32_t> words(std::min(used, capacity));
  if (!words.empty())
    std::memcpy(words.data(), area + size_t{4} * kPrintHeaderWords, 4 * words.size());
  size_t at = 0;
  while (at < words.size()) {
    const uint32_t task = words[at] >> 20, site = (words[at] & 0xfffff) - 1;
    if ((words[at] & 0xfffff) == 0 || task >= d.tasks.size() ||
        site >= d.tasks[task].print_sites.size())
      break;
    const PrintSite& s = d.tasks[task].print_sites[site];
    if (at + print_record_words(s) > words.size()) break;
    PrintRecord r;
    r.task = task;
    r.site = site;
    size_t w = at + 1;
    for (uint32_t k = 0; k < s.dims; ++k) r.index.push_back(static_cast<int32_t>(words[w++]));
    for (DType t : s.values) {
      r.values.push_back(value_text(t, &words[w]));
      w += value_words(t);
    }
    at = w;
    out.records.push_back(std::move(r));
  }
  return out;
}

std::string print_line(const CompiledKernel& d, const PrintRecord& r) {
  return print_prefix(d.name, d.tasks[r.task].name, r.index) +
         print_text(d.tasks[r.task].print_sites[r.site].format, r.values);
}

std::string assert_detail(const CompiledKernel& d, const std::byte* args, uint32_t task,
                          uint32_t site) {
  for (const PrintRecord& r : read_print_area(d, args).records) {
    if (r.task != task || r.site != site) continue;
    std::string out = "thread (";
    for (size_t i = 0; i < r.index.size(); ++i) out += (i ? ", " : "") + std::to_string(r.index[i]);
    out += ")";
    for (size_t i = 0; i < r.values.size(); ++i) out += (i ? ", " : " with ") + r.values[i];
    return out;
  }
  return "";
}

}  // namespace vkad::abi
