// Where the library's messages go. vkad never writes to stderr behind its caller's back: every
// message (validation-layer reports, and the one message before a misuse stops the process)
// goes to the process-wide log sink. The default sink writes "[vkad] <message>" to stderr; an
// embedder installs its own (the C ABI's vkad_set_log_callback), or none to silence vkad.
#pragma once

#include <string>

namespace vkad {

enum class LogLevel { kDebug, kInfo, kWarning, kError };
const char* log_level_name(LogLevel level);

// Called with each message, from whichever thread produced it (validation messages arrive on
// the thread that made the Vulkan call), possibly from several threads at once: a sink must be
// thread-safe. `message` is valid only during the call.
using LogSink = void (*)(LogLevel level, const char* message, void* user);

// Replaces the sink (nullptr: drop every message). Thread-safe; a message being delivered when
// the sink changes goes to the old one.
void set_log_sink(LogSink sink, void* user);
// Restores the default (stderr) sink.
void reset_log_sink();
void log(LogLevel level, const std::string& message);

}  // namespace vkad
