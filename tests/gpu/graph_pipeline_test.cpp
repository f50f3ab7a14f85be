// The session's graph passes as a pipeline (SessionOptions::graph_passes, VKAD_GRAPH_PASSES;
// graph/program.h): the text and its edits decide what end_capture does to a capture, and a
// text that does not parse is refused at Session::create, naming what is wrong.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/graphs.h"
#include "runtime/runtime.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

// b = a * c: an element-wise launch; a chain of them fuses.
constexpr const char* kScale = R"(
kernel scale(a: ndarray<f32, 1>, b: ndarray<f32, 1>, c: f32) {
  task main parallel %i in [0, shape(a, 0)) {
    %x = load a[%i] : f32
    %k = arg c : f32
    %m = mul %x, %k : f32
    store b[%i], %m
  }
}
)";

constexpr uint32_t kN = 300, kLinks = 6;

// VKAD_GRAPH_PASSES for the scope of this object.
struct PassesVariable {
  explicit PassesVariable(const char* text) { setenv("VKAD_GRAPH_PASSES", text, 1); }
  ~PassesVariable() { unsetenv("VKAD_GRAPH_PASSES"); }
  PassesVariable(const PassesVariable&) = delete;
  PassesVariable& operator=(const PassesVariable&) = delete;
};

struct Chain {
  size_t graph_steps = 0;
  std::vector<float> out;
};

// x0 -> x1 -> ... -> x6 (each x * 0.5 + nothing), captured and replayed once in a session made
// with `passes`; the graph's launches and the last array.
Chain run_chain(const std::string& passes, bool* skipped) {
  Chain c;
  auto s = validated_session(skipped, [&](SessionOptions& o) { o.graph_passes = passes; });
  if (*skipped || !s) return c;
  Result<KernelHandle> k = s->compile(std::string_view(kScale));
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  std::vector<NdArrayHandle> x;
  for (uint32_t j = 0; j <= kLinks; ++j) x.push_back(*s->ndarray(DType::kF32, {kN}, "x"));
  std::vector<float> x0(kN);
  for (uint32_t i = 0; i < kN; ++i) x0[i] = 1.0f + static_cast<float>(i);
  EXPECT_TRUE(s->upload(x[0], std::span<const float>(x0)).ok());
  EXPECT_TRUE(s->begin_capture("chain").ok());
  for (uint32_t j = 0; j < kLinks; ++j)
    EXPECT_TRUE(s->launch(*k, {Arg::ndarray(x[j]), Arg::ndarray(x[j + 1]), Arg::f32(0.5f)}).ok());
  Result<GraphHandle> g = s->end_capture();
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  if (!g.ok()) return c;
  c.graph_steps = *s->runtime().graphs().graph_steps(*g);
  EXPECT_TRUE(s->replay(*g).ok());
  c.out.resize(kN);
  EXPECT_TRUE(s->download(x[kLinks], std::span<float>(c.out)).ok());
  expect_no_validation_messages(*s);
  return c;
}

TEST(GraphPipeline, ThePassesTextDecidesWhatEndCaptureDoes) {
  bool skipped = false;
  const Chain fused = run_chain("", &skipped);  // the default pipeline
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  const Chain plain = run_chain("none", &skipped);
  const Chain scheduled = run_chain("schedule", &skipped);
  EXPECT_EQ(fused.graph_steps, 1u) << "the default pipeline fuses the chain";
  EXPECT_EQ(plain.graph_steps, kLinks) << "no passes: the graph as captured";
  EXPECT_EQ(scheduled.graph_steps, kLinks) << "scheduling alone does not merge launches";
  for (uint32_t i = 0; i < kN; ++i) {
    const float want = (1.0f + static_cast<float>(i)) / 64.0f;  // exact: halving 6 times
    ASSERT_EQ(fused.out[i], want) << i;
    ASSERT_EQ(plain.out[i], want) << i;
    ASSERT_EQ(scheduled.out[i], want) << i;
  }
}

TEST(GraphPipeline, TheEnvironmentReplacesTheText) {
  bool skipped = false;
  PassesVariable none("none");
  const Chain c = run_chain("", &skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  EXPECT_EQ(c.graph_steps, kLinks);
}

TEST(GraphPipeline, ASwitchRemovesItsPassFromTheText) {
  // fuse_graph_launches = false takes "fuse" out of an explicit text too.
  SessionOptions o;
  o.graph_passes = "schedule, fuse";
  o.fuse_graph_launches = false;
  auto s = Session::create(o);
  if (!s.ok() && s.status().code() == ErrorCode::kNoDevice) GTEST_SKIP() << "no Vulkan device";
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ((*s)->graph_passes(), "schedule");
  o.graph_passes = "";
  o.fuse_graph_launches = true;
  o.resident_max_range = 64;
  o.block_stencils = false;
  auto t = Session::create(o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ((*t)->graph_passes(),
            "rename, roll{max-range=64}, recompute, prune, slice, hoist, schedule, fuse");
}

TEST(GraphPipeline, ABadTextIsRefusedAtCreate) {
  auto message = [](const std::string& passes) {
    SessionOptions o;
    o.graph_passes = passes;
    auto s = Session::create(o);
    if (!s.ok() && s.status().code() == ErrorCode::kNoDevice) return std::string("no device");
    EXPECT_FALSE(s.ok()) << passes;
    EXPECT_EQ(s.status().code(), ErrorCode::kInvalidArgument) << passes;
    return s.status().message();
  };
  const std::string order = message("fuse, schedule");
  if (order == "no device") GTEST_SKIP() << "no Vulkan device";
  EXPECT_NE(order.find("'schedule' must come before 'fuse'"), std::string::npos) << order;
  const std::string unknown = message("roll, fusion");
  EXPECT_NE(unknown.find("unknown pass 'fusion'"), std::string::npos) << unknown;
  PassesVariable bad("roll{max-range=-1}");
  const std::string env = message("");
  EXPECT_NE(env.find("max-range=-1 is not an unsigned number"), std::string::npos) << env;
}

}  // namespace
}  // namespace vkad::testing
