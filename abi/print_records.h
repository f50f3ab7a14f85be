// What a kernel's print and assert statements leave in its launch's print area (the part of
// the args buffer after the adstack words, CompiledKernel::print_offset(); abi/kernel_abi.h),
// and how the host reads it back. Both sides follow this layout:
//
//   word 0   words reserved so far by the launch's records (atomic add; may pass the capacity)
//   word 1   records that did not fit (atomic add)
//   word 2.. records, each reserved whole by one atomic add on word 0:
//              (task << 20) | (site + 1)       the statement (CompiledTask::print_sites)
//              one word per task dimension     the invocation's index (i32 bits)
//              the values                      f32 / i32 / u32 / bool one word each (bool as
//                                              0 / 1), f64 / i64 two (low word first)
//
// Records of one invocation appear in its program order; records of different invocations in
// the order their atomic adds happened. Nothing here touches Vulkan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "abi/kernel_abi.h"

namespace vkad::abi {

inline constexpr uint32_t kPrintHeaderWords = 2;
// The print area's size bounds (CompileOptions::print_buffer_bytes; a multiple of 16): room for
// the header and a record of the most values at least; at most 64 KiB, so a launch's args slot
// stays well inside one chunk of the args ring (runtime/host_ring.h, 256 KiB).
inline constexpr uint32_t kMinPrintBytes = 256;
inline constexpr uint32_t kMaxPrintBytes = 64u << 10;
// The most values one print or assert records (the verifier's limit too).
inline constexpr uint32_t kMaxPrintValues = 16;
// One record's site word: at most 2^20 print sites per task, 4,096 tasks (kMaxKernelTasks).
constexpr uint32_t print_site_word(uint32_t task, uint32_t site) { return task << 20 | (site + 1); }
// Words a record of `site` takes.
uint32_t print_record_words(const PrintSite& site);

// One record read back.
struct PrintRecord {
  uint32_t task = 0, site = 0;
  std::vector<int64_t> index;       // the invocation's index, one per task dimension
  std::vector<std::string> values;  // each value as text (shortest round-trip for floats)
};
struct PrintArea {
  std::vector<PrintRecord> records;
  uint64_t dropped = 0;  // records that did not fit
};

// The records in the print area of a launch's args buffer `args` (the kernel's layout `d`). A
// record whose site word is not one of the kernel's ends the read (a damaged area).
PrintArea read_print_area(const CompiledKernel& d, const std::byte* args);

// A value as a print writes it: the shortest text that reads back as the same f32 / f64,
// integers in decimal, bool True / False (the CPU evaluator formats its values the same way).
std::string print_value(DType t, double v);
// `format` with each `{}` replaced by the next value; values left over follow, space-separated;
// placeholders left over stay `{}`.
std::string print_text(const std::string& format, const std::vector<std::string>& values);
// `[kernel 'k', task 't', thread (i, j)] `: what each printed line starts with.
std::string print_prefix(const std::string& kernel, const std::string& task,
                         const std::vector<int64_t>& index);

// A print record as the line the host writes: the site's format with each `{}` replaced by the
// next value (values left over follow, space-separated; placeholders left over stay `{}`), after
// `[kernel 'k', task 't', thread (i, j)] `.
std::string print_line(const CompiledKernel& d, const PrintRecord& r);

// The first record of assert site `site` of `task` (its failing invocation's index and
// values), described: `thread (3) with 1.5, -2` ; "" when none was kept.
std::string assert_detail(const CompiledKernel& d, const std::byte* args, uint32_t task,
                          uint32_t site);

}  // namespace vkad::abi
