// vkad's on-disk caches (compiled kernels, the driver's pipeline cache): where they live and the
// one file format both use. Pure file I/O; nothing here knows Vulkan or kernels.
//
// Location (resolve_cache_dir): an explicit path option wins ("" turns the caches off); else
// VKAD_CACHE=0 turns them off; else VKAD_CACHE_DIR; else $XDG_CACHE_HOME/vkad; else
// $HOME/.cache/vkad; else off.
//
// File format (little-endian host order; files are not meant to move between machines):
//   8 bytes   magic "VKADCACH"
//   u32       format version (kCacheFormatVersion)
//   u32       kind (CacheKind)
//   u64       key hash: fnv1a64 of the full key text (kernel text + target + options +
//             compiler fingerprint, or the device's pipeline-cache identity)
//   u64       payload size in bytes
//   u64       payload checksum: fnv1a64 of the payload
//   payload
// A reader checks all of it: a file that is short, long, of another magic, kind or checksum is
// kCorrupt; another format version or key hash is kStale. Either way the caller rebuilds what
// the file held and overwrites it. Nothing in a file can crash the reader, hang it or make it
// read without bound. The checksum finds accidents, not tampering: the cache folder is trusted
// like the program's own files; compiled kernels read back are validated again all the same
// (spirv/compiler.h) so that a damaged entry is rebuilt rather than refused for ever.
//
// Concurrency: write_cache_file writes a temporary file in the same directory (unique per
// process and call), fsyncs it and renames it over the target, so a reader sees the old file or
// the new one, never a mix, and two processes writing one key each leave a whole file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace vkad {

inline constexpr uint32_t kCacheFormatVersion = 1;
inline constexpr size_t kCacheHeaderBytes = 40;
// The largest file a reader accepts (header included): compiled kernels and driver pipeline
// caches are far smaller; anything bigger is kCorrupt and rebuilt, never read into memory.
inline constexpr uint64_t kCacheMaxFileBytes = uint64_t{256} << 20;

enum class CacheKind : uint32_t { kCompiledKernel = 1, kPipelineCache = 2 };

// FNV-1a, 64-bit, over `data` (`seed` replaces the offset basis).
uint64_t fnv1a64(std::string_view data, uint64_t seed = 14695981039346656037ull);
// `v` as 16 lower-case hex digits (cache files' and dumps' names).
std::string hex16(uint64_t v);

// The environment the location comes from (a test passes its own).
struct CacheEnv {
  std::optional<std::string> vkad_cache;      // VKAD_CACHE ("0": off)
  std::optional<std::string> vkad_cache_dir;  // VKAD_CACHE_DIR
  std::optional<std::string> xdg_cache_home;  // XDG_CACHE_HOME (used only if absolute)
  std::optional<std::string> home;            // HOME
  static CacheEnv from_process();
};

// The cache directory, "" for off (see the file comment). `option`: nullopt = automatic.
std::string resolve_cache_dir(const std::optional<std::string>& option, const CacheEnv& env);

enum class CacheRead : uint8_t { kHit, kMissing, kCorrupt, kStale };
const char* cache_read_name(CacheRead r);

struct CacheFile {
  CacheRead outcome = CacheRead::kMissing;
  std::string payload;  // kHit only
};

// The file's name for `key`: "<prefix>-<16 hex digits of fnv1a64(key)>.bin".
std::string cache_file_name(std::string_view prefix, std::string_view key);

// Reads `dir`/`name`. Never fails, never blocks, never reads more than kCacheMaxFileBytes: a
// name that does not open is kMissing; one that is not a regular file (directory, FIFO, device,
// socket, or a symlink to one), too large, or bad is kCorrupt / kStale.
CacheFile read_cache_file(const std::string& dir, const std::string& name, CacheKind kind,
                          std::string_view key);
// Writes `dir`/`name` atomically (temporary file, fsync, rename), creating `dir` (and its
// parents) if needed. On failure (kInternal naming the path and errno text) nothing is left
// behind but possibly an empty `dir`; an existing file stays as it was.
Status write_cache_file(const std::string& dir, const std::string& name, CacheKind kind,
                        std::string_view key, std::string_view payload);

// The bytes write_cache_file would write (tests corrupt them).
std::string encode_cache_file(CacheKind kind, std::string_view key, std::string_view payload);

}  // namespace vkad
