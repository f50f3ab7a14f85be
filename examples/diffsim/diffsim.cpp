#include "diffsim/diffsim.h"

#include <chrono>
#include <cmath>
#include <random>

#include "api/device_target.h"

namespace diffsim {

using namespace vkad;           // NOLINT: example code reads best unqualified
using namespace vkad::codegen;  // NOLINT
using runtime::Arg;
using runtime::DType;

namespace {

constexpr float kGravity = 2.0f, kDrag = 0.4f, kSpring = 3.0f;

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The simulation body, shared by the training kernel (writes the loss) and the trace kernel
// (records trajectories).
Kernel build(bool trace) {
  KernelBuilder kb(trace ? "trace" : "simulate");
  Scalar steps = kb.scalar("steps", DType::kI32);
  Scalar dt_arg = kb.scalar("dt", DType::kF32);
  Array p0 = kb.ndarray("p0", DType::kF32, 2, {.read_only = true});
  Array v0 = kb.ndarray("v0", DType::kF32, 2, {.needs_grad = !trace, .read_only = trace});
  Array target = kb.ndarray("target", DType::kF32, 2, {.read_only = true});
  Array out = trace ? kb.ndarray("traj", DType::kF32, 3)
                    : kb.ndarray("loss", DType::kF32, 1, {.needs_grad = true});
  Bound range = trace ? Bound(out.dim(0)) : Bound(p0.dim(0));
  kb.parallel_for("particles", 0, range, [&](Value i) {
    Value c0 = kb.i32(0), c1 = kb.i32(1);
    Value ax = p0(i, c0), ay = p0(i, c1);
    Local px = kb.local(ax), py = kb.local(ay);
    Local vx = kb.local(v0(i, c0)), vy = kb.local(v0(i, c1));
    Value dt = dt_arg;
    if (trace) {
      out.store({i, c0, c0}, ax);
      out.store({i, c0, c1}, ay);
    }
    kb.for_range(c0, steps, [&](Value t) {
      Value x = px.load(), y = py.load(), u = vx.load(), w = vy.load();
      Value speed = sqrt(u * u + w * w + 1e-6);
      // Quadratic drag, a spring back to the anchor, gravity.
      Value fx = -kDrag * speed * u - kSpring * (x - ax);
      Value fy = -kDrag * speed * w - kSpring * (y - ay) - kGravity;
      Value nu = u + fx * dt, nw = w + fy * dt;
      vx.store(nu);
      vy.store(nw);
      Value nx = x + nu * dt, ny = y + nw * dt;
      px.store(nx);
      py.store(ny);
      if (trace) {
        Value at = t + kb.i32(1);
        out.store({i, at, c0}, nx);
        out.store({i, at, c1}, ny);
      }
    });
    if (!trace) {
      Value dx = px.load() - target(i, c0), dy = py.load() - target(i, c1);
      out.store({i}, dx * dx + dy * dy);
    }
  });
  return kb.finish();
}

Kernel update_kernel() {
  KernelBuilder kb("update");
  Scalar lr = kb.scalar("lr", DType::kF32);
  Array v0 = kb.ndarray("v0", DType::kF32, 2);
  Array g = kb.ndarray("v0_grad", DType::kF32, 2);
  kb.parallel_for("particles", 0, v0.dim(0), [&](Value i) {
    for (int d = 0; d < 2; ++d) {
      Value c = kb.i32(d);
      v0.store({i, c}, v0(i, c) - Value(lr) * g(i, c));
      g.store({i, c}, kb.f32(0));  // the adjoint accumulates: start the next step from zero
    }
  });
  return kb.finish();
}

Kernel reduce_kernel() {
  KernelBuilder kb("reduce");
  Array loss = kb.ndarray("loss", DType::kF32, 1, {.read_only = true});
  Array total = kb.ndarray("total", DType::kF32, 1);
  kb.serial_for("zero", 0, 1, [&](Value) { total.store({kb.i32(0)}, kb.f32(0)); });
  kb.parallel_for("sum", 0, loss.dim(0), [&](Value i) { total.atomic_add({kb.i32(0)}, loss(i)); });
  return kb.finish();
}

}  // namespace

Kernel simulate_kernel() { return build(false); }

Result<std::unique_ptr<Simulation>> Simulation::create(runtime::Runtime& rt, const Config& c) {
  std::unique_ptr<Simulation> s(new Simulation(rt, c));
  Target target = target_from_caps(rt.caps());
  double t0 = now_ms();
  Kernel fwd = build(false);
  VKAD_ASSIGN_OR_RETURN(Kernel adj, make_adjoint(fwd, target));
  // Compiled through the on-disk cache (docs/caches.md; off when the runtime's
  // cache_dir is empty): a second start reads the validated modules from files, and the
  // runtime's VkPipelineCache gives the driver its pipelines back, so start-up is not a
  // recompile every time.
  CompileCache cache;
  cache.set_disk_dir(rt.cache_dir());
  auto compile_and_register = [&](const Kernel& k, runtime::KernelHandle* out) -> Status {
    VKAD_ASSIGN_OR_RETURN(std::shared_ptr<const runtime::CompiledKernel> c,
                          cache.compile(k, target));
    VKAD_ASSIGN_OR_RETURN(*out, rt.register_kernel(*c));
    return Status::ok_status();
  };
  VKAD_TRY(compile_and_register(fwd, &s->forward_));
  VKAD_TRY(compile_and_register(adj, &s->adjoint_));
  VKAD_TRY(compile_and_register(update_kernel(), &s->update_));
  VKAD_TRY(compile_and_register(reduce_kernel(), &s->reduce_));
  VKAD_TRY(compile_and_register(build(true), &s->trace_));
  s->compile_ms_ = now_ms() - t0;

  uint32_t n = c.particles;
  std::mt19937 rng(c.seed);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<float> p0(2 * n), v0(2 * n, 0.0f);
  s->targets_.resize(2 * n);
  for (uint32_t i = 0; i < n; ++i) {
    p0[2 * i] = 2.0f * u(rng) - 1.0f;
    p0[2 * i + 1] = 0.5f * u(rng);
    s->targets_[2 * i] = p0[2 * i] + 0.8f * u(rng) - 0.4f;
    s->targets_[2 * i + 1] = p0[2 * i + 1] + 0.6f * u(rng) - 0.5f;
  }
  auto make = [&](std::vector<uint32_t> shape, const std::string& name,
                  const std::vector<float>& init, runtime::NdArrayHandle* out) -> Status {
    VKAD_ASSIGN_OR_RETURN(*out, rt.create_ndarray(DType::kF32, shape, name));
    return rt.upload(*out, init.data(), 4 * init.size());
  };
  VKAD_TRY(make({n, 2}, "p0", p0, &s->p0_));
  VKAD_TRY(make({n, 2}, "v0", v0, &s->v0_));
  VKAD_TRY(make({n, 2}, "target", s->targets_, &s->target_));
  VKAD_TRY(make({n}, "loss", std::vector<float>(n, 0), &s->loss_));
  VKAD_TRY(make({n, 2}, "v0_grad", std::vector<float>(2 * n, 0), &s->v0_grad_));
  // d total / d loss_i = 1: the seed of the output gradient.
  VKAD_TRY(make({n}, "loss_grad", std::vector<float>(n, 1), &s->loss_grad_));
  VKAD_TRY(make({1}, "total", {0.0f}, &s->total_));
  // The pipelines the training step's launches use, made now rather than inside the first
  // step (the adjoint's specialized adstack variant is created per launch values).
  t0 = now_ms();
  VKAD_TRY(rt.prepare(s->forward_, s->forward_args()));
  VKAD_TRY(rt.prepare(s->adjoint_, s->adjoint_args()));
  VKAD_TRY(rt.prepare(s->update_, s->update_args()));
  s->compile_ms_ += now_ms() - t0;
  return s;
}

Simulation::~Simulation() {
  for (auto h : {p0_, v0_, target_, loss_, v0_grad_, loss_grad_, total_, traj_}) {
    if (h.id) (void)rt_.free_ndarray(h);
  }
  for (auto k : {forward_, adjoint_, update_, reduce_, trace_}) {
    if (k.id) (void)rt_.unregister_kernel(k);
  }
}

std::array<Arg, 6> Simulation::forward_args() const {
  float dt = 1.0f / static_cast<float>(config_.steps);
  return {Arg::i32(static_cast<int32_t>(config_.steps)),
          Arg::f32(dt),
          Arg::ndarray(p0_),
          Arg::ndarray(v0_),
          Arg::ndarray(target_),
          Arg::ndarray(loss_)};
}

std::array<Arg, 8> Simulation::adjoint_args() const {
  std::array<Arg, 6> f = forward_args();
  return {f[0], f[1], f[2], f[3], f[4], f[5], Arg::ndarray(v0_grad_), Arg::ndarray(loss_grad_)};
}

std::array<Arg, 3> Simulation::update_args() const {
  return {Arg::f32(config_.learning_rate), Arg::ndarray(v0_), Arg::ndarray(v0_grad_)};
}

Status Simulation::launch_forward() { return rt_.launch(forward_, forward_args()); }
Status Simulation::launch_adjoint() { return rt_.launch(adjoint_, adjoint_args()); }
Status Simulation::launch_update() { return rt_.launch(update_, update_args()); }

Status Simulation::step() {
  VKAD_TRY(launch_forward());
  VKAD_TRY(launch_adjoint());
  VKAD_TRY(launch_update());
  return rt_.flush().status();
}

Result<double> Simulation::loss() {
  VKAD_TRY(launch_forward());
  Arg args[] = {Arg::ndarray(loss_), Arg::ndarray(total_)};
  VKAD_TRY(rt_.launch(reduce_, args));
  float total = 0;
  VKAD_TRY(rt_.download(total_, &total, 4));
  return static_cast<double>(total) / config_.particles;
}

Result<std::vector<float>> Simulation::v0() const {
  std::vector<float> v(2 * config_.particles);
  VKAD_TRY(rt_.download(v0_, v.data(), 4 * v.size()));
  return v;
}

Result<std::vector<float>> Simulation::gradient() {
  std::vector<float> g(2 * config_.particles, 0.0f);
  VKAD_TRY(rt_.upload(v0_grad_, g.data(), 4 * g.size()));
  VKAD_TRY(launch_adjoint());
  VKAD_TRY(rt_.download(v0_grad_, g.data(), 4 * g.size()));
  std::vector<float> zero(g.size(), 0.0f);
  VKAD_TRY(rt_.upload(v0_grad_, zero.data(), 4 * zero.size()));
  return g;
}

Result<double> Simulation::loss_with_v0(const std::vector<float>& v) {
  VKAD_ASSIGN_OR_RETURN(std::vector<float> saved, v0());
  VKAD_TRY(rt_.upload(v0_, v.data(), 4 * v.size()));
  Result<double> l = loss();
  VKAD_TRY(rt_.upload(v0_, saved.data(), 4 * saved.size()));
  return l;
}

Result<std::vector<float>> Simulation::trajectories(uint32_t count) {
  count = std::min(count, config_.particles);
  if (!traj_.id) {
    VKAD_ASSIGN_OR_RETURN(traj_,
                          rt_.create_ndarray(DType::kF32, {count, config_.steps + 1, 2}, "traj"));
  }
  float dt = 1.0f / static_cast<float>(config_.steps);
  Arg args[] = {Arg::i32(static_cast<int32_t>(config_.steps)),
                Arg::f32(dt),
                Arg::ndarray(p0_),
                Arg::ndarray(v0_),
                Arg::ndarray(target_),
                Arg::ndarray(traj_)};
  VKAD_TRY(rt_.launch(trace_, args));
  std::vector<float> out(size_t{count} * (config_.steps + 1) * 2);
  VKAD_TRY(rt_.download(traj_, out.data(), 4 * out.size()));
  return out;
}

Result<Timings> Simulation::timed_step() {
  Timings t;
  VKAD_TRY(rt_.synchronize());
  double a = now_ms();
  VKAD_TRY(launch_forward());
  VKAD_TRY(rt_.synchronize());
  double b = now_ms();
  VKAD_TRY(launch_adjoint());
  VKAD_TRY(rt_.synchronize());
  double c = now_ms();
  VKAD_TRY(launch_update());
  VKAD_TRY(rt_.synchronize());
  double d = now_ms();
  t.compile_ms = compile_ms_;
  t.forward_ms = b - a;
  t.adjoint_ms = c - b;
  t.update_ms = d - c;
  return t;
}

}  // namespace diffsim
