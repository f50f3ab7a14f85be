#include "spirv/launch_spec.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace vkad::codegen {

namespace {

void index_defs(const Block& b, std::unordered_map<ValueId, const Stmt*>* defs) {
  for (const Stmt& s : b.stmts) {
    if (s.result != kNoValue) (*defs)[s.result] = &s;
    for (const Block& c : s.blocks) index_defs(c, defs);
  }
}

bool word_sized_int(DType t) { return t == DType::kI32 || t == DType::kU32; }

// The launch-constant words `v` is computed from, into *out. Loads, locals, stack reads and
// loop indices end the walk: they are not launch constants.
void trace(const Kernel& k, const abi::CompiledKernel& layout,
           const std::unordered_map<ValueId, const Stmt*>& defs, ValueId v,
           std::unordered_set<ValueId>* seen, std::vector<uint32_t>* out) {
  if (!seen->insert(v).second) return;
  auto it = defs.find(v);
  if (it == defs.end()) return;
  const Stmt& s = *it->second;
  if (s.op == Op::kArg && word_sized_int(k.params[s.param].dtype))
    out->push_back(layout.scalar_offset(s.param));
  if (s.op == Op::kShape) out->push_back(layout.shape_offset(s.param) + 4 * s.dim);
  if (op_info(s.op).family == OpFamily::kLeaf || !is_pure_value(s.op)) return;
  for (ValueId a : s.args) trace(k, layout, defs, a, seen, out);
}

void loop_bounds(const Kernel& k, const abi::CompiledKernel& layout,
                 const std::unordered_map<ValueId, const Stmt*>& defs, const Block& b,
                 std::unordered_set<ValueId>* seen, std::vector<uint32_t>* out) {
  for (const Stmt& s : b.stmts) {
    if (s.op == Op::kFor) {
      for (ValueId a : s.args) trace(k, layout, defs, a, seen, out);
    }
    for (const Block& c : s.blocks) loop_bounds(k, layout, defs, c, seen, out);
  }
}

// The extent words of every array `b` accesses (those the emitter loads as shapes).
void array_extents(const Kernel& k, const abi::CompiledKernel& layout, const Block& b,
                   std::vector<uint32_t>* out) {
  for (const Stmt& s : b.stmts) {
    if (s.op == Op::kShape || accesses_array(s.op)) {
      for (uint32_t d = 0; d < k.params[s.param].rank; ++d) {
        out->push_back(layout.shape_offset(s.param) + 4 * d);
      }
    }
    for (const Block& c : s.blocks) array_extents(k, layout, c, out);
  }
}

}  // namespace

std::vector<uint32_t> launch_spec_words(const Kernel& k, size_t task,
                                        const abi::CompiledKernel& layout, bool shapes) {
  const abi::CompiledTask& ct = layout.tasks.at(task);
  if (ct.adstacks.empty() && !shapes) return {};
  std::vector<uint32_t> stack_words;
  if (!ct.adstacks.empty()) {
    const uint32_t base = layout.adstack_args_offset(static_cast<uint32_t>(task));
    for (uint32_t s = 0; s < ct.adstacks.size(); ++s) {
      stack_words.push_back(base + 4 * adstack::offset_word(s));
      stack_words.push_back(base + 4 * adstack::capacity_word(s));
    }
  }
  std::unordered_map<ValueId, const Stmt*> defs;
  index_defs(k.tasks[task].body, &defs);
  std::unordered_set<ValueId> seen;
  std::vector<uint32_t> bound_words;
  loop_bounds(k, layout, defs, k.tasks[task].body, &seen, &bound_words);
  if (shapes) array_extents(k, layout, k.tasks[task].body, &bound_words);
  std::sort(bound_words.begin(), bound_words.end());
  bound_words.erase(std::unique(bound_words.begin(), bound_words.end()), bound_words.end());
  std::vector<uint32_t> words = std::move(stack_words);
  for (uint32_t w : bound_words) words.push_back(w);
  if (words.size() > abi::kMaxSpecWords) words.resize(abi::kMaxSpecWords);
  std::sort(words.begin(), words.end());
  return words;
}

}  // namespace vkad::codegen
