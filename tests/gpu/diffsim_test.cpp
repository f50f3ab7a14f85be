// The README's example at a small size: the loss must fall by at least 10x, and the gradients
// the training used must match central finite differences of the forward kernel on a few
// particles.
#include "diffsim/diffsim.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "gpu/kernel_harness.h"

namespace vkad::testing {
namespace {

using DiffSim = KernelTest;

TEST_F(DiffSim, LossFallsTenfoldWithFiniteDifferenceCheckedGradients) {
  diffsim::Config c;
  c.particles = 256;
  c.steps = 32;
  auto sim = diffsim::Simulation::create(runner_->rt(), c);
  ASSERT_TRUE(sim.ok()) << sim.status().to_string();
  diffsim::Simulation& s = **sim;
  auto first = s.loss();
  ASSERT_TRUE(first.ok());

  // Gradients at the starting point against finite differences of the summed loss.
  auto g = s.gradient();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto v = s.v0();
  ASSERT_TRUE(v.ok());
  for (uint32_t p : {0u, 17u, 255u}) {
    for (uint32_t d = 0; d < 2; ++d) {
      const float h = 1e-2f;
      std::vector<float> plus = *v, minus = *v;
      plus[2 * p + d] += h;
      minus[2 * p + d] -= h;
      auto lp = s.loss_with_v0(plus), lm = s.loss_with_v0(minus);
      ASSERT_TRUE(lp.ok() && lm.ok());
      double fd = (*lp - *lm) * c.particles / (2 * h);  // loss() is the mean; the seed is the sum
      EXPECT_NEAR((*g)[2 * p + d], fd, 2e-2 * std::max(1.0, std::fabs(fd)) + 1e-3)
          << "particle " << p << ", component " << d;
    }
  }

  for (int it = 0; it < 15; ++it) ASSERT_TRUE(s.step().ok());
  auto last = s.loss();
  ASSERT_TRUE(last.ok());
  EXPECT_LE(*last * 10, *first) << "loss " << *first << " -> " << *last;
}

// The example compiles through the on-disk cache in the runtime's cache_dir: the first
// Simulation writes one file per kernel, a second one reads them (no file is written again)
// and computes the same loss.
class DiffSimCached : public KernelTest {
 protected:
  DiffSimCached() {
    std::string t = (std::filesystem::temp_directory_path() / "vkad-diffsim-XXXXXX").string();
    dir_ = ::mkdtemp(t.data()) ? t : "";
  }
  ~DiffSimCached() override {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  runtime::RuntimeOptions options() const override {
    runtime::RuntimeOptions o;
    o.cache_dir = dir_;
    return o;
  }
  // kernel-*.bin file -> its modification time.
  std::map<std::string, std::filesystem::file_time_type> kernel_files() const {
    std::map<std::string, std::filesystem::file_time_type> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("kernel-", 0) == 0) out[name] = e.last_write_time();
    }
    return out;
  }
  std::string dir_;
};

TEST_F(DiffSimCached, SecondStartReadsTheKernelsFromTheCacheFiles) {
  ASSERT_FALSE(dir_.empty());
  diffsim::Config c;
  c.particles = 64;
  c.steps = 8;
  double first_loss = 0;
  {
    auto sim = diffsim::Simulation::create(runner_->rt(), c);
    ASSERT_TRUE(sim.ok()) << sim.status().to_string();
    auto l = (*sim)->loss();
    ASSERT_TRUE(l.ok());
    first_loss = *l;
  }
  const auto written = kernel_files();
  // forward, adjoint, update, reduce, trace
  ASSERT_EQ(written.size(), 5u) << "kernel files in " << dir_;
  auto sim = diffsim::Simulation::create(runner_->rt(), c);
  ASSERT_TRUE(sim.ok()) << sim.status().to_string();
  auto l = (*sim)->loss();
  ASSERT_TRUE(l.ok());
  EXPECT_NEAR(*l, first_loss, 1e-5 * std::fabs(first_loss));
  EXPECT_EQ(kernel_files(), written) << "a kernel was compiled and written again";
}

}  // namespace
}  // namespace vkad::testing
