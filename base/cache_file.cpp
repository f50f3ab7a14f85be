#include "base/cache_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace vkad {

namespace {

constexpr char kMagic[8] = {'V', 'K', 'A', 'D', 'C', 'A', 'C', 'H'};

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

template <typename T>
void put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
T get(const std::string& in, size_t offset) {
  T v;
  std::memcpy(&v, in.data() + offset, sizeof(T));
  return v;
}

Status errno_error(const std::string& what, const std::string& path) {
  return make_error(ErrorCode::kInternal, what + " '" + path + "': " + std::strerror(errno));
}

// mkdir -p, private to the user (0700: kernels and driver data of one user's programs).
Status make_dirs(const std::string& dir) {
  if (dir.empty()) return make_error(ErrorCode::kInvalidArgument, "cache directory is empty");
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      std::string part = dir.substr(0, i);
      if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
        return errno_error("cannot create cache directory", part);
      }
    }
  }
  return {};
}

}  // namespace

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t fnv1a64(std::string_view data, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

CacheEnv CacheEnv::from_process() {
  return {env("VKAD_CACHE"), env("VKAD_CACHE_DIR"), env("XDG_CACHE_HOME"), env("HOME")};
}

std::string resolve_cache_dir(const std::optional<std::string>& option, const CacheEnv& e) {
  if (option) return *option;
  if (e.vkad_cache && *e.vkad_cache == "0") return "";
  if (e.vkad_cache_dir && !e.vkad_cache_dir->empty()) return *e.vkad_cache_dir;
  // The XDG base-directory spec: a relative XDG_CACHE_HOME is invalid and is ignored.
  if (e.xdg_cache_home && !e.xdg_cache_home->empty() && (*e.xdg_cache_home)[0] == '/') {
    return *e.xdg_cache_home + "/vkad";
  }
  if (e.home && !e.home->empty()) return *e.home + "/.cache/vkad";
  return "";
}

const char* cache_read_name(CacheRead r) {
  switch (r) {
    case CacheRead::kHit: return "hit";
    case CacheRead::kMissing: return "missing";
    case CacheRead::kCorrupt: return "corrupt";
    case CacheRead::kStale: return "stale";
  }
  return "?";
}

std::string cache_file_name(std::string_view prefix, std::string_view key) {
  return std::string(prefix) + "-" + hex16(fnv1a64(key)) + ".bin";
}

std::string encode_cache_file(CacheKind kind, std::string_view key, std::string_view payload) {
  std::string out;
  out.reserve(kCacheHeaderBytes + payload.size());
  out.append(kMagic, sizeof kMagic);
  put<uint32_t>(&out, kCacheFormatVersion);
  put<uint32_t>(&out, static_cast<uint32_t>(kind));
  put<uint64_t>(&out, fnv1a64(key));
  put<uint64_t>(&out, payload.size());
  put<uint64_t>(&out, fnv1a64(payload));
  out.append(payload);
  return out;
}

namespace {

// Reads exactly `n` bytes at the current offset; false on a short file or an error.
bool read_exact(int fd, char* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::read(fd, out + done, n - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    done += static_cast<size_t>(r);
  }
  return true;
}

// Closes the descriptor on every return path.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

CacheFile read_cache_file(const std::string& dir, const std::string& name, CacheKind kind,
                          std::string_view key) {
  CacheFile f;
  if (dir.empty()) return f;
  const std::string path = dir + "/" + name;
  // O_NONBLOCK: opening a FIFO planted under the name returns at once instead of waiting for a
  // writer; the type check below then refuses it. Symlinks are followed (a user may link the
  // folder's files), but only what they lead to is judged.
  Fd in{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (in.fd < 0) return f;
  struct stat st {};
  f.outcome = CacheRead::kCorrupt;
  // Only regular files: a directory, FIFO, socket or device (/dev/zero, /dev/urandom) is a bad
  // entry that the caller rebuilds, never something to read until it ends.
  if (::fstat(in.fd, &st) != 0 || !S_ISREG(st.st_mode)) return f;
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < kCacheHeaderBytes || file_size > kCacheMaxFileBytes) return f;
  std::string header(kCacheHeaderBytes, '\0');
  if (!read_exact(in.fd, header.data(), header.size())) return f;
  if (std::memcmp(header.data(), kMagic, sizeof kMagic) != 0) return f;
  if (get<uint32_t>(header, 8) != kCacheFormatVersion) {
    f.outcome = CacheRead::kStale;
    return f;
  }
  if (get<uint32_t>(header, 12) != static_cast<uint32_t>(kind)) return f;
  if (get<uint64_t>(header, 16) != fnv1a64(key)) {
    f.outcome = CacheRead::kStale;
    return f;
  }
  // The header's size must be the file's: read that much and no more (bounded by the cap above,
  // so a header claiming more than the file holds costs nothing).
  const uint64_t size = get<uint64_t>(header, 24);
  if (size != file_size - kCacheHeaderBytes) return f;
  std::string payload(size, '\0');
  if (!read_exact(in.fd, payload.data(), payload.size())) return f;
  char extra;
  if (::read(in.fd, &extra, 1) != 0) return f;  // grew while read: not the file we sized
  if (get<uint64_t>(header, 32) != fnv1a64(payload)) return f;
  f.outcome = CacheRead::kHit;
  f.payload = std::move(payload);
  return f;
}

Status write_cache_file(const std::string& dir, const std::string& name, CacheKind kind,
                        std::string_view key, std::string_view payload) {
  VKAD_TRY(make_dirs(dir));
  static std::atomic<uint64_t> counter{0};
  const std::string path = dir + "/" + name;
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  const std::string bytes = encode_cache_file(kind, key, payload);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return errno_error("cannot create cache file", tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status s = errno_error("cannot write cache file", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  // fsync before rename: after a crash the name points at the whole new file or the old one.
  if (::fsync(fd) != 0) {
    Status s = errno_error("cannot fsync cache file", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = errno_error("cannot rename cache file to", path);
    ::unlink(tmp.c_str());
    return s;
  }
  return {};
}

}  // namespace vkad
