// SPIR-V emission without a device: every module of every test kernel passes the validator
// (compile() runs the gate), in both atomic lowerings, with and without spirv-opt, and the
// output is deterministic.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "abi/spirv_tools.h"
#include "ir/text.h"
#include "spirv/compiler.h"
#include "unit/codegen_kernels.h"

namespace vkad::codegen {
namespace {

Kernel parsed(const std::string& text) {
  auto k = parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  return k.ok() ? *k : Kernel{};
}

TEST(CodegenEmit, EveryStatementKindValidates) {
  Kernel k = parsed(testing::kEveryStatementKernel);
  for (bool native : {true, false}) {
    for (bool opt : {false, true}) {
      CompileOptions o;
      o.native_float_atomics = native;
      o.optimize = opt;
      auto c = compile(k, Target::host(), o);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      ASSERT_EQ(c->tasks.size(), 2u);
      for (const auto& t : c->tasks) EXPECT_TRUE(validate_spirv(t.spirv).ok());
      std::string dis = disassemble_spirv(c->tasks[0].spirv);
      if (!opt) {
        // The two lowerings of a float atomic add.
        EXPECT_EQ(dis.find("OpAtomicFAddEXT") != std::string::npos, native) << dis;
        EXPECT_EQ(dis.find("OpAtomicCompareExchange %uint") != std::string::npos, true);
      }
    }
  }
}

// atomic_add at a computed index (a float position's cell) combines runs of consecutive
// invocations (spirv_emitter.cpp, combine_runs) where the target has ballot and relative
// shuffles, its two adds at one cell as one group (one run found: one ShuffleUp of the cell),
// in a body emitted twice (the plain copy for launches of at most 16,896 iterations); not at
// the task's own index or an N-d task's fastest one (neighbours never share it), not in a task
// whose constant range (1-d or N-d) is never that wide, not in a task with shared memory, and
// not without the target's shuffles or its subgroup arithmetic.
TEST(CodegenEmit, AtomicAddsCombineRunsOnlyAtComputedIndicesOfWideTasks) {
  auto kernel = [](const std::string& range, const std::string& index, bool shared) {
    return parsed(
        "kernel k(p: ndarray<f32, 1>, g: ndarray<f32, 2>) {\n"
        "  task main parallel %i in " +
        range + " {\n" + (shared ? "    %sh = shared_alloc 64 : f32\n" : "") +
        "    %x = load p[%i] : f32\n"
        "    %c = cast %x : i32\n"
        "    %zero = const 0 : i32\n"
        "    %one = const 1 : i32\n"
        "    atomic_add g[" +
        index +
        ", %zero], %x\n"
        "    %y = mul %x, %x : f32\n"
        "    atomic_add g[" +
        index +
        ", %one], %y\n"
        "  }\n}\n");
  };
  auto count = [](const std::string& dis, const std::string& what) {
    size_t n = 0;
    for (size_t at = dis.find(what); at != std::string::npos; at = dis.find(what, at + 1)) ++n;
    return n;
  };
  struct Case {
    const char* what;
    Kernel k;
    bool combines;
  };
  const std::vector<Case> cases = {
      {"computed cell, range from the array", kernel("[0, shape(p, 0))", "%c", false), true},
      {"the task's own index", kernel("[0, shape(p, 0))", "%i", false), false},
      {"a constant range of 4,096", kernel("[0, 4096)", "%c", false), false},
      {"a constant range of 100,000", kernel("[0, 100000)", "%c", false), true},
      {"shared memory", kernel("[0, 65536) local_size 256", "%c", true), false},
      {"a constant 2-d range of 64 x 64", kernel("[0, 64), %j in [0, 64)", "%c", false), false},
      {"a constant 2-d range of 512 x 512", kernel("[0, 512), %j in [0, 512)", "%c", false), true},
      {"the 2-d task's fastest index", kernel("[0, 512), %j in [0, 512)", "%j", false), false},
  };
  for (const Case& c : cases) {
    for (bool shuffle : {true, false}) {
      Target t = Target::host();
      t.subgroup_shuffle = shuffle;
      if (shuffle) {  // shuffles without subgroup arithmetic: the plain adds, one copy
        Target no_arithmetic = t;
        no_arithmetic.subgroup_arithmetic = false;
        auto plain = compile(c.k, no_arithmetic);
        ASSERT_TRUE(plain.ok()) << c.what << ": " << plain.status().to_string();
        const std::string dis = disassemble_spirv(plain->tasks[0].spirv);
        EXPECT_EQ(count(dis, "OpGroupNonUniform"), 0u) << c.what;
        EXPECT_EQ(count(dis, "OpAtomicFAddEXT"), 2u) << c.what;
      }
      auto compiled = compile(c.k, t);
      ASSERT_TRUE(compiled.ok()) << c.what << ": " << compiled.status().to_string();
      const std::string dis = disassemble_spirv(compiled->tasks[0].spirv);
      const bool combines = shuffle && c.combines;
      EXPECT_EQ(count(dis, "OpGroupNonUniformShuffleUp %int"), combines ? 1u : 0u)
          << c.what << " shuffle " << shuffle << "\n"
          << dis;
      EXPECT_EQ(count(dis, "OpGroupNonUniformBallotFindMSB"), combines ? 1u : 0u) << c.what;
      // the two adds, twice where the body has a plain copy beside the combining one
      EXPECT_EQ(count(dis, "OpAtomicFAddEXT"), combines ? 4u : 2u) << c.what << "\n" << dis;
    }
  }
}

// atomic_max: with subgroup arithmetic each subgroup whose invocations hit one element issues
// one atomic of their maximum (the test, the reduction and the election in one block), the
// others their own; without it, every invocation its own and no subgroup operation at all.
TEST(CodegenEmit, AtomicMaxCombinesOverASubgroupOnlyWhereTheTargetHasIt) {
  Kernel k = parsed(R"(kernel k(v: ndarray<i32, 1>, m: ndarray<i32, 1>) {
  task main parallel %i in [0, shape(v, 0)) {
    %x = load v[%i] : i32
    atomic_max m[%i], %x
  }
}
)");
  for (bool subgroup : {true, false}) {
    Target t = Target::host();
    t.subgroup_arithmetic = subgroup;
    auto c = compile(k, t);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    std::string dis = disassemble_spirv(c->tasks[0].spirv);
    for (const char* op : {"OpGroupNonUniformAllEqual", "OpGroupNonUniformSMax",
                           "OpGroupNonUniformElect", "OpCapability GroupNonUniformArithmetic"}) {
      EXPECT_EQ(dis.find(op) != std::string::npos, subgroup) << op << "\n" << dis;
    }
    EXPECT_NE(dis.find("OpAtomicSMax"), std::string::npos) << dis;
  }
}

// read_only_buffers: exactly the arrays the task never stores to nor adds to are declared
// NonWritable, and only with the option on.
TEST(CodegenEmit, ReadOnlyBuffersDeclareExactlyTheArraysATaskOnlyReads) {
  Kernel k = parsed(
      R"(kernel k(a: ndarray<f32, 1>, b: ndarray<f32, 1>, c: ndarray<f32, 1>, d: ndarray<i32, 1>) {
  task main parallel %i in [0, shape(a, 0)) {
    %x = load a[%i] : f32
    %y = load b[%i] : f32
    %s = add %x, %y : f32
    store b[%i], %s
    atomic_add c[%i], %x
    %n = load d[%i] : i32
    atomic_max d[%i], %n
  }
}
)");
  for (bool on : {false, true}) {
    CompileOptions o;
    o.read_only_buffers = on;
    auto c = compile(k, Target::host(), o);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    const std::string dis = disassemble_spirv(c->tasks[0].spirv);
    // The disassembler names each variable's id after it (%a), so the decorations read directly.
    for (const char* name : {"a", "b", "c", "d"}) {
      const std::string id = std::string("%") + name;
      ASSERT_NE(dis.find("OpName " + id + " \"" + name + "\""), std::string::npos) << name << "\n"
                                                                                   << dis;
      const bool decorated = dis.find("OpDecorate " + id + " NonWritable") != std::string::npos;
      EXPECT_EQ(decorated, on && std::string(name) == "a") << name << "\n" << dis;
    }
  }
}

// VKAD_DUMP_SPIRV=<dir>: every task's module lands in <dir>/<kernel>.<task>.<hash>.spv holding
// exactly the words compile() returns (the optimized module where spirv-opt ran), and another
// option set's module of the same task is a second file beside the first.
TEST(CodegenEmit, DumpSpirvWritesEachTasksModuleAsCompiled) {
  char tmpl[] = "/tmp/vkad_dump_spirv_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  Kernel k = parsed(testing::kEveryStatementKernel);
  ASSERT_EQ(setenv("VKAD_DUMP_SPIRV", dir.c_str(), 1), 0);
  std::vector<std::vector<uint32_t>> modules;
  for (bool opt : {false, true}) {
    CompileOptions o;
    o.optimize = opt;
    auto c = compile(k, Target::host(), o);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    for (const auto& t : c->tasks) modules.push_back(t.spirv);
  }
  unsetenv("VKAD_DUMP_SPIRV");
  ASSERT_EQ(modules.size(), 4u);
  ASSERT_NE(modules[0], modules[2]) << "spirv-opt changed nothing: the test sees one file";
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  EXPECT_EQ(files.size(), 4u);
  for (size_t m = 0; m < modules.size(); ++m) {
    const std::string prefix = k.name + "." + k.tasks[m % 2].name + ".";
    bool found = false;
    for (const auto& f : files) {
      const std::string name = f.filename().string();
      if (name.rfind(prefix, 0) != 0 || f.extension() != ".spv") continue;
      std::ifstream in(f, std::ios::binary);
      std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      found = found || (bytes.size() == modules[m].size() * 4 &&
                        std::memcmp(bytes.data(), modules[m].data(), bytes.size()) == 0);
    }
    EXPECT_TRUE(found) << "no " << prefix << "*.spv holds module " << m;
  }
  std::filesystem::remove_all(dir);
}

// The unrolled main loop applies exactly where the copies of the body cannot see each other:
// counted by the loads of x in the module (one per copy, plus the tail loop's).
TEST(CodegenEmit, UnrollOnlyStraightLineTasksThatOwnTheirWrites) {
  auto loads_of_x = [](const std::string& text, uint32_t unroll) {
    CompileOptions o;
    o.unroll = unroll;
    auto c = compile(parsed(text), Target::host(), o);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    if (!c.ok()) return -1;
    std::string dis = disassemble_spirv(c->tasks[0].spirv);
    int n = 0;
    for (size_t at = dis.find("OpAccessChain"); at != std::string::npos;
         at = dis.find("OpAccessChain", at + 1)) {
      size_t eol = dis.find('\n', at);
      if (dis.substr(at, eol - at).find("%x ") != std::string::npos) ++n;
    }
    return n;
  };
  const char* owned = R"(kernel k(x: ndarray<f32, 1>, y: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    store y[%i], %v
  }
})";
  const char* shifted = R"(kernel k(x: ndarray<f32, 1>, y: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %one = const 1 : i32
    %j = add %i, %one : i32
    store y[%j], %v
  }
})";
  const char* reads_what_it_writes = R"(kernel k(x: ndarray<f32, 1>, y: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %one = const 1 : i32
    %j = add %i, %one : i32
    %w = load y[%j] : f32
    %s = add %v, %w : f32
    store y[%i], %s
  }
})";
  const char* atomic = R"(kernel k(x: ndarray<f32, 1>, y: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    atomic_add y[%i], %v
  }
})";
  EXPECT_EQ(loads_of_x(owned, 1), 1);
  EXPECT_EQ(loads_of_x(owned, 4), 5);
  for (const char* no : {shifted, reads_what_it_writes, atomic})
    EXPECT_EQ(loads_of_x(no, 4), 1) << no;
}

TEST(CodegenEmit, Deterministic) {
  Kernel k = parsed(testing::kEveryStatementKernel);
  auto a = compile(k, Target::host());
  auto b = compile(parsed(print(k)), Target::host());
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t t = 0; t < a->tasks.size(); ++t) EXPECT_EQ(a->tasks[t].spirv, b->tasks[t].spirv);
  EXPECT_EQ(a->content_hash(), b->content_hash());
}

TEST(CodegenEmit, TargetWithoutF64IsRejectedNotMiscompiled) {
  Target t = Target::host();
  t.float64 = false;
  t.device_name = "tiny";
  auto c = compile(parsed(testing::kEveryStatementKernel), t);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(c.status().message().find("f64 is not supported on this device (tiny"),
            std::string::npos)
      << c.status().message();
}

TEST(CodegenEmit, CacheHitsOnContent) {
  CompileCache cache;
  Kernel k = parsed(testing::kEveryStatementKernel);
  auto a = cache.compile(k, Target::host());
  ASSERT_TRUE(a.ok());
  auto b = cache.compile(parsed(print(k)), Target::host());  // same content, different object
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(cache.hits(), 1u);
  k.tasks[0].local_size = 16;  // different content
  auto c = cache.compile(k, Target::host());
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->get(), c->get());
  EXPECT_EQ(cache.misses(), 2u);
  EXPECT_EQ(cache.size(), 2u);
}

}  // namespace
}  // namespace vkad::codegen
