// Every public header: the front door (vkad.h) plus the layers under it (rhi/, runtime/,
// codegen/) for embedders that drive them directly. Most projects need only vkad.h.
#pragma once
#include "vkad.h"
#include "api/device_target.h"
#include "rhi/buffer.h"
#include "rhi/command_list.h"
#include "rhi/device.h"
#include "rhi/pipeline.h"
#include "base/status.h"
#include "rhi/stream.h"
#include "runtime/runtime.h"
#include "codegen/builder.h"
#include "codegen/compiler.h"
#include "codegen/cpu_eval.h"
#include "codegen/text.h"
#include "codegen/verifier.h"
#include "codegen/reverse_mode.h"
#include "codegen/forward_mode.h"
