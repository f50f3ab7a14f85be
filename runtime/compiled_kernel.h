// Moved to abi/kernel_abi.h (the kernel ABI is its own floor); this forwarding header keeps
// older includes building and will be removed.
#pragma once
#include "abi/kernel_abi.h"
