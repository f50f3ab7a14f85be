// Umbrella header: everything an embedding project uses.
#pragma once
#include "rhi/buffer.h"
#include "rhi/command_list.h"
#include "rhi/device.h"
#include "rhi/pipeline.h"
#include "rhi/status.h"
#include "rhi/stream.h"
#include "runtime/runtime.h"
#include "codegen/builder.h"
#include "codegen/compiler.h"
#include "codegen/cpu_eval.h"
#include "codegen/text.h"
#include "codegen/verifier.h"
