// Umbrella header: everything an embedding project uses.
#pragma once
#include "rhi/buffer.h"
#include "rhi/command_list.h"
#include "rhi/device.h"
#include "rhi/pipeline.h"
#include "rhi/status.h"
#include "rhi/stream.h"
