#include "abi/kernel_abi.h"

#include <algorithm>
#include <cstring>

namespace vkad::abi {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kI32: return "i32";
    case DType::kU32: return "u32";
    case DType::kI64: return "i64";
    case DType::kBool: return "bool";
  }
  return "?";
}

bool valid_dtype(DType t) { return static_cast<uint8_t>(t) <= static_cast<uint8_t>(DType::kBool); }

uint32_t dtype_bytes(DType t) { return (t == DType::kF64 || t == DType::kI64) ? 8 : 4; }

namespace {
uint32_t align_up(uint32_t v, uint32_t a) { return (v + a - 1) / a * a; }
}  // namespace

uint32_t CompiledKernel::scalar_offset(uint32_t param) const {
  uint32_t off = 0;
  for (uint32_t i = 0; i < params.size(); ++i) {
    if (params[i].kind != ParamKind::kScalar) continue;
    uint32_t b = dtype_bytes(params[i].dtype);
    off = align_up(off, b);
    if (i == param) return off;
    off += b;
  }
  return off;
}

uint32_t CompiledKernel::shape_offset(uint32_t param) const {
  uint32_t off = align_up(scalar_offset(static_cast<uint32_t>(params.size())), 4);
  for (uint32_t i = 0; i < params.size(); ++i) {
    if (params[i].kind != ParamKind::kNdArray) continue;
    if (i == param) return off;
    off += 4 * params[i].rank;
  }
  return off;
}

uint32_t CompiledKernel::error_flag_offset(uint32_t task) const {
  return shape_offset(static_cast<uint32_t>(params.size())) + 4 * task;
}

uint32_t CompiledKernel::adstack_args_offset(uint32_t task) const {
  uint32_t off = error_flag_offset(static_cast<uint32_t>(tasks.size()));
  for (uint32_t t = 0; t < task && t < tasks.size(); ++t) {
    off += 4 * adstack::args_words(tasks[t].adstacks.size());
  }
  return off;
}

bool CompiledKernel::has_adstacks() const {
  for (const auto& t : tasks) {
    if (!t.adstacks.empty()) return true;
  }
  return false;
}

uint32_t CompiledKernel::binding_count() const {
  return 1 + array_count() + (has_adstacks() ? adstack::kHeapCount : 0);
}

uint32_t CompiledKernel::print_offset() const {
  return align_up(adstack_args_offset(static_cast<uint32_t>(tasks.size())), 16);
}

uint32_t CompiledKernel::args_bytes() const { return print_offset() + align_up(print_bytes, 16); }

uint32_t CompiledKernel::array_count() const {
  uint32_t n = 0;
  for (const auto& p : params) n += p.kind == ParamKind::kNdArray;
  return n;
}

uint64_t CompiledKernel::content_hash() const {
  // FNV-1a over a canonical serialisation.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(params.size());
  for (const auto& p : params) {
    mix(static_cast<uint64_t>(p.kind) << 16 | static_cast<uint64_t>(p.dtype) << 8 | p.rank);
  }
  mix(tasks.size());
  for (const auto& t : tasks) {
    mix(t.local_size);
    mix(t.serial);
    mix(t.adstacks.size());
    for (const auto& st : t.adstacks) mix(static_cast<uint64_t>(st.heap));
    mix(t.spirv.size());
    for (uint32_t w : t.spirv) mix(w);
    mix(t.spec_words.size());
    for (uint32_t w : t.spec_words) mix(w);
  }
  mix(print_bytes);
  return h;
}

bool same_pipelines(const CompiledKernel& a, const CompiledKernel& b) {
  if (a.params.size() != b.params.size() || a.tasks.size() != b.tasks.size() ||
      a.print_bytes != b.print_bytes)
    return false;
  for (size_t i = 0; i < a.params.size(); ++i) {
    const KernelParam &p = a.params[i], &q = b.params[i];
    if (p.kind != q.kind || p.dtype != q.dtype || p.rank != q.rank) return false;
  }
  for (size_t i = 0; i < a.tasks.size(); ++i) {
    const CompiledTask &t = a.tasks[i], &u = b.tasks[i];
    if (t.local_size != u.local_size || t.serial != u.serial || t.spirv != u.spirv ||
        t.adstacks.size() != u.adstacks.size() || t.spec_words != u.spec_words) {
      return false;
    }
    for (size_t k = 0; k < t.adstacks.size(); ++k) {
      if (t.adstacks[k].heap != u.adstacks[k].heap) return false;
    }
  }
  return true;
}

void encode_args(const CompiledKernel& d, const std::vector<ScalarValue>& scalars,
                 const std::vector<const std::vector<uint32_t>*>& shapes,
                 const std::vector<std::vector<uint32_t>>& adstack_words, std::byte* dst) {
  // One pass with a running offset, every byte written once (padding zeroed as it is passed):
  // the layout scalar_offset, shape_offset, adstack_args_offset and args_bytes give, without
  // their scans from the first parameter (quadratic in the parameters, at every launch).
  uint32_t off = 0;
  auto zero = [&](uint32_t bytes) {
    if (bytes == 0) return;  // the usual case: no call
    std::memset(dst + off, 0, bytes);
    off += bytes;
  };
  for (uint32_t i = 0; i < d.params.size(); ++i) {
    const KernelParam& p = d.params[i];
    if (p.kind != ParamKind::kScalar) continue;
    const uint32_t b = dtype_bytes(p.dtype);
    zero(align_up(off, b) - off);
    std::byte* at = dst + off;
    off += b;
    const ScalarValue& a = scalars[i];
    switch (p.dtype) {
      case DType::kF32: {
        float v = static_cast<float>(a.f);
        std::memcpy(at, &v, 4);
        break;
      }
      case DType::kF64: std::memcpy(at, &a.f, 8); break;
      case DType::kI64: std::memcpy(at, &a.i, 8); break;
      default: {
        uint32_t v = static_cast<uint32_t>(a.i);
        std::memcpy(at, &v, 4);
        break;
      }
    }
  }
  zero(align_up(off, 4) - off);
  for (uint32_t i = 0; i < d.params.size(); ++i) {
    const KernelParam& p = d.params[i];
    if (p.kind != ParamKind::kNdArray) continue;
    // shape.size() == p.rank (checked by the runtime): words past it would be zero.
    const std::vector<uint32_t>& shape = *shapes[i];
    const uint32_t n = std::min(static_cast<uint32_t>(shape.size()), p.rank);
    std::memcpy(dst + off, shape.data(), size_t{4} * n);
    off += 4 * n;
    zero(4 * (p.rank - n));
  }
  zero(4 * static_cast<uint32_t>(d.tasks.size()));  // the error words
  for (uint32_t t = 0; t < d.tasks.size(); ++t) {
    const uint32_t words = adstack::args_words(d.tasks[t].adstacks.size());
    const uint32_t given = t < adstack_words.size()
                               ? std::min(static_cast<uint32_t>(adstack_words[t].size()), words)
                               : 0;
    if (given != 0) std::memcpy(dst + off, adstack_words[t].data(), size_t{4} * given);
    off += 4 * given;
    zero(4 * (words - given));
  }
  zero(align_up(off, 16) - off);
  zero(align_up(d.print_bytes, 16));  // the print area: nothing recorded, nothing dropped
}

}  // namespace vkad::abi
