// Every public header: the front door (vkad.h) plus the layers under it (rhi/, runtime/,
// ir/, autodiff/, spirv/, reference/) for embedders that drive them directly. Most projects need
// only vkad.h.
#pragma once
#include "api/device_target.h"
#include "autodiff/forward_mode.h"
#include "autodiff/reverse_mode.h"
#include "base/status.h"
#include "ir/builder.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "reference/cpu_eval.h"
#include "rhi/buffer.h"
#include "rhi/command_list.h"
#include "rhi/device.h"
#include "rhi/pipeline.h"
#include "rhi/stream.h"
#include "runtime/graphs.h"
#include "runtime/interop.h"
#include "runtime/runtime.h"
#include "spirv/compiler.h"
#include "vkad.h"
