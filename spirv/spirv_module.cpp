#include "spirv/spirv_module.h"

#include <cstring>

namespace vkad::codegen {

void SpirvModule::put(Words& sec, spv::Op op, const Words& operands) {
  sec.push_back(static_cast<uint32_t>(operands.size() + 1) << 16 | static_cast<uint32_t>(op));
  sec.insert(sec.end(), operands.begin(), operands.end());
}

SpirvModule::Words SpirvModule::string_words(const std::string& s) {
  Words w((s.size() + 4) / 4, 0);  // nul-terminated, zero-padded
  std::memcpy(w.data(), s.data(), s.size());
  return w;
}

void SpirvModule::capability(spv::Capability c) { caps_.insert(static_cast<uint32_t>(c)); }
void SpirvModule::extension(const std::string& n) { exts_.insert(n); }

uint32_t SpirvModule::glsl_std_450() {
  if (!glsl_) glsl_ = id();
  return glsl_;
}

// Types and constants are keyed by (opcode, operands without the result id).
uint32_t SpirvModule::typed(spv::Op op, const Words& operands, Words* section) {
  Words key = {static_cast<uint32_t>(op)};
  key.insert(key.end(), operands.begin(), operands.end());
  auto it = dedupe_.find(key);
  if (it != dedupe_.end()) return it->second;
  uint32_t r = id();
  Words w = operands;
  // Result-type-first instructions (constants) put the result id second.
  bool has_type = op == spv::OpConstant || op == spv::OpConstantTrue || op == spv::OpConstantFalse;
  w.insert(w.begin() + (has_type ? 1 : 0), r);
  put(*section, op, w);
  dedupe_.emplace(std::move(key), r);
  return r;
}

uint32_t SpirvModule::t_void() { return typed(spv::OpTypeVoid, {}, &globals_); }
uint32_t SpirvModule::t_bool() { return typed(spv::OpTypeBool, {}, &globals_); }
uint32_t SpirvModule::t_int(uint32_t w, bool s) {
  if (w == 64) capability(spv::CapabilityInt64);
  return typed(spv::OpTypeInt, {w, s ? 1u : 0u}, &globals_);
}
uint32_t SpirvModule::t_float(uint32_t w) {
  if (w == 64) capability(spv::CapabilityFloat64);
  return typed(spv::OpTypeFloat, {w}, &globals_);
}
uint32_t SpirvModule::t_vector(uint32_t e, uint32_t n) {
  return typed(spv::OpTypeVector, {e, n}, &globals_);
}
uint32_t SpirvModule::t_pointer(spv::StorageClass sc, uint32_t t) {
  return typed(spv::OpTypePointer, {static_cast<uint32_t>(sc), t}, &globals_);
}
uint32_t SpirvModule::t_function(uint32_t ret) {
  return typed(spv::OpTypeFunction, {ret}, &globals_);
}

uint32_t SpirvModule::t_buffer_block(uint32_t elem, uint32_t stride) {
  // Keyed on a pseudo-op so the decorated array and struct are made once per (elem, stride).
  Words key = {0xffff0001u, elem, stride};
  auto it = dedupe_.find(key);
  if (it != dedupe_.end()) return it->second;
  uint32_t arr = id();
  put(globals_, spv::OpTypeRuntimeArray, {arr, elem});
  decorate(arr, spv::DecorationArrayStride, {stride});
  uint32_t st = id();
  put(globals_, spv::OpTypeStruct, {st, arr});
  decorate(st, spv::DecorationBlock);
  put(annotations_, spv::OpMemberDecorate,
      {st, 0, static_cast<uint32_t>(spv::DecorationOffset), 0});
  dedupe_.emplace(std::move(key), st);
  return st;
}

uint32_t SpirvModule::t_u32_block(uint32_t members) {
  Words key = {0xffff0002u, members};
  auto it = dedupe_.find(key);
  if (it != dedupe_.end()) return it->second;
  uint32_t u = t_int(32, false);
  uint32_t st = id();
  Words w = {st};
  for (uint32_t i = 0; i < members; ++i) w.push_back(u);
  put(globals_, spv::OpTypeStruct, w);
  decorate(st, spv::DecorationBlock);
  for (uint32_t i = 0; i < members; ++i) {
    put(annotations_, spv::OpMemberDecorate,
        {st, i, static_cast<uint32_t>(spv::DecorationOffset), 4 * i});
  }
  dedupe_.emplace(std::move(key), st);
  return st;
}

uint32_t SpirvModule::t_array(uint32_t elem, uint32_t length_id) {
  return typed(spv::OpTypeArray, {elem, length_id}, &globals_);
}

uint32_t SpirvModule::spec_u32(uint32_t spec_id, uint32_t default_value) {
  uint32_t r = id();
  put(globals_, spv::OpSpecConstant, {t_int(32, false), r, default_value});
  decorate(r, spv::DecorationSpecId, {spec_id});
  return r;
}

uint32_t SpirvModule::spec_bool(uint32_t spec_id, bool default_value) {
  uint32_t r = id();
  put(globals_, default_value ? spv::OpSpecConstantTrue : spv::OpSpecConstantFalse, {t_bool(), r});
  decorate(r, spv::DecorationSpecId, {spec_id});
  return r;
}

uint32_t SpirvModule::c_u32(uint32_t v) {
  return typed(spv::OpConstant, {t_int(32, false), v}, &globals_);
}
uint32_t SpirvModule::c_i32(int32_t v) {
  return typed(spv::OpConstant, {t_int(32, true), static_cast<uint32_t>(v)}, &globals_);
}
uint32_t SpirvModule::c_f32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return typed(spv::OpConstant, {t_float(32), bits}, &globals_);
}
uint32_t SpirvModule::c_f64(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  return typed(spv::OpConstant,
               {t_float(64), static_cast<uint32_t>(bits), static_cast<uint32_t>(bits >> 32)},
               &globals_);
}
uint32_t SpirvModule::c_u64(uint64_t v) {
  return typed(spv::OpConstant,
               {t_int(64, false), static_cast<uint32_t>(v), static_cast<uint32_t>(v >> 32)},
               &globals_);
}
uint32_t SpirvModule::c_i64(int64_t v) {
  uint64_t u = static_cast<uint64_t>(v);
  return typed(spv::OpConstant,
               {t_int(64, true), static_cast<uint32_t>(u), static_cast<uint32_t>(u >> 32)},
               &globals_);
}
uint32_t SpirvModule::c_bool(bool v) {
  return typed(v ? spv::OpConstantTrue : spv::OpConstantFalse, {t_bool()}, &globals_);
}

uint32_t SpirvModule::global_variable(uint32_t ptr, spv::StorageClass sc, int binding) {
  uint32_t v = id();
  put(globals_, spv::OpVariable, {ptr, v, static_cast<uint32_t>(sc)});
  if (binding >= 0) {
    decorate(v, spv::DecorationDescriptorSet, {0});
    decorate(v, spv::DecorationBinding, {static_cast<uint32_t>(binding)});
  }
  return v;
}

void SpirvModule::decorate(uint32_t target, spv::Decoration d,
                           std::initializer_list<uint32_t> extra) {
  Words w = {target, static_cast<uint32_t>(d)};
  w.insert(w.end(), extra.begin(), extra.end());
  put(annotations_, spv::OpDecorate, w);
}

void SpirvModule::name(uint32_t target, const std::string& n) {
  Words w = {target};
  Words s = string_words(n);
  w.insert(w.end(), s.begin(), s.end());
  put(debug_, spv::OpName, w);
}

void SpirvModule::op(spv::Op o, std::initializer_list<uint32_t> operands) {
  put(code_, o, Words(operands));
}
void SpirvModule::op(spv::Op o, const Words& operands) { put(code_, o, operands); }

uint32_t SpirvModule::function_variable(uint32_t pointee) {
  uint32_t v = id();
  put(vars_, spv::OpVariable,
      {t_pointer(spv::StorageClassFunction, pointee), v,
       static_cast<uint32_t>(spv::StorageClassFunction)});
  return v;
}

void SpirvModule::label(uint32_t l) {
  op(spv::OpLabel, {l});
  if (entry_pos_ == 0) entry_pos_ = code_.size();  // the first label opens the entry block
  label_end_ = code_.size();
}

SpirvModule::Words SpirvModule::finish(uint32_t entry, uint32_t entry_label,
                                       const std::vector<uint32_t>& interface,
                                       uint32_t local_size) {
  Words out = {spv::MagicNumber, 0x00010300u, 0u, 0u, 0u};
  capability(spv::CapabilityShader);
  const bool uses_f64 = caps_.count(static_cast<uint32_t>(spv::CapabilityFloat64)) != 0;
  std::vector<uint32_t> preserve_widths;
  if (preserve32_) preserve_widths.push_back(32);
  if (preserve64_ && uses_f64) preserve_widths.push_back(64);
  if (!preserve_widths.empty()) {
    extension("SPV_KHR_float_controls");
    capability(spv::CapabilitySignedZeroInfNanPreserve);
  }
  for (uint32_t c : caps_) put(out, spv::OpCapability, {c});
  for (const std::string& e : exts_) put(out, spv::OpExtension, string_words(e));
  if (glsl_) {
    Words w = {glsl_};
    Words s = string_words("GLSL.std.450");
    w.insert(w.end(), s.begin(), s.end());
    put(out, spv::OpExtInstImport, w);
  }
  put(out, spv::OpMemoryModel, {spv::AddressingModelLogical, spv::MemoryModelGLSL450});
  Words ep = {spv::ExecutionModelGLCompute, entry};
  Words main = string_words("main");
  ep.insert(ep.end(), main.begin(), main.end());
  ep.insert(ep.end(), interface.begin(), interface.end());
  put(out, spv::OpEntryPoint, ep);
  put(out, spv::OpExecutionMode, {entry, spv::ExecutionModeLocalSize, local_size, 1, 1});
  for (uint32_t w : preserve_widths) {
    put(out, spv::OpExecutionMode, {entry, spv::ExecutionModeSignedZeroInfNanPreserve, w});
  }
  out.insert(out.end(), debug_.begin(), debug_.end());
  out.insert(out.end(), annotations_.begin(), annotations_.end());
  out.insert(out.end(), globals_.begin(), globals_.end());
  // Splice the function variables in right after the entry block's label.
  (void)entry_label;
  size_t pos = entry_pos_;
  out.insert(out.end(), code_.begin(), code_.begin() + static_cast<std::ptrdiff_t>(pos));
  out.insert(out.end(), vars_.begin(), vars_.end());
  out.insert(out.end(), code_.begin() + static_cast<std::ptrdiff_t>(pos), code_.end());
  out[3] = next_id_;  // bound
  return out;
}

}  // namespace vkad::codegen
