// Defaults of the runtime that the layers above repeat (api/session.h's SessionOptions, the C
// options, the Python Session): written here once. No other include, so vkad.h can take it.
#pragma once

#include <cstddef>

namespace vkad::runtime {

// Submissions in flight before the host waits for the oldest (RuntimeOptions::retirement_depth).
inline constexpr size_t kDefaultRetirementDepth = 3;

}  // namespace vkad::runtime
