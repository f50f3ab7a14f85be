// Moved to abi/spirv_tools.h (SPIR-V validation is the gate both codegen/ and runtime/ use);
// this forwarding header keeps older includes building and will be removed.
#pragma once
#include "abi/spirv_tools.h"
