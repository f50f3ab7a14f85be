#include "codegen/spirv_tools.h"

#include <spirv-tools/libspirv.hpp>

namespace vkad::codegen {

namespace {
constexpr spv_target_env kEnv = SPV_ENV_VULKAN_1_2;

void collect_messages(spvtools::SpirvTools& tools, std::string* log) {
  tools.SetMessageConsumer([log](spv_message_level_t, const char*, const spv_position_t& pos,
                                 const char* msg) {
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

Status validate_spirv(const std::vector<uint32_t>& words) {
  std::string log;
  spvtools::SpirvTools tools(kEnv);
  collect_messages(tools, &log);
  if (tools.Validate(words)) return {};
  return make_error(ErrorCode::kInternal,
                    "SPIR-V failed validation:\n" + log + "--- disassembly ---\n" +
                        disassemble_spirv(words));
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

}  // namespace vkad::codegen
