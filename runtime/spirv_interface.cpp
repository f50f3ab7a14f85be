#include "runtime/spirv_interface.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "abi/spirv_tools.h"

namespace vkad::runtime {

namespace {

// The few SPIR-V numbers the interface check reads (SPIR-V 1.5 specification, section 3).
enum : uint32_t {
  kOpEntryPoint = 15,
  kOpExecutionMode = 16,
  kOpTypeInt = 21,
  kOpTypeFloat = 22,
  kOpTypeVector = 23,
  kOpTypeArray = 28,
  kOpTypeStruct = 30,
  kOpTypePointer = 32,
  kOpConstant = 43,
  kOpVariable = 59,
  kOpDecorate = 71,
  kOpMemberDecorate = 72,
  kExecModelGLCompute = 5,
  kModeLocalSize = 17,
  kModeLocalSizeId = 38,
  kDecorationArrayStride = 6,
  kDecorationBinding = 33,
  kDecorationDescriptorSet = 34,
  kDecorationOffset = 35,
  kStorageUniformConstant = 0,
  kStorageUniform = 2,
  kStoragePushConstant = 9,
  kStorageStorageBuffer = 12,
};

struct Type {
  uint32_t op = 0;
  std::vector<uint32_t> operands;  // after the result id
};

class Reader {
 public:
  explicit Reader(const std::vector<uint32_t>& w) {
    // Header: magic, version, generator, bound, schema. The module has passed the validator,
    // so every instruction's word count is sane.
    for (size_t i = 5; i < w.size();) {
      uint32_t count = w[i] >> 16, op = w[i] & 0xffff;
      if (count == 0 || i + count > w.size()) break;
      std::vector<uint32_t> ops(w.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                                w.begin() + static_cast<std::ptrdiff_t>(i + count));
      take(op, ops);
      i += count;
    }
  }

  struct Variable {
    uint32_t id, pointer_type, storage;
  };
  std::vector<std::pair<uint32_t, std::string>> entry_points;      // GLCompute (id, name)
  std::unordered_map<uint32_t, std::vector<uint32_t>> local_size;  // entry id -> x y z
  std::vector<uint32_t> local_size_id_entries;
  std::vector<Variable> variables;
  std::unordered_map<uint32_t, std::unordered_map<uint32_t, uint32_t>>
      decorations;  // id -> dec -> value
  std::unordered_map<uint32_t, std::unordered_map<uint32_t, uint32_t>> member_offsets;
  std::unordered_map<uint32_t, Type> types;
  std::unordered_map<uint32_t, uint32_t> constants;  // 32-bit integer constants (array lengths)

  // Bytes a push-constant type occupies: enough for scalars, vectors, arrays and structs.
  uint64_t size_of(uint32_t id, int depth = 0) const {
    auto it = types.find(id);
    if (it == types.end() || depth > 16) return UINT32_MAX;  // unknown: reported as too big
    const Type& t = it->second;
    switch (t.op) {
      case kOpTypeInt:
      case kOpTypeFloat: return t.operands.at(0) / 8;
      case kOpTypeVector: return size_of(t.operands.at(0), depth + 1) * t.operands.at(1);
      case kOpTypeArray: {
        auto len = constants.find(t.operands.at(1));
        uint64_t n = len == constants.end() ? UINT32_MAX : len->second;
        uint64_t stride = decoration(id, kDecorationArrayStride);
        return stride * n;
      }
      case kOpTypeStruct: {
        uint64_t end = 0;
        for (uint32_t m = 0; m < t.operands.size(); ++m) {
          auto mo = member_offsets.find(id);
          uint64_t off = 0;
          if (mo != member_offsets.end() && mo->second.count(m)) off = mo->second.at(m);
          end = std::max(end, off + size_of(t.operands[m], depth + 1));
        }
        return end;
      }
      default: return UINT32_MAX;
    }
  }
  uint32_t decoration(uint32_t id, uint32_t dec, uint32_t fallback = 0) const {
    auto it = decorations.find(id);
    if (it == decorations.end()) return fallback;
    auto d = it->second.find(dec);
    return d == it->second.end() ? fallback : d->second;
  }
  bool decorated(uint32_t id, uint32_t dec) const {
    auto it = decorations.find(id);
    return it != decorations.end() && it->second.count(dec);
  }

 private:
  void take_entry_point(const std::vector<uint32_t>& o) {
    if (o.size() < 3 || o[0] != kExecModelGLCompute) return;
    const char* s = reinterpret_cast<const char*>(o.data() + 2);
    const size_t max = 4 * (o.size() - 2);
    entry_points.emplace_back(o[1], std::string(s, strnlen(s, max)));
  }
  void take_execution_mode(const std::vector<uint32_t>& o) {
    if (o.size() >= 5 && o[1] == kModeLocalSize) local_size[o[0]] = {o[2], o[3], o[4]};
    if (o.size() >= 2 && o[1] == kModeLocalSizeId) local_size_id_entries.push_back(o[0]);
  }
  void take(uint32_t op, const std::vector<uint32_t>& o) {
    switch (op) {
      case kOpEntryPoint: take_entry_point(o); break;
      case kOpExecutionMode: take_execution_mode(o); break;
      case kOpTypeInt:
      case kOpTypeFloat:
      case kOpTypeVector:
      case kOpTypeArray:
      case kOpTypeStruct:
      case kOpTypePointer:
        if (!o.empty()) types[o[0]] = Type{op, {o.begin() + 1, o.end()}};
        break;
      case kOpConstant:
        if (o.size() >= 3) constants[o[1]] = o[2];
        break;
      case kOpVariable:
        if (o.size() >= 3) variables.push_back({o[1], o[0], o[2]});
        break;
      case kOpDecorate:
        if (o.size() >= 2) decorations[o[0]][o[1]] = o.size() >= 3 ? o[2] : 0;
        break;
      case kOpMemberDecorate:
        if (o.size() >= 4 && o[2] == kDecorationOffset) member_offsets[o[0]][o[1]] = o[3];
        break;
      default: break;
    }
  }
};

}  // namespace

Status check_module(const std::vector<uint32_t>& words, const ModuleInterface& expected,
                    const std::string& where) {
  auto fail = [&](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, where + ": " + what);
  };
  if (words.size() < 5 || words[0] != 0x07230203) {
    return fail("SPIR-V module of " + std::to_string(words.size()) +
                " words has no SPIR-V header (magic number 0x07230203)");
  }
  if (Status v = codegen::validate_spirv_once(words); !v.ok()) {
    // The validator's report carries the disassembly; a foreign module is the caller's fault.
    return fail("SPIR-V module does not validate: " + v.message());
  }
  Reader r(words);
  auto entry = std::find_if(r.entry_points.begin(), r.entry_points.end(),
                            [&](const auto& e) { return e.second == expected.entry_point; });
  if (entry == r.entry_points.end()) {
    return fail("SPIR-V module has no GLCompute entry point '" + expected.entry_point + "'");
  }
  auto ls = r.local_size.find(entry->first);
  if (ls == r.local_size.end()) {
    return fail("SPIR-V module sets no LocalSize (LocalSizeId is not supported)");
  }
  if (ls->second != std::vector<uint32_t>{expected.local_size, 1, 1}) {
    return fail("SPIR-V module has LocalSize " + std::to_string(ls->second[0]) + " " +
                std::to_string(ls->second[1]) + " " + std::to_string(ls->second[2]) +
                ", the task declares local_size " + std::to_string(expected.local_size) +
                " (the module must use (" + std::to_string(expected.local_size) + ", 1, 1))");
  }
  for (const Reader::Variable& v : r.variables) {
    bool resource =
        r.decorated(v.id, kDecorationBinding) || r.decorated(v.id, kDecorationDescriptorSet);
    std::string name = "%" + std::to_string(v.id);
    if (v.storage == kStoragePushConstant) {
      auto ptr = r.types.find(v.pointer_type);
      uint64_t bytes = ptr == r.types.end() || ptr->second.operands.size() < 2
                           ? UINT32_MAX
                           : r.size_of(ptr->second.operands[1]);
      if (bytes > expected.push_constant_bytes) {
        return fail("SPIR-V push-constant block " + name + " is " + std::to_string(bytes) +
                    " bytes, the kernel ABI passes " +
                    std::to_string(expected.push_constant_bytes) + " ({u32 begin, u32 end})");
      }
      continue;
    }
    if (!resource) {
      if (v.storage == kStorageStorageBuffer || v.storage == kStorageUniform ||
          v.storage == kStorageUniformConstant) {
        return fail("SPIR-V resource variable " + name + " has no DescriptorSet/Binding");
      }
      continue;
    }
    uint32_t set = r.decoration(v.id, kDecorationDescriptorSet);
    uint32_t binding = r.decoration(v.id, kDecorationBinding);
    std::string at = "SPIR-V variable " + name + " (set " + std::to_string(set) + ", binding " +
                     std::to_string(binding) + ")";
    if (set != 0) return fail(at + ": the kernel ABI uses descriptor set 0 only");
    if (binding >= expected.storage_buffer_count) {
      return fail(at + ": the kernel declares " + std::to_string(expected.storage_buffer_count) +
                  " bindings (args, its ndarrays, adstack heaps), so bindings 0 to " +
                  std::to_string(expected.storage_buffer_count - 1) + " exist");
    }
    if (v.storage != kStorageStorageBuffer) {
      return fail(at +
                  ": is not in the StorageBuffer storage class; every binding of the "
                  "kernel ABI is a storage buffer");
    }
  }
  return {};
}

std::set<uint32_t> declared_spec_ids(const std::vector<uint32_t>& words) {
  constexpr uint32_t kDecorationSpecId = 1;
  std::set<uint32_t> ids;
  for (size_t i = 5; i < words.size();) {
    uint32_t count = words[i] >> 16, op = words[i] & 0xffff;
    if (count == 0 || i + count > words.size()) break;
    if (op == kOpDecorate && count == 4 && words[i + 2] == kDecorationSpecId)
      ids.insert(words[i + 3]);
    i += count;
  }
  return ids;
}

bool declares_spec_id(const std::vector<uint32_t>& words, uint32_t spec_id) {
  return declared_spec_ids(words).count(spec_id) != 0;
}

}  // namespace vkad::runtime
