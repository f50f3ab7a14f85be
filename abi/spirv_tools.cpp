#include "abi/spirv_tools.h"

#include <mutex>
#include <spirv-tools/libspirv.hpp>
#include <unordered_set>

namespace vkad::abi {

namespace {
constexpr spv_target_env kEnv = SPV_ENV_VULKAN_1_2;

void collect_messages(spvtools::SpirvTools& tools, std::string* log) {
  tools.SetMessageConsumer(
      [log](spv_message_level_t, const char*, const spv_position_t& pos, const char* msg) {
        *log += "line " + std::to_string(pos.line) + ", instruction " + std::to_string(pos.index) +
                ": " + msg + "\n";
      });
}
}  // namespace

std::string disassemble_spirv(const std::vector<uint32_t>& words) {
  spvtools::SpirvTools tools(kEnv);
  std::string text;
  if (!tools.Disassemble(words, &text, SPV_BINARY_TO_TEXT_OPTION_FRIENDLY_NAMES)) {
    return "(module does not disassemble)";
  }
  return text;
}

namespace {
// Modules that passed validation in this process, by content: register_kernel checks every
// module (it cannot tell ours from foreign ones), and a module compile() just validated should
// not pay twice. Keyed by a 64-bit FNV-1a hash plus the length; bounded (cleared when
// full), so a fuzzer or a long session cannot grow it without limit.
std::mutex g_validated_mu;
std::unordered_set<uint64_t> g_validated;
constexpr size_t kValidatedCap = 1 << 14;

uint64_t module_key(const std::vector<uint32_t>& words) {
  uint64_t h = 1469598103934665603ull ^ words.size();
  for (uint32_t w : words) {
    for (int i = 0; i < 4; ++i) {
      h ^= (w >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}
}  // namespace

Status validate_spirv_once(const std::vector<uint32_t>& words) {
  {
    std::lock_guard<std::mutex> lock(g_validated_mu);
    if (g_validated.count(module_key(words))) return {};
  }
  return validate_spirv(words);
}

void note_validated(const std::vector<uint32_t>& words) {
  std::lock_guard<std::mutex> lock(g_validated_mu);
  if (g_validated.size() >= kValidatedCap) g_validated.clear();
  g_validated.insert(module_key(words));
}

Status validate_spirv(const std::vector<uint32_t>& words) {
  std::string log;
  spvtools::SpirvTools tools(kEnv);
  collect_messages(tools, &log);
  if (tools.Validate(words)) {
    std::lock_guard<std::mutex> lock(g_validated_mu);
    if (g_validated.size() >= kValidatedCap) g_validated.clear();
    g_validated.insert(module_key(words));
    return {};
  }
  return make_error(ErrorCode::kInternal, "SPIR-V failed validation:\n" + log +
                                              "--- disassembly ---\n" + disassemble_spirv(words));
}

Result<std::vector<uint32_t>> assemble_spirv(const std::string& text) {
  std::string log;
  spvtools::SpirvTools tools(kEnv);
  collect_messages(tools, &log);
  std::vector<uint32_t> words;
  if (!tools.Assemble(text, &words)) {
    return make_error(ErrorCode::kInvalidArgument, "SPIR-V assembly failed:\n" + log);
  }
  VKAD_TRY(validate_spirv(words));
  return words;
}

}  // namespace vkad::abi
