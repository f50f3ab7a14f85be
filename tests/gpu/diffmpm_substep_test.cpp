// One substep of DiffTaichi's diffmpm (examples/difftaichi/diffmpm.py, build_kernels) written
// with the C++ builder: compute_actuation -> p2g -> grid_op -> g2p, on a 16 x 16 grid with a
// cluster of particles whose stencils overlap (their atomic adds collide) and a few particles
// at the walls and the floor (grid_op's boundary select stops some of their cells). Checked on
// the device with validation on:
//   - the forward, kernel by kernel, against the CPU evaluator of the same IR (reference/
//     cpu_eval.h), within the bounds it derives from Vulkan's precision rules;
//   - the adjoint of the whole substep (the four adjoints chained last-first by a vkad::Tape)
//     of loss = sum of random seeds * (x', v', C', F') with respect to x, v, C, F and the
//     controller's weights and bias, against central differences of that loss computed from
//     f64 forwards on the device;
//   - the f32 adjoint against the (so checked) f64 adjoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "gpu/kernel_harness.h"
#include "ir/builder.h"
#include "reference/cpu_eval.h"
#include "runtime/runtime.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

using namespace codegen;  // NOLINT: kernels read like kernels

// DiffTaichi's constants (diffmpm.py), on a 16^2 grid.
constexpr int kGrid = 16;
constexpr double kInvDx = kGrid, kDx = 1.0 / kGrid;
constexpr double kDt = 1e-3, kPVol = 1, kE = 10, kMu = kE, kLa = kE, kGravity = 3.8;
constexpr double kOmega = 20, kActStrength = 4;
constexpr int kBound = 3, kSinWaves = 4, kActuators = 2, kStep = 7;

// ---------------------------------------------------------------- 2x2 matrices as Values
using Mat2 = std::array<std::array<Value, 2>, 2>;

Mat2 matmul(const Mat2& a, const Mat2& b) {
  Mat2 r;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) r[i][j] = a[i][0] * b[0][j] + a[i][1] * b[1][j];
  return r;
}
Mat2 transpose(const Mat2& a) { return Mat2{{{a[0][0], a[1][0]}, {a[0][1], a[1][1]}}}; }
Mat2 load_mat(const Array& m, Value p) {
  KernelBuilder& kb = *m.builder();
  Mat2 r;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) r[i][j] = m(p, kb.i32(i), kb.i32(j));
  return r;
}
void store_mat(const Array& m, Value p, const Mat2& v) {
  KernelBuilder& kb = *m.builder();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) m.store({p, kb.i32(i), kb.i32(j)}, v[i][j]);
}
// The rotation R of F = R S (Taichi's closed form, as vkad.polar_decompose in python/vkad/
// matrix.py): the rotation by atan2(F10 - F01, F00 + F11), its cosine and sine taken as the
// normalised (F00 + F11, F10 - F01) rather than through atan2 (the same R, and smooth).
Mat2 polar_rotation(const Mat2& f) {
  Value x = f[0][0] + f[1][1], y = f[1][0] - f[0][1];
  Value scale = 1.0 / sqrt(x * x + y * y);
  Value c = x * scale, s = y * scale;
  return Mat2{{{c, -s}, {s, c}}};
}

// ---------------------------------------------------------------- the kernels
// Taichi's base cell of a particle, its position in that cell and the quadratic B-spline
// weights w[i][d] of the 3 nodes along axis d.
struct Stencil {
  std::array<Value, 2> base, fx;
  std::array<std::array<Value, 2>, 3> w;
};
Stencil stencil(const Vec2& xp, DType ft) {
  Stencil s;
  for (int d = 0; d < 2; ++d) {
    s.base[d] = cast(xp[d] * kInvDx - 0.5, DType::kI32);  // truncates toward 0, as ti.cast
    Value fx = xp[d] * kInvDx - cast(s.base[d], ft);
    s.fx[d] = fx;
    s.w[0][d] = 0.5 * (1.5 - fx) * (1.5 - fx);
    s.w[1][d] = 0.75 - (fx - 1.0) * (fx - 1.0);
    s.w[2][d] = 0.5 * (fx - 0.5) * (fx - 0.5);
  }
  return s;
}

constexpr ArrayFlags kGrad{.needs_grad = true};

// actuation[i] = tanh(sum_j weights[i, j] sin(t omega dt + 2 pi j / 4) + bias[i]).
Kernel compute_actuation(DType ft) {
  KernelBuilder kb("compute_actuation");
  Scalar t = kb.scalar("t", DType::kI32);
  Array weights = kb.ndarray("weights", ft, 2, kGrad), bias = kb.ndarray("bias", ft, 1, kGrad);
  Array actuation = kb.ndarray("actuation", ft, 1, kGrad);
  kb.parallel_for("actuators", 0, weights.dim(0), [&](Value i) {
    Value phase = cast(Value(t), ft) * (kOmega * kDt);
    Value act = bias(i);
    for (int j = 0; j < kSinWaves; ++j)
      act = act + weights(i, kb.i32(j)) * sin(phase + 2 * std::numbers::pi / kSinWaves * j);
    actuation.store({i}, tanh(act));
  });
  return kb.finish();
}

// p2g's stress: fixed corotated elasticity of F' plus the actuation stress F' A F'^T, A =
// diag(0, act), scaled into the APIC affine momentum (mass 1: every particle is solid).
Mat2 affine_momentum(const Mat2& nf, const Mat2& cp, Value act) {
  Mat2 r = polar_rotation(nf), nft = transpose(nf), d;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) d[i][j] = nf[i][j] - r[i][j];
  Mat2 corot = matmul(d, nft);
  Value j = nf[0][0] * nf[1][1] - nf[0][1] * nf[1][0];
  Mat2 affine;
  for (int a = 0; a < 2; ++a) {
    for (int b = 0; b < 2; ++b) {
      Value cauchy = 2 * kMu * corot[a][b] + act * nf[a][1] * nf[b][1];
      if (a == b) cauchy = cauchy + kLa * (j - 1.0) * j;
      affine[a][b] = -(kDt * kPVol * 4 * kInvDx * kInvDx) * cauchy + cp[a][b];
    }
  }
  return affine;
}

// p2g: F' = (I + dt C) F stored, then momentum and mass scattered to the 3x3 stencil.
Kernel p2g(DType ft) {
  KernelBuilder kb("p2g");
  Array x = kb.ndarray("x", ft, 2, kGrad), v = kb.ndarray("v", ft, 2, kGrad);
  Array c = kb.ndarray("C", ft, 3, kGrad), f = kb.ndarray("F", ft, 3, kGrad);
  Array actuation = kb.ndarray("actuation", ft, 1, kGrad);
  Array actuator_id = kb.ndarray("actuator_id", DType::kI32, 1, {.read_only = true});
  Array new_f = kb.ndarray("F_new", ft, 3, kGrad);
  Array grid_v = kb.ndarray("grid_v_in", ft, 3, kGrad),
        grid_m = kb.ndarray("grid_m_in", ft, 2, kGrad);
  kb.parallel_for("particles", 0, x.dim(0), [&](Value p) {
    Vec2 xp = x.load_vec<2>({p}), vp = v.load_vec<2>({p});
    Stencil s = stencil(xp, ft);
    Mat2 cp = load_mat(c, p), step = cp;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) step[i][j] = (i == j ? 1.0 : 0.0) + kDt * cp[i][j];
    Mat2 nf = matmul(step, load_mat(f, p));
    store_mat(new_f, p, nf);
    Value id = actuator_id(p);
    Value act = select(id == -1, kb.constant(ft, 0), actuation(max(id, kb.i32(0))) * kActStrength);
    Mat2 affine = affine_momentum(nf, cp, act);
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) {
        Value dx = (i - s.fx[0]) * kDx, dy = (j - s.fx[1]) * kDx;
        Value weight = s.w[i][0] * s.w[j][1];
        Value gi = s.base[0] + i, gj = s.base[1] + j;
        for (int d = 0; d < 2; ++d)
          grid_v.atomic_add({gi, gj, kb.i32(d)},
                            weight * (vp[d] + affine[d][0] * dx + affine[d][1] * dy));
        grid_m.atomic_add({gi, gj}, weight);
      }
    }
  });
  return kb.finish();
}

// grid_op: momentum to velocity, gravity, and the walls and floor stop what moves into them.
Kernel grid_op(DType ft) {
  KernelBuilder kb("grid_op");
  Array grid_v = kb.ndarray("grid_v_in", ft, 3, kGrad),
        grid_m = kb.ndarray("grid_m_in", ft, 2, kGrad);
  Array out = kb.ndarray("grid_v_out", ft, 3, kGrad);
  kb.parallel_for("cells", {0, kGrid}, {0, kGrid}, [&](Value i, Value j) {
    Value inv_m = 1.0 / (grid_m(i, j) + 1e-10);
    Value vx = inv_m * grid_v(i, j, kb.i32(0)),
          vy = inv_m * grid_v(i, j, kb.i32(1)) - kDt * kGravity;
    Value stop = ((i < kBound) && (vx < 0.0)) || ((i > kGrid - kBound) && (vx > 0.0)) ||
                 ((j < kBound) && (vy < 0.0)) || ((j > kGrid - kBound) && (vy > 0.0));
    Value zero = kb.constant(ft, 0);
    out.store({i, j, kb.i32(0)}, select(stop, zero, vx));
    out.store({i, j, kb.i32(1)}, select(stop, zero, vy));
  });
  return kb.finish();
}

// g2p: velocity and the APIC matrix gathered back from the stencil, x advected.
Kernel g2p(DType ft) {
  KernelBuilder kb("g2p");
  Array x = kb.ndarray("x", ft, 2, kGrad), grid_v = kb.ndarray("grid_v_out", ft, 3, kGrad);
  Array x_new = kb.ndarray("x_new", ft, 2, kGrad), v_new = kb.ndarray("v_new", ft, 2, kGrad);
  Array c_new = kb.ndarray("C_new", ft, 3, kGrad);
  kb.parallel_for("particles", 0, x.dim(0), [&](Value p) {
    Vec2 xp = x.load_vec<2>({p});
    Stencil s = stencil(xp, ft);
    std::array<Value, 2> nv;
    Mat2 nc;
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) {
        std::array<Value, 2> dpos = {i - s.fx[0], j - s.fx[1]};
        Value weight = s.w[i][0] * s.w[j][1];
        for (int a = 0; a < 2; ++a) {
          Value g = grid_v(s.base[0] + i, s.base[1] + j, kb.i32(a));
          bool first = i == 0 && j == 0;
          nv[a] = first ? weight * g : nv[a] + weight * g;
          for (int b = 0; b < 2; ++b) {
            Value term = 4 * kInvDx * weight * g * dpos[b];
            nc[a][b] = first ? term : nc[a][b] + term;
          }
        }
      }
    }
    v_new.store_vec<2>({p}, Vec2(nv[0], nv[1]));
    x_new.store_vec<2>({p}, xp + kDt * Vec2(nv[0], nv[1]));
    store_mat(c_new, p, nc);
  });
  return kb.finish();
}

// ---------------------------------------------------------------- arrays and launches
// Every array of the substep; the kernels' parameters name them in order (kT: the step).
enum Slot {
  kX,
  kV,
  kC,
  kF,
  kWeights,
  kBias,
  kAct,
  kActId,
  kFNew,
  kGridV,
  kGridM,
  kGridVOut,
  kXNew,
  kVNew,
  kCNew,
  kSlots
};
constexpr int kT = -1;
const std::vector<int> kKernelArgs[4] = {{kT, kWeights, kBias, kAct},
                                         {kX, kV, kC, kF, kAct, kActId, kFNew, kGridV, kGridM},
                                         {kGridV, kGridM, kGridVOut},
                                         {kX, kGridVOut, kXNew, kVNew, kCNew}};
const Slot kInputs[] = {kX, kV, kC, kF, kWeights, kBias};
const Slot kOutputs[] = {kXNew, kVNew, kCNew, kFNew};
const char* const kNames[kSlots] = {"x",         "v",          "C",           "F",     "weights",
                                    "bias",      "actuation",  "actuator_id", "F_new", "grid_v_in",
                                    "grid_m_in", "grid_v_out", "x_new",       "v_new", "C_new"};

std::vector<uint32_t> slot_shape(int slot, uint32_t n) {
  switch (slot) {
    case kX:
    case kV:
    case kXNew:
    case kVNew: return {n, 2};
    case kC:
    case kF:
    case kFNew:
    case kCNew: return {n, 2, 2};
    case kWeights: return {kActuators, kSinWaves};
    case kBias:
    case kAct: return {kActuators};
    case kActId: return {n};
    case kGridV:
    case kGridVOut: return {kGrid, kGrid, 2};
    default: return {kGrid, kGrid};  // kGridM
  }
}

// All arrays on the host, in the CPU evaluator's representation.
using HostState = std::array<HostArray, kSlots>;

Kernel make_kernel(int k, DType ft) {
  switch (k) {
    case 0: return compute_actuation(ft);
    case 1: return p2g(ft);
    case 2: return grid_op(ft);
    default: return g2p(ft);
  }
}

// The scene: a 6 x 6 cluster half a cell apart (about four particles per cell, so every
// stencil overlaps its neighbours' and the atomic adds collide), jittered, in cells 6..10 of
// both axes, where no boundary condition can hold; and particles at the walls, whose stencils
// reach cells 1..2 or 14..15 (DiffTaichi's walls: i < 3, i > 13, and the floor j < 3):
// moving into the left wall (two, overlapping), away from it (not stopped), into the right
// wall and into the floor. Positions are chosen with x / dx - 0.5 at least 0.1 from an integer
// (no base cell changes under a finite-difference step; check_far_from_switches checks it).
HostState make_scene(DType ft, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  struct P {
    double x, y, vx, vy;
  };
  std::vector<P> ps;
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 6; ++j) {
      double x = 0.5 + (i - 2.5) * 0.5 * kDx + 0.004 * u(rng),
             y = 0.5 + (j - 2.5) * 0.5 * kDx + 0.004 * u(rng);
      ps.push_back({x, y, 0.3 * u(rng), 0.3 * u(rng)});
    }
  }
  ps.push_back({0.130, 0.500, -1.0, 0.2});  // left wall, moving into it
  ps.push_back({0.135, 0.515, -0.8, -0.1});
  ps.push_back({0.130, 0.300, 1.0, 0.1});   // left wall, moving away
  ps.push_back({0.870, 0.420, 0.8, 0.0});   // right wall
  ps.push_back({0.370, 0.130, 0.3, -1.0});  // floor
  const uint32_t n = static_cast<uint32_t>(ps.size());
  HostState h;
  for (int a = 0; a < kSlots; ++a)
    h[a] = HostArray(a == kActId ? DType::kI32 : ft, slot_shape(a, n));
  for (uint32_t p = 0; p < n; ++p) {
    h[kX].data[2 * p] = ps[p].x, h[kX].data[2 * p + 1] = ps[p].y;
    h[kV].data[2 * p] = ps[p].vx, h[kV].data[2 * p + 1] = ps[p].vy;
    for (int e = 0; e < 4; ++e) {
      h[kC].data[4 * p + e] = 0.5 * u(rng);
      h[kF].data[4 * p + e] = (e == 0 || e == 3 ? 1.0 : 0.0) + 0.1 * u(rng);
    }
    h[kActId].data[p] = static_cast<double>(p % 3) - 1;  // -1 (passive), 0, 1
  }
  for (double& w : h[kWeights].data) w = 0.5 * u(rng);  // DiffTaichi starts at 0.01: too weak here
  for (double& b : h[kBias].data) b = 0.2 * u(rng);
  for (HostArray& a : h)
    for (double& v : a.data) v = round_to(a.dtype, v);
  return h;
}

// Host <-> device in the array's dtype.
std::vector<std::byte> to_bytes(const HostArray& a) {
  std::vector<std::byte> out(a.size() * runtime::dtype_bytes(a.dtype));
  for (size_t i = 0; i < a.size(); ++i) {
    if (a.dtype == DType::kF64) {
      std::memcpy(out.data() + 8 * i, &a.data[i], 8);
    } else if (a.dtype == DType::kF32) {
      float f = static_cast<float>(a.data[i]);
      std::memcpy(out.data() + 4 * i, &f, 4);
    } else {
      int32_t v = static_cast<int32_t>(a.data[i]);
      std::memcpy(out.data() + 4 * i, &v, 4);
    }
  }
  return out;
}
Status download(Session& s, NdArrayHandle h, HostArray& a) {
  std::vector<std::byte> bytes(a.size() * runtime::dtype_bytes(a.dtype));
  VKAD_TRY(s.download(h, bytes.data(), bytes.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    if (a.dtype == DType::kF64) {
      std::memcpy(&a.data[i], bytes.data() + 8 * i, 8);
    } else {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      a.data[i] = f;
    }
  }
  return {};
}

// The substep on a session: the four differentiated kernels and one device array per slot.
class DeviceSubstep {
 public:
  explicit DeviceSubstep(Session& s) : s_(s) {}
  // Differentiates the kernels (in `host`'s float dtype) and uploads every slot of `host`.
  Status init(const HostState& host) {
    for (int k = 0; k < 4; ++k) {
      kernels_[k] = make_kernel(k, host[kX].dtype);
      VKAD_ASSIGN_OR_RETURN(d_[k], s_.differentiate(kernels_[k]));
    }
    for (int a = 0; a < kSlots; ++a) {
      VKAD_ASSIGN_OR_RETURN(arrays_[a], s_.ndarray(host[a].dtype, host[a].shape, kNames[a]));
      VKAD_TRY(upload(a, host[a]));
    }
    return {};
  }
  Status upload(int slot, const HostArray& a) {
    std::vector<std::byte> bytes = to_bytes(a);
    return s_.upload(arrays_[slot], bytes.data(), bytes.size());
  }
  Status download(int slot, HostArray& a) { return testing::download(s_, arrays_[slot], a); }
  // One substep: the grids zeroed (p2g accumulates into them), then the four launches,
  // recorded on `tape` when there is one.
  Status run(Tape* tape) {
    const NdArrayHandle grids[] = {arrays_[kGridV], arrays_[kGridM]};
    VKAD_TRY(s_.zero(std::span<const NdArrayHandle>(grids)));
    for (int k = 0; k < 4; ++k) {
      std::vector<Arg> args;
      for (int slot : kKernelArgs[k])
        args.push_back(slot == kT ? Arg::i32(kStep) : Arg::ndarray(arrays_[slot]));
      VKAD_TRY(tape ? tape->launch(d_[k], args) : s_.launch(d_[k].forward, args));
    }
    return {};
  }
  NdArrayHandle array(int slot) const { return arrays_[slot]; }
  const std::array<Kernel, 4>& kernels() const { return kernels_; }

 private:
  Session& s_;
  std::array<Kernel, 4> kernels_;
  std::array<Differentiated, 4> d_;
  std::array<NdArrayHandle, kSlots> arrays_;
};

// The same substep on the CPU evaluator, in place on `host` (with the error bounds it derives).
Status cpu_substep(const std::array<Kernel, 4>& kernels, HostState& host) {
  for (int k = 0; k < 4; ++k) {
    std::vector<HostArg> args;
    for (int slot : kKernelArgs[k])
      args.push_back(slot == kT ? HostArg::of(kStep) : HostArg::of(host[slot]));
    VKAD_ASSIGN_OR_RETURN(EvalResult r, evaluate(kernels[k], args));
    for (uint32_t flag : r.error_flags)
      if (flag != 0)
        return make_error(ErrorCode::kDeviceError,
                          kernels[k].name + " raised error " + std::to_string(flag));
  }
  return {};
}

// The loss: the new state dotted with fixed random seeds, one per output element.
using Seeds = std::array<HostArray, 4>;  // per kOutputs entry
Seeds make_seeds(const HostState& h, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Seeds s;
  for (int o = 0; o < 4; ++o) {
    s[o] = HostArray(h[kOutputs[o]].dtype, h[kOutputs[o]].shape);
    for (double& v : s[o].data) v = round_to(s[o].dtype, u(rng));
  }
  return s;
}
Result<double> device_loss(DeviceSubstep& sub, HostState& h, const Seeds& seeds) {
  VKAD_TRY(sub.run(nullptr));
  double loss = 0;
  for (int o = 0; o < 4; ++o) {
    VKAD_TRY(sub.download(kOutputs[o], h[kOutputs[o]]));
    for (size_t i = 0; i < seeds[o].size(); ++i) loss += seeds[o].data[i] * h[kOutputs[o]].data[i];
  }
  return loss;
}

// d loss / d input for each of kInputs: the substep recorded on a tape, its adjoints run
// last-first from the seeds.
Result<std::array<HostArray, 6>> adjoint_gradients(Session& s, DeviceSubstep& sub,
                                                   const HostState& h, const Seeds& seeds) {
  Tape tape(s);
  VKAD_TRY(sub.run(&tape));
  std::array<std::vector<std::byte>, 4> bytes;
  std::vector<TapeSeed> ts;
  for (int o = 0; o < 4; ++o) {
    bytes[o] = to_bytes(seeds[o]);
    ts.push_back(TapeSeed::of_data(sub.array(kOutputs[o]), bytes[o].data(), bytes[o].size()));
  }
  VKAD_TRY(tape.backward(ts));
  std::array<HostArray, 6> grads;
  for (int i = 0; i < 6; ++i) {
    grads[i] = HostArray(h[kInputs[i]].dtype, h[kInputs[i]].shape);
    VKAD_ASSIGN_OR_RETURN(NdArrayHandle g, tape.grad(sub.array(kInputs[i])));
    VKAD_TRY(download(s, g, grads[i]));
  }
  return grads;
}

// Central difference of the loss in element `e` of input slot `in`, from two device forwards;
// `h` is left as it was (and uploaded so).
Result<double> central_difference(DeviceSubstep& sub, HostState& h, const Seeds& seeds, int in,
                                  size_t e, double step) {
  const double x = h[in].data[e];
  double loss[2], at[2] = {x + step, x - step};
  for (int k = 0; k < 2; ++k) {
    h[in].data[e] = at[k];
    VKAD_TRY(sub.upload(in, h[in]));
    VKAD_ASSIGN_OR_RETURN(loss[k], device_loss(sub, h, seeds));
  }
  h[in].data[e] = x;
  VKAD_TRY(sub.upload(in, h[in]));
  return (loss[0] - loss[1]) / (at[0] - at[1]);
}

// Finite differences must not straddle a switch point: every particle's x / dx - 0.5 stays at
// least 0.1 from an integer (its base cell, a truncation, does not change), and every cell
// with mass in a wall's or the floor's band has its velocity component normal to that wall at
// least 0.05 from 0 (grid_op's select does not flip). A step of 1e-6 moves these by ~1e-4 at
// most (velocities change by O(100) per unit of x). Returns the cells with mass in the bands, and
// how many of them the select stops.
struct BandCells {
  int in_band = 0, stopped = 0;
};
BandCells check_far_from_switches(const HostState& h) {
  for (size_t e = 0; e < h[kX].size(); ++e) {
    double f = h[kX].data[e] * kInvDx - 0.5;
    EXPECT_GT(f - std::floor(f), 0.1) << "x element " << e;
    EXPECT_LT(f - std::floor(f), 0.9) << "x element " << e;
  }
  BandCells cells;
  for (int i = 0; i < kGrid; ++i) {
    for (int j = 0; j < kGrid; ++j) {
      double m = h[kGridM].data[i * kGrid + j];
      if (m == 0) continue;  // no particle reaches it, and none can under a small step
      double v[2] = {h[kGridV].data[2 * (i * kGrid + j)] / m,
                     h[kGridV].data[2 * (i * kGrid + j) + 1] / m - kDt * kGravity};
      bool band[2] = {i < kBound || i > kGrid - kBound, j < kBound || j > kGrid - kBound};
      for (int d = 0; d < 2; ++d) {
        if (band[d]) {
          EXPECT_GT(std::fabs(v[d]), 0.05) << "cell " << i << ", " << j << " component " << d;
        }
      }
      cells.in_band += band[0] || band[1];
      cells.stopped += h[kGridVOut].data[2 * (i * kGrid + j)] == 0 &&
                       h[kGridVOut].data[2 * (i * kGrid + j) + 1] == 0;
    }
  }
  return cells;
}

class DiffMpmSubstep : public ValidatedSessionTest {};

// The device's forward, every array each kernel writes, against the CPU evaluator's.
TEST_F(DiffMpmSubstep, ForwardMatchesCpuReference) {
  for (DType ft : {DType::kF64, DType::kF32}) {
    if (ft == DType::kF64 && !s_->target().float64) {
      std::printf("[  SKIPPED ] f64: the device has no shaderFloat64\n");
      continue;
    }
    SCOPED_TRACE(ft == DType::kF64 ? "f64" : "f32");
    HostState h = make_scene(ft, 1), cpu = h;
    DeviceSubstep sub(*s_);
    ASSERT_TRUE(sub.init(h).ok());
    ASSERT_TRUE(sub.run(nullptr).ok());
    ASSERT_TRUE(cpu_substep(sub.kernels(), cpu).ok());
    for (int slot : {kAct, kFNew, kGridV, kGridM, kGridVOut, kXNew, kVNew, kCNew}) {
      ASSERT_TRUE(sub.download(slot, h[slot]).ok());
      EXPECT_EQ(compare_arrays(h[slot], cpu[slot]), "") << kNames[slot];
    }
    // Each wall particle has 2 x 3 of its cells in a band (the two moving into the left wall
    // share theirs): 24 cells, of which the 6 of the one moving away are not stopped.
    BandCells cells = check_far_from_switches(h);
    EXPECT_EQ(cells.in_band, 24);
    EXPECT_EQ(cells.stopped, 18);
  }
}

// Central differences of the f64 loss, step h = 1e-6 (the inputs are O(0.1..1), so about 1e-6
// relative), have two errors: truncation h^2 / 6 |L'''| and rounding delta / h, where delta is
// the loss's rounding error. L is cubic in x within a cell (B-spline weights are quadratic, C'
// multiplies them by dpos), with third derivatives up to ~(4 / dx) (1 / dx)^2 ~ 1e4 times the
// O(10) velocities and seeds: truncation <= ~1e-8. The loss sums ~1e3 products of O(1) over
// ~1e4 flops, so delta ~ 1e-13 (random-walk rounding at 1.1e-16 per flop) and delta / h ~
// 1e-7. Hence |adjoint - fd| <= 1e-6 max(1, |fd|) (the largest gradients, in x, are O(300));
// measured on lavapipe: 2e-8 at worst, and a seed off by 1e-4 relative in one element fails. A
// wrong derivative rule is off by O(1) relative.
constexpr double kFdStep = 1e-6, kFdTolerance = 1e-6;

TEST_F(DiffMpmSubstep, F64AdjointMatchesCentralDifferences) {
  if (!s_->target().float64) GTEST_SKIP() << "SKIPPED: the device has no shaderFloat64";
  HostState h = make_scene(DType::kF64, 1);
  DeviceSubstep sub(*s_);
  ASSERT_TRUE(sub.init(h).ok());
  Seeds seeds = make_seeds(h, 2);
  auto grads = adjoint_gradients(*s_, sub, h, seeds);
  ASSERT_TRUE(grads.ok()) << grads.status().to_string();
  ASSERT_TRUE(device_loss(sub, h, seeds).ok());
  for (int slot : {kGridV, kGridM, kGridVOut}) ASSERT_TRUE(sub.download(slot, h[slot]).ok());
  check_far_from_switches(h);
  // Every element of every input (502 of them: 2 forwards each, ~1 s on lavapipe).
  for (int i = 0; i < 6; ++i) {
    const HostArray& g = (*grads)[i];
    double worst = 0, gmax = 0;
    for (size_t e = 0; e < g.size(); ++e) {
      auto fd = central_difference(sub, h, seeds, kInputs[i], e, kFdStep);
      ASSERT_TRUE(fd.ok()) << fd.status().to_string();
      double err = std::fabs(g.data[e] - *fd) / std::max(1.0, std::fabs(*fd));
      EXPECT_LE(err, kFdTolerance) << "d loss / d " << kNames[kInputs[i]] << "[" << e
                                   << "]: adjoint " << g.data[e] << ", central difference " << *fd;
      worst = std::max(worst, err), gmax = std::max(gmax, std::fabs(g.data[e]));
    }
    EXPECT_GT(gmax, 0.1) << "a gradient worth comparing: d loss / d " << kNames[kInputs[i]];
    std::printf("d loss / d %-7s max |g| %.3g, worst |g - fd| / max(1, |fd|) %.3g\n",
                kNames[kInputs[i]], gmax, worst);
  }
}

// The f32 substep's adjoint against the f64 one (checked above) on the same f32-representable
// scene and seeds. Central differences in f32 would need a step far beyond a cell's curvature
// (rounding eps_32 |L| / h ~ 6e-7 / h), so the f64 adjoint is the reference. Tolerance:
// 1e-3 max(1, |g64|): Vulkan allows f32 sin 2^-11 absolute error (into the actuation, then
// the weights' gradient), and the adjoint of x divides by cell-size quantities (1 / dx = 16,
// three times in C'), amplifying eps_32 = 6e-8 rounding by ~1e3..1e4 over O(100) gradients;
// measured on lavapipe: 1e-4 for x, 2e-6 at most for the rest.
constexpr double kF32Tolerance = 1e-3;

TEST_F(DiffMpmSubstep, F32AdjointMatchesF64Adjoint) {
  if (!s_->target().float64)
    GTEST_SKIP() << "SKIPPED: the device has no shaderFloat64 (the reference)";
  std::array<HostArray, 6> grads[2];
  for (DType ft : {DType::kF32, DType::kF64}) {
    HostState h = make_scene(DType::kF32, 1);
    for (HostArray& a : h) a.dtype = a.dtype == DType::kF32 ? ft : a.dtype;  // same values
    Seeds seeds = make_seeds(h, 2);  // f32-representable for both
    DeviceSubstep sub(*s_);
    ASSERT_TRUE(sub.init(h).ok());
    auto g = adjoint_gradients(*s_, sub, h, seeds);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    grads[ft == DType::kF64] = std::move(g).value();
  }
  for (int i = 0; i < 6; ++i) {
    double worst = 0;
    for (size_t e = 0; e < grads[0][i].size(); ++e) {
      double g32 = grads[0][i].data[e], g64 = grads[1][i].data[e];
      double err = std::fabs(g32 - g64) / std::max(1.0, std::fabs(g64));
      EXPECT_LE(err, kF32Tolerance)
          << "d loss / d " << kNames[kInputs[i]] << "[" << e << "]: f32 " << g32 << ", f64 " << g64;
      worst = std::max(worst, err);
    }
    std::printf("f32 d loss / d %-7s worst |g32 - g64| / max(1, |g64|) %.3g\n", kNames[kInputs[i]],
                worst);
  }
}

}  // namespace
}  // namespace vkad::testing
