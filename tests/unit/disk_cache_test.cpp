// The on-disk caches without a device: base/cache_file.h (location, format, corruption),
// abi/compiled_kernel_io.h (a CompiledKernel as bytes), the pipeline-cache identity
// (rhi/pipeline_cache_file.h) and CompileCache's disk layer.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include "abi/compiled_kernel_io.h"
#include "autodiff/reverse_mode.h"
#include "base/cache_file.h"
#include "ir/builder.h"
#include "ir/text.h"
#include "rhi/pipeline_cache_file.h"
#include "spirv/compiler.h"
#include "unit/codegen_kernels.h"

namespace vkad {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "vkad-cache-unit-XXXXXX").string();
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

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST(CacheDir, OptionThenOffSwitchThenDirThenXdgThenHome) {
  CacheEnv all{"1", "/v", "/xdg", "/home/u"};
  EXPECT_EQ(resolve_cache_dir(std::string("/opt"), all), "/opt");
  EXPECT_EQ(resolve_cache_dir(std::string(""), all), "");  // the option's off switch
  EXPECT_EQ(resolve_cache_dir(std::nullopt, all), "/v");
  CacheEnv off = all;
  off.vkad_cache = "0";
  EXPECT_EQ(resolve_cache_dir(std::nullopt, off), "");
  EXPECT_EQ(resolve_cache_dir(std::string("/opt"), off), "/opt");  // an explicit path wins
  CacheEnv xdg{std::nullopt, std::nullopt, "/xdg", "/home/u"};
  EXPECT_EQ(resolve_cache_dir(std::nullopt, xdg), "/xdg/vkad");
  CacheEnv relative_xdg{std::nullopt, std::string(""), "rel", "/home/u"};
  EXPECT_EQ(resolve_cache_dir(std::nullopt, relative_xdg), "/home/u/.cache/vkad");
  EXPECT_EQ(resolve_cache_dir(std::nullopt, CacheEnv{}), "");
}

TEST(CacheFile, RoundTripAndEveryKindOfDamage) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string key = "kernel text|target|options";
  const std::string name = cache_file_name("kernel", key);
  EXPECT_EQ(read_cache_file(dir.path(), name, CacheKind::kCompiledKernel, key).outcome,
            CacheRead::kMissing);
  ASSERT_TRUE(write_cache_file(dir.path() + "/sub/dir", name, CacheKind::kCompiledKernel, key,
                               "payload bytes")
                  .ok());
  const std::string sub = dir.path() + "/sub/dir";
  CacheFile f = read_cache_file(sub, name, CacheKind::kCompiledKernel, key);
  EXPECT_EQ(f.outcome, CacheRead::kHit);
  EXPECT_EQ(f.payload, "payload bytes");
  EXPECT_EQ(read_cache_file(sub, name, CacheKind::kCompiledKernel, "another key").outcome,
            CacheRead::kStale);
  EXPECT_EQ(read_cache_file(sub, name, CacheKind::kPipelineCache, key).outcome,
            CacheRead::kCorrupt);

  const std::string good = read_all(sub + "/" + name);
  ASSERT_EQ(good, encode_cache_file(CacheKind::kCompiledKernel, key, "payload bytes"));
  // Every truncation, and a flip of every bit, is detected (never a hit, never a crash).
  for (size_t n = 0; n < good.size(); ++n) {
    write_all(sub + "/" + name, good.substr(0, n));
    CacheRead r = read_cache_file(sub, name, CacheKind::kCompiledKernel, key).outcome;
    EXPECT_TRUE(r == CacheRead::kCorrupt || r == CacheRead::kStale) << "truncated to " << n;
  }
  for (size_t bit = 0; bit < good.size() * 8; ++bit) {
    std::string bad = good;
    bad[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    write_all(sub + "/" + name, bad);
    CacheRead r = read_cache_file(sub, name, CacheKind::kCompiledKernel, key).outcome;
    EXPECT_TRUE(r == CacheRead::kCorrupt || r == CacheRead::kStale) << "bit " << bit;
  }
  write_all(sub + "/" + name, good + "x");
  EXPECT_EQ(read_cache_file(sub, name, CacheKind::kCompiledKernel, key).outcome,
            CacheRead::kCorrupt);
  // Another format version: stale.
  std::string v2 = good;
  v2[8] = 2;
  write_all(sub + "/" + name, v2);
  EXPECT_EQ(read_cache_file(sub, name, CacheKind::kCompiledKernel, key).outcome, CacheRead::kStale);
  // No temporary files left.
  for (const auto& e : fs::directory_iterator(sub)) EXPECT_EQ(e.path().filename(), name);
}

// Names that are not regular files: read as corrupt (rebuilt by the caller), at once, without
// reading more than a header. Each used to crash (a directory: std::ios_base::failure), hang (a
// FIFO: open() waits for a writer) or read without end (/dev/zero, /dev/urandom).
TEST(CacheFile, EntriesThatAreNotRegularFilesAreCorruptAndReadAtOnce) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string key = "kernel text";
  auto outcome = [&](const std::string& name) {
    return read_cache_file(dir.path(), name, CacheKind::kCompiledKernel, key).outcome;
  };
  ASSERT_EQ(::mkdir((dir.path() + "/a-directory.bin").c_str(), 0700), 0);
  EXPECT_EQ(outcome("a-directory.bin"), CacheRead::kCorrupt);
  ASSERT_EQ(::mkfifo((dir.path() + "/a-fifo.bin").c_str(), 0600), 0);
  EXPECT_EQ(outcome("a-fifo.bin"), CacheRead::kCorrupt);
  for (const char* device : {"/dev/zero", "/dev/urandom"}) {
    const std::string link = dir.path() + "/device.bin";
    ::unlink(link.c_str());
    ASSERT_EQ(::symlink(device, link.c_str()), 0);
    EXPECT_EQ(outcome("device.bin"), CacheRead::kCorrupt) << device;
  }
  // A symlink to a good regular file is followed (users may link a cache's files).
  const std::string good = encode_cache_file(CacheKind::kCompiledKernel, key, "payload");
  write_all(dir.path() + "/real.bin", good);
  ASSERT_EQ(::symlink((dir.path() + "/real.bin").c_str(), (dir.path() + "/link.bin").c_str()), 0);
  CacheFile f = read_cache_file(dir.path(), "link.bin", CacheKind::kCompiledKernel, key);
  EXPECT_EQ(f.outcome, CacheRead::kHit);
  EXPECT_EQ(f.payload, "payload");
  // A header that declares more than the file holds, or a file past the cap: corrupt, and the
  // declared size is never allocated.
  std::string lying = good;
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(lying.data() + 24, &huge, sizeof huge);
  write_all(dir.path() + "/lying.bin", lying);
  EXPECT_EQ(outcome("lying.bin"), CacheRead::kCorrupt);
  {
    std::ofstream big(dir.path() + "/big.bin", std::ios::binary);
    big << good.substr(0, kCacheHeaderBytes);
  }
  fs::resize_file(dir.path() + "/big.bin", kCacheMaxFileBytes + 1);  // sparse: costs no disk
  EXPECT_EQ(outcome("big.bin"), CacheRead::kCorrupt);
  // And the writer replaces any of them but the directory (rename cannot), leaving no temporary.
  for (const char* name : {"a-fifo.bin", "device.bin"}) {
    ASSERT_TRUE(write_cache_file(dir.path(), name, CacheKind::kCompiledKernel, key, "p").ok());
    EXPECT_EQ(outcome(name), CacheRead::kHit) << name;
  }
  EXPECT_FALSE(
      write_cache_file(dir.path(), "a-directory.bin", CacheKind::kCompiledKernel, key, "p").ok());
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  }
}

TEST(CacheFile, WriteIntoAnUnwritablePlaceFailsWithThePath) {
  Status s =
      write_cache_file("/proc/vkad-no-such-dir", "x.bin", CacheKind::kCompiledKernel, "k", "p");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/proc/vkad-no-such-dir"), std::string::npos) << s.message();
}

codegen::Kernel loop_kernel() {
  using namespace codegen;
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

void expect_same(const abi::CompiledKernel& a, const abi::CompiledKernel& b) {
  EXPECT_TRUE(abi::same_pipelines(a, b));
  EXPECT_EQ(a.name, b.name);
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_EQ(a.params[i].name, b.params[i].name);
    EXPECT_EQ(a.params[i].written, b.params[i].written);
  }
  ASSERT_EQ(a.tasks.size(), b.tasks.size());
  for (size_t i = 0; i < a.tasks.size(); ++i) {
    const abi::CompiledTask &s = a.tasks[i], &t = b.tasks[i];
    EXPECT_EQ(s.name, t.name);
    EXPECT_EQ(s.spirv, t.spirv);
    EXPECT_EQ(s.dim_begin, t.dim_begin);
    EXPECT_EQ(s.dim_end, t.dim_end);
    ASSERT_EQ(s.adstacks.size(), t.adstacks.size());
    for (size_t j = 0; j < s.adstacks.size(); ++j) {
      EXPECT_EQ(s.adstacks[j].name, t.adstacks[j].name);
      EXPECT_EQ(s.adstacks[j].heap, t.adstacks[j].heap);
      EXPECT_EQ(s.adstacks[j].capacity, t.adstacks[j].capacity);
      EXPECT_EQ(s.adstacks[j].adjoint, t.adstacks[j].adjoint);
    }
    EXPECT_EQ(s.loop_passes, t.loop_passes);
    EXPECT_EQ(s.loop_passes_idle, t.loop_passes_idle);
    EXPECT_EQ(s.spec_words, t.spec_words);
    EXPECT_EQ(s.finite_sites, t.finite_sites);
  }
}

TEST(CompiledKernelIo, RoundTripsKernelsWithAdstacksAndSurvivesDamage) {
  auto adjoint = codegen::make_adjoint(loop_kernel());
  ASSERT_TRUE(adjoint.ok()) << adjoint.status().to_string();
  auto every = codegen::parse(codegen::testing::kEveryStatementKernel);
  ASSERT_TRUE(every.ok());
  codegen::CompileOptions finite;
  finite.check_finite = true;  // the finite checks' statement texts travel too
  const std::pair<const codegen::Kernel*, codegen::CompileOptions> cases[] = {
      {&*adjoint, {}}, {&*every, {}}, {&*adjoint, finite}};
  for (const auto& [k, options] : cases) {
    auto ck = codegen::compile(*k, codegen::Target::host(), options);
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    if (options.check_finite) {
      EXPECT_FALSE(ck->tasks[0].finite_sites.empty()) << "the adjoint adds into gradients";
    }
    auto bytes = abi::serialize_compiled_kernel(*ck);
    ASSERT_TRUE(bytes.ok());
    auto back = abi::deserialize_compiled_kernel(*bytes);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    expect_same(*ck, *back);
    // Truncated anywhere: an error (the file layer's checksum stops damage first; this is the
    // second line).
    for (size_t n = 0; n < bytes->size(); n += 1 + n / 64) {
      EXPECT_FALSE(abi::deserialize_compiled_kernel(std::string_view(*bytes).substr(0, n)).ok())
          << n;
    }
  }
}

TEST(PipelineCacheFile, KeyNamesTheDriverAndHeaderIsChecked) {
  VkPhysicalDeviceProperties p{};
  p.vendorID = 0x10de;
  p.deviceID = 0x2335;
  p.driverVersion = 42;
  for (uint32_t i = 0; i < VK_UUID_SIZE; ++i) p.pipelineCacheUUID[i] = static_cast<uint8_t>(i);
  VkPhysicalDeviceProperties updated = p;
  updated.pipelineCacheUUID[3] ^= 1;  // a driver update
  EXPECT_NE(rhi::pipeline_cache_key(p), rhi::pipeline_cache_key(updated));
  EXPECT_NE(rhi::pipeline_cache_file_name(p), rhi::pipeline_cache_file_name(updated));
  VkPhysicalDeviceProperties other_driver = p;
  other_driver.driverVersion = 43;
  EXPECT_NE(rhi::pipeline_cache_key(p), rhi::pipeline_cache_key(other_driver));

  std::string data(16 + VK_UUID_SIZE + 8, '\0');
  const uint32_t words[4] = {16 + VK_UUID_SIZE, VK_PIPELINE_CACHE_HEADER_VERSION_ONE, p.vendorID,
                             p.deviceID};
  std::memcpy(data.data(), words, sizeof words);
  std::memcpy(data.data() + 16, p.pipelineCacheUUID, VK_UUID_SIZE);
  EXPECT_TRUE(rhi::pipeline_cache_header_matches(data, p));
  EXPECT_FALSE(rhi::pipeline_cache_header_matches(data, updated));
  EXPECT_FALSE(rhi::pipeline_cache_header_matches(data.substr(0, 20), p));
  std::string wrong_version = data;
  wrong_version[4] = 7;
  EXPECT_FALSE(rhi::pipeline_cache_header_matches(wrong_version, p));
}

TEST(CompileCacheDisk, SecondCacheReadsTheFileAndRebuildsADamagedOne) {
  TempDir dir;
  codegen::Kernel k = loop_kernel();
  std::shared_ptr<const abi::CompiledKernel> first;
  {
    codegen::CompileCache a;
    a.set_disk_dir(dir.path());
    auto r = a.compile(k, codegen::Target::host());
    ASSERT_TRUE(r.ok());
    first = *r;
    EXPECT_EQ(a.disk().misses, 1u);
    EXPECT_EQ(a.disk().hits, 0u);
    EXPECT_EQ(a.disk().write_errors, 0u);
  }
  const fs::path file =
      fs::path(dir.path()) /
      cache_file_name("kernel", codegen::compile_key(k, codegen::Target::host(), {}));
  ASSERT_TRUE(fs::exists(file));
  {
    codegen::CompileCache b;
    b.set_disk_dir(dir.path());
    auto r = b.compile(k, codegen::Target::host());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(b.disk().hits, 1u);
    EXPECT_EQ(b.misses(), 0u);
    expect_same(*first, **r);
    // Another target is another key: compiled, not read.
    codegen::Target other = codegen::Target::host();
    other.max_local_size = 32;
    ASSERT_TRUE(b.compile(k, other).ok());
    EXPECT_EQ(b.disk().misses, 1u);
  }
  std::string bytes = read_all(file);
  bytes[bytes.size() / 2] ^= 0x40;
  write_all(file, bytes);
  {
    codegen::CompileCache c;
    c.set_disk_dir(dir.path());
    auto r = c.compile(k, codegen::Target::host());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(c.disk().hits, 0u);
    EXPECT_EQ(c.disk().rebuilt, 1u);
    expect_same(*first, **r);
  }
  codegen::CompileCache d;  // rewritten whole
  d.set_disk_dir(dir.path());
  ASSERT_TRUE(d.compile(k, codegen::Target::host()).ok());
  EXPECT_EQ(d.disk().hits, 1u);
}

// An entry whose SPIR-V was altered and whose checksum was fixed up to match: the file layer
// takes it, the validation gate does not. It is removed and compiled again once (a warning
// says so); the next process reads the rebuilt file. Before, it was trusted and refused at
// registration in every later process.
TEST(CompileCacheDisk, AnEntryAlteredWithItsChecksumFixedIsRebuiltOnce) {
  TempDir dir;
  codegen::Kernel k = loop_kernel();
  const std::string key = codegen::compile_key(k, codegen::Target::host(), {});
  std::shared_ptr<const abi::CompiledKernel> first;
  {
    codegen::CompileCache a;
    a.set_disk_dir(dir.path());
    auto r = a.compile(k, codegen::Target::host());
    ASSERT_TRUE(r.ok());
    first = *r;
  }
  const fs::path file = fs::path(dir.path()) / cache_file_name("kernel", key);
  CacheFile f =
      read_cache_file(dir.path(), file.filename().string(), CacheKind::kCompiledKernel, key);
  ASSERT_EQ(f.outcome, CacheRead::kHit);
  // The SPIR-V magic number of the first task, found in the payload, made invalid; the file
  // then written with a correct header and checksum for the altered payload.
  const uint32_t magic = 0x07230203u;
  const size_t at = f.payload.find(std::string(reinterpret_cast<const char*>(&magic), 4));
  ASSERT_NE(at, std::string::npos);
  std::string altered = f.payload;
  const uint32_t version_word_bad = 0xffffffffu;  // the version word: no such SPIR-V version
  std::memcpy(altered.data() + at + 4, &version_word_bad, 4);
  write_all(file, encode_cache_file(CacheKind::kCompiledKernel, key, altered));
  ASSERT_EQ(read_cache_file(dir.path(), file.filename().string(), CacheKind::kCompiledKernel, key)
                .outcome,
            CacheRead::kHit)
      << "the file layer cannot tell: only validation can";
  {
    codegen::CompileCache b;
    b.set_disk_dir(dir.path());
    auto r = b.compile(k, codegen::Target::host());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(b.disk().hits, 0u);
    EXPECT_EQ(b.disk().rebuilt, 1u);
    expect_same(*first, **r);
  }
  codegen::CompileCache c;  // the rebuilt file is good
  c.set_disk_dir(dir.path());
  ASSERT_TRUE(c.compile(k, codegen::Target::host()).ok());
  EXPECT_EQ(c.disk().hits, 1u);
  EXPECT_EQ(c.disk().rebuilt, 0u);
}

TEST(CompileCacheDisk, OffWritesNothingAndKeyNamesTheCompiler) {
  TempDir dir;
  codegen::CompileCache off;
  ASSERT_TRUE(off.compile(loop_kernel(), codegen::Target::host()).ok());
  EXPECT_EQ(off.disk().misses, 0u);
  EXPECT_TRUE(fs::is_empty(dir.path()));
  const std::string key = codegen::compile_key(loop_kernel(), codegen::Target::host(), {});
  EXPECT_NE(key.find(codegen::compiler_fingerprint()), std::string::npos);
  EXPECT_EQ(std::strlen(codegen::compiler_fingerprint()), 64u);
}

}  // namespace
}  // namespace vkad
