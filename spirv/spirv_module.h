// SpirvModule: assembles a SPIR-V binary word by word, in the section order the spec requires,
// with types and constants de-duplicated. It knows nothing about the kernel IR; the emitter
// (spirv_emitter.cpp) drives it. Internal to spirv/.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <set>
#include <spirv/unified1/spirv.hpp>
#include <string>
#include <vector>

namespace vkad::codegen {

class SpirvModule {
 public:
  using Words = std::vector<uint32_t>;

  uint32_t id() { return next_id_++; }

  void capability(spv::Capability c);
  void extension(const std::string& name);
  // SignedZeroInfNanPreserve execution modes for 32 / 64-bit floats (64 only if the module
  // uses f64), written by finish().
  void preserve_nan_inf(bool f32, bool f64) { preserve32_ = f32, preserve64_ = f64; }
  uint32_t glsl_std_450();

  // Types (de-duplicated).
  uint32_t t_void();
  uint32_t t_bool();
  uint32_t t_int(uint32_t width, bool is_signed);
  uint32_t t_float(uint32_t width);
  uint32_t t_vector(uint32_t elem, uint32_t n);
  uint32_t t_pointer(spv::StorageClass sc, uint32_t type);
  uint32_t t_function(uint32_t ret);
  // A runtime array decorated with `stride`, wrapped in a Block struct (member 0, offset 0):
  // the shape of every storage buffer the kernel ABI uses.
  uint32_t t_buffer_block(uint32_t elem, uint32_t stride);
  // A Block struct of u32 members at offsets 0, 4, ... (the push constants).
  uint32_t t_u32_block(uint32_t members);
  // OpTypeArray of `length_id` elements: a constant or a specialization constant id.
  uint32_t t_array(uint32_t elem, uint32_t length_id);

  // Constants (de-duplicated).
  uint32_t c_u32(uint32_t v);
  uint32_t c_i32(int32_t v);
  uint32_t c_f32(float v);
  uint32_t c_f64(double v);
  uint32_t c_u64(uint64_t v);
  uint32_t c_i64(int64_t v);
  uint32_t c_bool(bool v);
  // Specialization constants, decorated SpecId `spec_id`; never de-duplicated (each id is its
  // own constant, whatever its default).
  uint32_t spec_u32(uint32_t spec_id, uint32_t default_value);
  uint32_t spec_bool(uint32_t spec_id, bool default_value);

  // A module-scope variable; `binding` >= 0 decorates it with set 0 / that binding.
  uint32_t global_variable(uint32_t pointer_type, spv::StorageClass sc, int binding = -1);
  void decorate(uint32_t target, spv::Decoration d, std::initializer_list<uint32_t> extra = {});
  void name(uint32_t target, const std::string& n);

  // Function body code: instructions go to the function section.
  void op(spv::Op op, std::initializer_list<uint32_t> operands);
  void op(spv::Op op, const Words& operands);
  // An OpVariable in Function storage, placed in the entry block whatever the call site.
  uint32_t function_variable(uint32_t pointee);
  void label(uint32_t l);
  // True when nothing followed the last label(): its block has no instruction yet.
  bool block_empty() const { return code_.size() == label_end_; }

  // The finished binary: `entry` is a function id already emitted with OpFunction..OpFunctionEnd
  // through op(); its entry block's label must be `entry_label` (function variables go there).
  Words finish(uint32_t entry, uint32_t entry_label, const std::vector<uint32_t>& interface,
               uint32_t local_size);

 private:
  static void put(Words& sec, spv::Op op, const Words& operands);
  static Words string_words(const std::string& s);
  uint32_t typed(spv::Op op, const Words& operands, Words* section);

  uint32_t next_id_ = 1;
  uint32_t glsl_ = 0;
  size_t entry_pos_ = 0;
  size_t label_end_ = 0;  // code_.size() right after the last label()
  std::set<uint32_t> caps_;
  std::set<std::string> exts_;
  bool preserve32_ = false, preserve64_ = false;
  Words debug_, annotations_, globals_, code_, vars_;
  std::map<Words, uint32_t> dedupe_;
};

}  // namespace vkad::codegen
