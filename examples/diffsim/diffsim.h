// A differentiable particle simulation trained by gradient descent on vkad, built only through
// vkad's public API. Each of N particles starts at p0 with a learnable initial velocity v0 and
// is integrated for T steps (gravity, quadratic drag, a spring to its anchor) inside the
// kernel's serial loop, so position and velocity are loop-carried and the adjoint needs the
// adstack. The loss is the squared distance of the final positions to per-particle targets;
// the adjoint gives d loss / d v0 and an update kernel applies it on the device.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "vkad_advanced.h"

namespace diffsim {

struct Config {
  uint32_t particles = 65536;
  uint32_t steps = 256;
  float learning_rate = 0.5f;
  uint32_t seed = 1;
};

struct Timings {
  double compile_ms = 0, forward_ms = 0, adjoint_ms = 0, update_ms = 0;
};

class Simulation {
 public:
  // Builds and compiles the kernels, creates and fills the ndarrays.
  static vkad::Result<std::unique_ptr<Simulation>> create(vkad::runtime::Runtime& rt,
                                                          const Config& c);
  ~Simulation();

  // One training step, asynchronously: forward, adjoint, update (no readback).
  vkad::Status step();
  // Mean loss of the current v0 (runs the forward kernel and reads back: drains retirements).
  vkad::Result<double> loss();
  // d loss / d v0 of the current v0, read back (N x 2), and the loss of a perturbed v0 for
  // finite-difference checks.
  vkad::Result<std::vector<float>> gradient();
  vkad::Result<double> loss_with_v0(const std::vector<float>& v0);
  vkad::Result<std::vector<float>> v0() const;
  // Trajectories of the first `count` particles under the current v0: count x (T+1) x 2.
  vkad::Result<std::vector<float>> trajectories(uint32_t count);
  // One synchronized step split by phase (the training loop itself never waits).
  vkad::Result<Timings> timed_step();

  const std::vector<float>& targets() const { return targets_; }
  const Config& config() const { return config_; }
  // Compiling, registering and preparing the kernels (their pipelines, the adjoint's
  // specialized variant included: made once, before the training loop).
  double compile_ms() const { return compile_ms_; }

 private:
  Simulation(vkad::runtime::Runtime& rt, const Config& c) : rt_(rt), config_(c) {}
  std::array<vkad::runtime::Arg, 6> forward_args() const;
  std::array<vkad::runtime::Arg, 8> adjoint_args() const;
  std::array<vkad::runtime::Arg, 3> update_args() const;
  vkad::Status launch_forward();
  vkad::Status launch_adjoint();
  vkad::Status launch_update();

  vkad::runtime::Runtime& rt_;
  Config config_;
  double compile_ms_ = 0;
  vkad::runtime::KernelHandle forward_, adjoint_, update_, reduce_, trace_;
  vkad::runtime::NdArrayHandle p0_, v0_, target_, loss_, v0_grad_, loss_grad_, total_, traj_;
  std::vector<float> targets_;
};

// The forward kernel (exposed for tests and docs): simulate(steps, dt, p0, v0 grad, target,
// loss grad) writes loss[i] = |p_T - target_i|^2.
vkad::codegen::Kernel simulate_kernel();

}  // namespace diffsim
