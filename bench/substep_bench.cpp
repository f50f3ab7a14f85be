// The substep program of a differentiable simulation through the C++ front door (the same
// program as bench/substep.py, which also runs it in Warp, JAX and torch):
//
//   vkad-bench-substep [--P 16384,1048576] [--steps 1000] [--reps R] [--bandwidth GB/s]
//                      [--no-fuse] [--json out.json]
//
// S substeps of b = sin(a) * 0.9 + 0.1 over P elements, one array per substep; backward runs
// the S adjoints last-first from the seed dL/dx_S = 1 into gradient arrays made once and
// zeroed each iteration. Reports per iteration (median of R after two warm-up iterations): ms
// for the whole iteration (synchronised), host µs per launch recorded (forward and backward
// loops, what launch() costs the caller), and the memory floor at the given bandwidth: 8 bytes
// per element and substep, the x_j and gradient arrays the program writes (each must reach
// memory once whatever runs it; the inputs can be recomputed from x_0 in registers). The
// launches one by one move 20 (the forward reads a and writes b, the adjoint reads a and b's
// gradient and writes a's), also printed; a fused replay moves less than that, never less
// than the floor. The gradient is checked against the closed form.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "vkad.h"

using namespace vkad;

namespace {

constexpr const char* kStep = R"(
kernel step(a: ndarray<f32, 1> grad, b: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(a, 0)) {
    %x = load a[%i] : f32
    %s = sin %x : f32
    %c9 = const 0.9 : f32
    %m = mul %s, %c9 : f32
    %c1 = const 0.1 : f32
    %y = add %m, %c1 : f32
    store b[%i], %y
  }
}
)";

int die(const char* what, const Status& s) {
  std::fprintf(stderr, "vkad-bench-substep: %s: %s\n", what, s.to_string().c_str());
  return 1;
}

struct Result1 {
  double ms = 0, record_us = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is printed, also into a pipe or file
  bench::Args args(argc, argv,
                   "usage: vkad-bench-substep [--P LIST] [--steps S] [--reps R] [--bandwidth GBS] "
                   "[--no-fuse] [--json F]\n"
                   "  S substeps of b = sin(a)*0.9 + 0.1 over P elements, one array per step,\n"
                   "  forward + backward through the adjoints, ms per iteration\n"
                   "  --P LIST       element counts (default 16384,1048576)\n"
                   "  --steps S      substeps (default 1000)\n"
                   "  --reps R       timed iterations, median reported (default 10)\n"
                   "  --bandwidth B  GB/s for the memory floor (default 4000)\n"
                   "  --no-fuse      capture without launch fusion (Session::begin_capture)\n"
                   "  --json F       also write the results as JSON to F\n",
                   {"P", "steps", "reps", "bandwidth", "json", "no-fuse"});
  const uint32_t steps = static_cast<uint32_t>(args.get_int("steps", 1000));
  const int reps = static_cast<int>(args.get_int("reps", 10));
  const double bandwidth = std::stod(args.get("bandwidth", "4000"));
  std::vector<uint32_t> sizes;
  {
    std::string list = args.get("P", "16384,1048576");
    size_t at = 0;
    while (at < list.size()) {
      size_t comma = list.find(',', at);
      sizes.push_back(static_cast<uint32_t>(std::stoul(list.substr(at, comma - at))));
      at = comma == std::string::npos ? list.size() : comma + 1;
    }
  }
  SessionOptions options;
  options.fuse_graph_launches = !args.has("no-fuse");
  auto session = Session::create(options);
  if (!session.ok()) return die("session", session.status());
  Session& s = **session;
  auto d = s.differentiate(std::string_view(kStep));
  if (!d.ok()) return die("differentiate", d.status());
  bench::JsonRecords json;
  std::printf("device: %s\n", s.device_name().c_str());
  for (uint32_t P : sizes) {
    // Seeded random inputs over [0, 1) (bench_util.h).
    const std::vector<float> x0 = bench::random_floats(P, 1, 0.0f, 1.0f);
    std::vector<NdArrayHandle> xs, gs;
    for (uint32_t j = 0; j <= steps; ++j) {
      auto x = s.ndarray(DType::kF32, {P}, "x" + std::to_string(j));
      auto g = s.ndarray(DType::kF32, {P}, "x" + std::to_string(j) + "_grad");
      if (!x.ok()) return die("ndarray", x.status());
      if (!g.ok()) return die("ndarray", g.status());
      xs.push_back(*x);
      gs.push_back(*g);
    }
    Status st = s.upload(xs[0], std::span<const float>(x0));
    if (!st.ok()) return die("upload", st);
    std::vector<std::vector<Arg>> fwd(steps), adj(steps);
    for (uint32_t j = 0; j < steps; ++j) {
      const Arg f[] = {Arg::ndarray(xs[j]), Arg::ndarray(xs[j + 1])};
      const NdArrayHandle g[] = {gs[j], gs[j + 1]};
      auto a = d->adjoint_args(f, g);
      if (!a.ok()) return die("adjoint_args", a.status());
      fwd[j].assign(std::begin(f), std::end(f));
      adj[j] = *a;
    }
    // One iteration recorded (no wait): forward, gradients zeroed (one barrier pair), seed,
    // adjoints last-first. `launch_us` gets the host time of the two launch loops.
    auto record = [&](double* launch_us) -> Status {
      const double t0 = bench::now_us();
      for (uint32_t j = 0; j < steps; ++j) VKAD_TRY(s.launch(d->forward, fwd[j]));
      const double t1 = bench::now_us();
      VKAD_TRY(s.zero(std::span<const NdArrayHandle>(gs.data(), steps)));
      VKAD_TRY(s.fill(gs[steps], 1.0));
      const double t2 = bench::now_us();
      for (uint32_t j = steps; j-- > 0;) VKAD_TRY(s.launch(d->adjoint, adj[j]));
      const double t3 = bench::now_us();
      *launch_us = (t1 - t0) + (t3 - t2);
      return {};
    };
    auto iteration = [&](Result1* r) -> Status {
      const double t0 = bench::now_us();
      double launch_us = 0;
      VKAD_TRY(record(&launch_us));
      VKAD_TRY(s.synchronize());
      r->ms = (bench::now_us() - t0) / 1e3;
      r->record_us = launch_us / (2.0 * steps);
      return {};
    };
    // The closed form dL/dx0 = prod 0.9 cos(x_k) at every 97th element and the last, after the
    // direct iterations and after the replays; a wrong gradient exits 1 naming the element.
    auto check = [&](const char* after) -> int {
      std::vector<float> g(P);
      Status got = s.download(gs[0], std::span<float>(g));
      if (!got.ok()) return die("download", got);
      std::vector<uint32_t> at;
      for (uint32_t i = 0; i < P; i += 97) at.push_back(i);
      at.push_back(P - 1);
      for (uint32_t i : at) {
        double x = x0[i], want = 1;
        for (uint32_t k = 0; k < steps; ++k) {
          want *= 0.9 * std::cos(x);
          x = std::sin(x) * 0.9 + 0.1;
        }
        if (!(std::fabs(g[i] - want) <= 2e-3 * std::fabs(want) + 1e-30)) {
          std::fprintf(stderr, "gradient at %u after %s: %g, closed form %g\n", i, after, g[i],
                       want);
          return 1;
        }
      }
      return 0;
    };
    Result1 r;
    for (int w = 0; w < 2; ++w) {
      if (!(st = iteration(&r)).ok()) return die("iteration", st);
    }
    std::vector<double> ms, rec;
    for (int i = 0; i < reps; ++i) {
      if (!(st = iteration(&r)).ok()) return die("iteration", st);
      ms.push_back(r.ms);
      rec.push_back(r.record_us);
    }
    if (check("the direct iterations")) return 1;
    // The same iteration captured once (Session::begin_capture) and replayed: host time per
    // replayed launch, and the iteration time.
    if (!(st = s.begin_capture("substep")).ok()) return die("begin_capture", st);
    double ignored = 0;
    if (!(st = record(&ignored)).ok()) return die("capture", st);
    auto graph = s.end_capture();
    if (!graph.ok()) return die("end_capture", graph.status());
    std::vector<double> gms, grec;
    const uint64_t launches0 = s.stats().ok() ? s.stats()->launches : 0;
    for (int i = 0; i < reps + 2; ++i) {
      const double t0 = bench::now_us();
      if (!(st = s.replay(*graph)).ok()) return die("replay", st);
      const double t1 = bench::now_us();
      if (!(st = s.synchronize()).ok()) return die("synchronize", st);
      const double t2 = bench::now_us();
      if (i < 2) continue;
      gms.push_back((t2 - t0) / 1e3);
      grec.push_back((t1 - t0) / (2.0 * steps));
    }
    const double replay_launches =
        static_cast<double>((s.stats().ok() ? s.stats()->launches : 0) - launches0) / (reps + 2);
    (void)s.release_graph(*graph);
    if (check("the replays")) return 1;
    // Where the replayed iteration's time goes: its three parts captured as graphs of their
    // own (forward launches; zeroing and seed; adjoints) and replayed alone.
    double part_ms[3] = {0, 0, 0};
    for (int part = 0; part < 3; ++part) {
      if (!(st = s.begin_capture("part")).ok()) return die("begin_capture", st);
      if (part == 0) {
        for (uint32_t j = 0; j < steps && st.ok(); ++j) st = s.launch(d->forward, fwd[j]);
      } else if (part == 1) {
        st = s.zero(std::span<const NdArrayHandle>(gs.data(), steps));
        if (st.ok()) st = s.fill(gs[steps], 1.0);
      } else {
        for (uint32_t j = steps; j-- > 0 && st.ok();) st = s.launch(d->adjoint, adj[j]);
      }
      auto pg = s.end_capture();
      if (!st.ok()) return die("capture", st);
      if (!pg.ok()) return die("end_capture", pg.status());
      std::vector<double> pms;
      for (int i = 0; i < reps + 2; ++i) {
        const double t0 = bench::now_us();
        if (!(st = s.replay(*pg)).ok() || !(st = s.synchronize()).ok()) return die("replay", st);
        if (i >= 2) pms.push_back((bench::now_us() - t0) / 1e3);
      }
      (void)s.release_graph(*pg);
      part_ms[part] = bench::median(pms);
    }
    const double floor_ms = 8.0 * P * steps / (bandwidth * 1e9) * 1e3;
    const double unfused_ms = 20.0 * P * steps / (bandwidth * 1e9) * 1e3;
    const double m = bench::median(ms), rc = bench::median(rec);
    const double gm = bench::median(gms), grc = bench::median(grec);
    std::printf(
        "P = %8u, %u substeps: %9.2f ms/iteration (%.1fx the %.2f ms floor at %g GB/s: 8 B per "
        "element and substep written; %.1fx the %.2f ms its launches one by one move), "
        "%.2f us per launch recorded\n",
        P, steps, m, m / floor_ms, floor_ms, bandwidth, m / unfused_ms, unfused_ms, rc);
    std::printf(
        "  captured and replayed:   %9.2f ms/iteration (%.1fx the floor), %.3f us of host "
        "time per captured launch, %.0f launches per replay (%s)\n",
        gm, gm / floor_ms, grc, replay_launches,
        replay_launches < 2.0 * steps ? "fused" : "not fused");
    std::printf(
        "  replayed alone:          forward %.2f ms, zeroing and seed %.2f ms, backward %.2f ms\n",
        part_ms[0], part_ms[1], part_ms[2]);
    if (m < floor_ms || gm < floor_ms) {
      // Past the physical limit: the measurement is wrong (a skipped launch, a timer), not fast.
      std::printf("  FLAGGED: a figure above is below the %.2f ms memory floor\n", floor_ms);
    }
    json.begin();
    json.field("bench", "substep");
    json.field("P", static_cast<double>(P));
    json.field("steps", static_cast<double>(steps));
    json.field("ms", m);
    json.field("record_us_per_launch", rc);
    json.field("floor_ms", floor_ms);
    json.field("unfused_traffic_ms", unfused_ms);
    json.field("graph_ms", gm);
    json.field("graph_record_us_per_launch", grc);
    json.field("graph_launches_per_replay", replay_launches);
    json.field("forward_ms", part_ms[0]);
    json.field("zero_ms", part_ms[1]);
    json.field("backward_ms", part_ms[2]);
    for (size_t j = 0; j <= steps; ++j) {
      (void)s.free(xs[j]);
      (void)s.free(gs[j]);
    }
  }
  const std::string path = args.get("json", "");
  if (!path.empty() && !json.write(path, s.device_name())) return 1;
  return 0;
}
