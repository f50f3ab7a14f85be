// The on-disk caches (base/cache_file.h): compiled kernels (codegen::CompileCache's disk layer)
// and the driver's pipeline cache (rhi::Device), through the front door, on a real device.
// Every test uses a fresh temporary directory; nothing here touches the user's cache.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "abi/compiled_kernel_io.h"
#include "base/cache_file.h"
#include "ir/builder.h"
#include "rhi/pipeline_cache_file.h"
#include "runtime/runtime.h"
#include "spirv/compiler.h"
#include "vkad.h"

extern char** environ;

namespace vkad::testing {
namespace {

namespace fs = std::filesystem;

// This binary never touches the user's cache, however it is run (ctest sets VKAD_CACHE=0 too;
// scripts run the binary directly): sessions that name no directory have the caches off.
[[maybe_unused]] const bool kCacheOffByDefault = [] { return setenv("VKAD_CACHE", "0", 0) == 0; }();

// Sets (or unsets, for nullptr) an environment variable for a scope; restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) saved_ = v;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (saved_)
      setenv(name_, saved_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

using codegen::Array;
using codegen::KernelBuilder;
using codegen::Local;
using codegen::Value;

// y[i] = x[i]^3 / 3 through a loop carrying a local (the adjoint has an adstack).
codegen::Kernel cube() {
  KernelBuilder kb("cube");
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Local acc = kb.local(kb.f32(1));
    kb.for_range(kb.i32(0), kb.i32(3), [&](Value) { acc.store(acc.load() * x(i)); });
    y.store({i}, acc.load() / 3.0);
  });
  return kb.finish();
}

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "vkad-cache-test-XXXXXX").string();
    path_ = ::mkdtemp(t.data()) ? t : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Result<std::unique_ptr<Session>> open(const std::optional<std::string>& dir) {
  SessionOptions o;
  o.validation = true;
  o.cache_dir = dir;
  return Session::create(o);
}

#define OPEN_OR_SKIP(var, dir)                                                    \
  auto var##_result = open(dir);                                                  \
  if (!var##_result.ok() && var##_result.status().code() == ErrorCode::kNoDevice) \
    GTEST_SKIP() << "SKIPPED: no Vulkan device";                                  \
  ASSERT_TRUE(var##_result.ok()) << var##_result.status().to_string();            \
  std::unique_ptr<Session> var = std::move(var##_result).value()

// Differentiates cube, runs forward + adjoint on x = 1..4 and checks dL/dx = x^2.
void run_cube(Session& s) {
  auto d = s.differentiate(cube());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const std::vector<float> xs = {1, 2, 3, 4};
  std::vector<float> grad(4);
  auto hx = s.ndarray(DType::kF32, {4}, "x"), hy = s.ndarray(DType::kF32, {4}, "y");
  auto hxg = s.ndarray(DType::kF32, {4}, "x_grad"), hyg = s.ndarray(DType::kF32, {4}, "y_grad");
  ASSERT_TRUE(hx.ok() && hy.ok() && hxg.ok() && hyg.ok());
  const Arg fargs[] = {Arg::ndarray(*hx), Arg::ndarray(*hy)};
  const NdArrayHandle grads[] = {*hxg, *hyg};
  auto aargs = d->adjoint_args(fargs, grads);
  ASSERT_TRUE(aargs.ok());
  ASSERT_TRUE(s.upload(*hx, std::span<const float>(xs)).ok());
  ASSERT_TRUE(s.zero(*hxg).ok());
  ASSERT_TRUE(s.fill(*hyg, 1.0).ok());
  ASSERT_TRUE(s.launch(d->forward, fargs).ok());
  ASSERT_TRUE(s.launch(d->adjoint, *aargs).ok());
  Status st = s.download(*hxg, std::span<float>(grad));
  ASSERT_TRUE(st.ok()) << st.to_string();
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_EQ(grad[i], xs[i] * xs[i]) << i;
  EXPECT_EQ(s.runtime().device().validation_message_count(), 0u);
}

std::vector<fs::path> files_with_prefix(const std::string& dir, const std::string& prefix) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path());
  }
  return out;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST(DiskCache, SecondSessionReadsKernelsAndPipelinesFromDisk) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  {
    OPEN_OR_SKIP(s, dir.path());
    run_cube(*s);
    auto st = s->stats();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->disk_cache_hits, 0u);
    EXPECT_EQ(st->disk_cache_misses, 2u);  // forward and adjoint
    EXPECT_EQ(st->kernels_compiled, 2u);
    EXPECT_FALSE(st->pipeline_cache_loaded);
  }
  EXPECT_EQ(files_with_prefix(dir.path(), "kernel-").size(), 2u);
  const bool driver_saves = !files_with_prefix(dir.path(), "pipelines-").empty();
  OPEN_OR_SKIP(s, dir.path());
  run_cube(*s);
  auto st = s->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->disk_cache_hits, 2u);
  EXPECT_EQ(st->disk_cache_misses, 0u);
  EXPECT_EQ(st->kernels_compiled, 0u);
  EXPECT_EQ(st->pipeline_cache_loaded, driver_saves);
  // Nothing left behind but the cache files (no temporaries).
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  }
}

TEST(DiskCache, CorruptKernelFilesAreRebuilt) {
  TempDir dir;
  {
    OPEN_OR_SKIP(s, dir.path());
    run_cube(*s);
  }
  auto kernels = files_with_prefix(dir.path(), "kernel-");
  ASSERT_EQ(kernels.size(), 2u);
  // One truncated, one with a bit flipped in its SPIR-V.
  std::string a = read_all(kernels[0]);
  write_all(kernels[0], a.substr(0, a.size() / 2));
  std::string b = read_all(kernels[1]);
  b[b.size() - 100] ^= 0x10;
  write_all(kernels[1], b);
  {
    OPEN_OR_SKIP(s, dir.path());
    run_cube(*s);
    auto st = s->stats();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->disk_cache_hits, 0u);
    EXPECT_EQ(st->disk_cache_misses, 2u);
    EXPECT_EQ(st->disk_cache_rebuilt, 2u);
  }
  // Rewritten whole: the next session reads both.
  OPEN_OR_SKIP(s, dir.path());
  run_cube(*s);
  auto st = s->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->disk_cache_hits, 2u);
  EXPECT_EQ(st->disk_cache_rebuilt, 0u);
}

// A kernel file whose module validates but does not match its description (the first task's
// local size changed in the serialized kernel, the file's checksum made to fit): the cache
// takes it, registration refuses it (the module's LocalSize differs). The session removes it,
// compiles the kernel again and rewrites the file, once; before, every later process failed to
// compile that kernel until the user deleted the cache.
TEST(DiskCache, AnEntryTheRuntimeRefusesIsRebuiltOnce) {
  TempDir dir;
  std::string key;
  {
    OPEN_OR_SKIP(s, dir.path());
    run_cube(*s);
    key = codegen::compile_key(cube(), s->target(), default_compile_options());
  }
  const std::string name = cache_file_name("kernel", key);
  CacheFile f = read_cache_file(dir.path(), name, CacheKind::kCompiledKernel, key);
  ASSERT_EQ(f.outcome, CacheRead::kHit) << "the forward's file, by the session's key";
  // The payload: the key's length (8 bytes), the key, the serialized kernel.
  const size_t head = sizeof(uint64_t) + key.size();
  auto ck = abi::deserialize_compiled_kernel(std::string_view(f.payload).substr(head));
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  ck->tasks[0].local_size = ck->tasks[0].local_size == 32 ? 64 : 32;
  auto bytes = abi::serialize_compiled_kernel(*ck);
  ASSERT_TRUE(bytes.ok());
  write_all(fs::path(dir.path()) / name,
            encode_cache_file(CacheKind::kCompiledKernel, key, f.payload.substr(0, head) + *bytes));
  {
    OPEN_OR_SKIP(s, dir.path());
    run_cube(*s);  // refused at registration before
    auto st = s->stats();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->disk_cache_hits, 1u);  // the adjoint's
    EXPECT_EQ(st->disk_cache_rebuilt, 1u);
    EXPECT_EQ(st->kernels_compiled, 1u);
  }
  OPEN_OR_SKIP(s, dir.path());  // the rewritten file is good
  run_cube(*s);
  auto st = s->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->disk_cache_hits, 2u);
  EXPECT_EQ(st->disk_cache_rebuilt, 0u);
}

// Kernel entries that are a directory, a FIFO, or a link to /dev/zero; the pipeline cache a
// link to /dev/urandom: the session opens at once, compiles what it cannot read (crash, hang
// and unbounded reads before) and works.
TEST(DiskCache, EntriesThatAreNotFilesAreCompiledAgainWithoutHangingOrCrashing) {
  TempDir dir;
  {
    OPEN_OR_SKIP(s, dir.path());
    run_cube(*s);
  }
  auto kernels = files_with_prefix(dir.path(), "kernel-");
  ASSERT_EQ(kernels.size(), 2u);
  fs::remove(kernels[0]);
  fs::create_directory(kernels[0]);
  fs::remove(kernels[1]);
  ASSERT_EQ(::mkfifo(kernels[1].c_str(), 0600), 0);
  for (const fs::path& p : files_with_prefix(dir.path(), "pipelines-")) {
    fs::remove(p);
    fs::create_symlink("/dev/urandom", p);
  }
  for (int round = 0; round < 2; ++round) {
    OPEN_OR_SKIP(s, dir.path());
    run_cube(*s);
    auto st = s->stats();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->disk_cache_hits, round == 0 ? 0u : 1u) << "round " << round;
    EXPECT_EQ(st->disk_cache_rebuilt, round == 0 ? 2u : 1u)
        << "round " << round << ": the FIFO is replaced by a file, the directory stays";
  }
  fs::remove(kernels[0]);
  fs::create_symlink("/dev/zero", kernels[0]);
  OPEN_OR_SKIP(s, dir.path());
  run_cube(*s);
  EXPECT_EQ(s->stats()->disk_cache_rebuilt, 1u);
}

TEST(DiskCache, PipelineCacheOfAnotherDriverOrCorruptIsIgnored) {
  TempDir dir;
  {
    OPEN_OR_SKIP(s, dir.path());
    run_cube(*s);
  }
  auto pipelines = files_with_prefix(dir.path(), "pipelines-");
  if (pipelines.empty()) GTEST_SKIP() << "SKIPPED: the driver keeps no pipeline cache data";
  ASSERT_EQ(pipelines.size(), 1u);
  const std::string good = read_all(pipelines[0]);
  // A driver update: the Vulkan header's pipelineCacheUUID (bytes 16..31 of the driver's
  // data) differs from the device's, in an otherwise valid file (vkad header, key and checksum
  // right), which read_cache_file accepts and the Vulkan header check must not.
  std::string payload = good.substr(kCacheHeaderBytes);
  payload[16] ^= 0xff;
  std::string tampered = good.substr(0, kCacheHeaderBytes) + payload;
  const uint64_t sum = fnv1a64(payload);
  std::memcpy(tampered.data() + 32, &sum, sizeof sum);
  write_all(pipelines[0], tampered);
  {
    OPEN_OR_SKIP(s, dir.path());
    auto st = s->stats();
    ASSERT_TRUE(st.ok());
    EXPECT_FALSE(st->pipeline_cache_loaded);
    EXPECT_EQ(s->runtime().device().pipeline_cache_load().outcome, "stale");
    run_cube(*s);
  }
  // Saved again at the end of that session: whole and loadable.
  {
    OPEN_OR_SKIP(s, dir.path());
    auto st = s->stats();
    ASSERT_TRUE(st.ok());
    EXPECT_TRUE(st->pipeline_cache_loaded);
  }
  // Bit flip and truncation: corrupt, ignored, the session works.
  std::string flipped = read_all(pipelines[0]);
  flipped[flipped.size() - 1] ^= 1;
  write_all(pipelines[0], flipped);
  {
    OPEN_OR_SKIP(s, dir.path());
    EXPECT_EQ(s->runtime().device().pipeline_cache_load().outcome, "corrupt");
    EXPECT_FALSE(s->runtime().device().pipeline_cache_load().loaded);
    run_cube(*s);
  }
  write_all(pipelines[0], good.substr(0, 20));
  {
    OPEN_OR_SKIP(s, dir.path());
    EXPECT_EQ(s->runtime().device().pipeline_cache_load().outcome, "corrupt");
    run_cube(*s);
  }
}

TEST(DiskCache, OffSwitchWritesNothing) {
  TempDir dir;
  {
    OPEN_OR_SKIP(s, std::string());  // "" = off
    run_cube(*s);
    auto st = s->stats();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->disk_cache_misses, 0u);
    EXPECT_EQ(s->runtime().cache_dir(), "");
  }
  // VKAD_CACHE=0 turns the automatic location off even with VKAD_CACHE_DIR set.
  {
    ScopedEnv cache_dir("VKAD_CACHE_DIR", dir.path().c_str());
    ScopedEnv off("VKAD_CACHE", "0");
    OPEN_OR_SKIP(s, std::nullopt);
    run_cube(*s);
    EXPECT_EQ(s->runtime().cache_dir(), "");
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
  // VKAD_CACHE_DIR alone picks the directory.
  {
    ScopedEnv cache_dir("VKAD_CACHE_DIR", dir.path().c_str());
    ScopedEnv on("VKAD_CACHE", nullptr);
    OPEN_OR_SKIP(s, std::nullopt);
    EXPECT_EQ(s->runtime().cache_dir(), dir.path());
    run_cube(*s);
  }
  EXPECT_EQ(files_with_prefix(dir.path(), "kernel-").size(), 2u);
}

// The helper below, run as a child process: compiles cube into the directory it is given.
TEST(DiskCache, ChildProcessHelper) {
  const char* dir = std::getenv("VKAD_DISK_CACHE_TEST_CHILD_DIR");
  if (dir == nullptr) GTEST_SKIP() << "run by DiskCache.TwoProcessesShareTheCache";
  OPEN_OR_SKIP(s, std::string(dir));
  run_cube(*s);
}

TEST(DiskCache, TwoProcessesShareTheCache) {
  TempDir dir;
  {
    OPEN_OR_SKIP(probe, std::string());  // skips without a device, before spawning anything
  }
  std::string env_dir = "VKAD_DISK_CACHE_TEST_CHILD_DIR=" + dir.path();
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(env_dir.data());
  envp.push_back(nullptr);
  std::string exe = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=DiskCache.ChildProcessHelper";
  char* argv[] = {exe.data(), filter.data(), nullptr};
  // Two children at once: both compile cold and write the same files.
  pid_t pids[2];
  for (pid_t& pid : pids) {
    ASSERT_EQ(posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  OPEN_OR_SKIP(s, dir.path());
  run_cube(*s);
  auto st = s->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->disk_cache_hits, 2u);
  EXPECT_EQ(st->kernels_compiled, 0u);
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace vkad::testing
