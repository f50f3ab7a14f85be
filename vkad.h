// vkad's front door: a Session (device, compile, differentiate, ndarrays, launches), a Tape
// (recorded launches, their adjoints, gradients kept across iterations), the kernel builder,
// the IR text form and Status/Result. Everything else (the runtime, the RHI, the compiler's
// parts) is in vkad_advanced.h.
#pragma once
#include "api/devices.h"
#include "api/session.h"
#include "api/tape.h"
#include "base/status.h"
#include "codegen/builder.h"
#include "codegen/text.h"
