// vkad-example: trains the initial velocities of N particles so that, after T steps of a
// nonlinear simulation (gravity, quadratic drag, springs), they land on their targets.
// Forward, adjoint (reverse mode through the adstack) and update kernels run asynchronously;
// the loss is read back only every few iterations. Writes an SVG with the loss curve and a
// sample of trajectories before and after training.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "diffsim/diffsim.h"

using namespace vkad;

namespace {

const char* kUsage =
    "usage: vkad-example [options]\n"
    "  --particles N     particles (default 65536)\n"
    "  --steps T         simulation steps per forward pass (default 256)\n"
    "  --iterations I    gradient-descent iterations (default 40)\n"
    "  --lr X            learning rate (default 0.5)\n"
    "  --log-every K     read the loss back every K iterations (default 5)\n"
    "  --device D        device index or name substring (default: best GPU, else lavapipe)\n"
    "  --depth D         retirement queue depth (default 3)\n"
    "  --svg PATH        picture to write (default vkad-training.svg)\n"
    "  --validation      enable the Khronos validation layer\n";

void write_svg(const std::string& path, const std::vector<double>& losses,
               const std::vector<int>& iters, const std::vector<float>& before,
               const std::vector<float>& after, const std::vector<float>& targets, uint32_t count,
               uint32_t steps) {
  std::ofstream f(path);
  f << "<svg xmlns='http://www.w3.org/2000/svg' width='960' height='420' font-family='sans-serif' "
       "font-size='12'>\n"
    << "<rect width='960' height='420' fill='white'/>\n";
  // Loss curve, log scale.
  double lo = 1e300, hi = 0;
  for (double l : losses) lo = std::min(lo, l), hi = std::max(hi, l);
  lo = std::log10(std::max(lo, 1e-12)), hi = std::log10(std::max(hi, 1e-12)) + 1e-9;
  f << "<text x='40' y='24'>loss (log scale) vs iteration</text>\n<polyline fill='none' "
       "stroke='#c33' stroke-width='2' points='";
  int last = iters.empty() ? 1 : std::max(iters.back(), 1);
  for (size_t i = 0; i < losses.size(); ++i) {
    double x = 40 + 380.0 * iters[i] / last;
    double y = 380 - 340.0 * (std::log10(std::max(losses[i], 1e-12)) - lo) / (hi - lo);
    f << x << "," << y << " ";
  }
  f << "'/>\n<line x1='40' y1='380' x2='420' y2='380' stroke='black'/><line x1='40' y1='40' "
       "x2='40' y2='380' stroke='black'/>\n";
  // Trajectories: before (grey), after (blue), targets (red).
  f << "<text x='480' y='24'>trajectories: before (grey), after (blue), targets (red)</text>\n";
  auto px = [](float x) { return 700 + 200 * x; };
  auto py = [](float y) { return 230 - 200 * y; };
  for (int pass = 0; pass < 2; ++pass) {
    const std::vector<float>& tr = pass ? after : before;
    for (uint32_t p = 0; p < count; ++p) {
      f << "<polyline fill='none' stroke='" << (pass ? "#36c" : "#bbb") << "' points='";
      for (uint32_t t = 0; t <= steps; ++t) {
        size_t at = (size_t{p} * (steps + 1) + t) * 2;
        f << px(tr[at]) << "," << py(tr[at + 1]) << " ";
      }
      f << "'/>\n";
    }
  }
  for (uint32_t p = 0; p < count; ++p) {
    f << "<circle cx='" << px(targets[2 * p]) << "' cy='" << py(targets[2 * p + 1])
      << "' r='3' fill='#c33'/>\n";
  }
  f << "</svg>\n";
}

}  // namespace

int main(int argc, char** argv) {
  runtime::RuntimeOptions options;
  diffsim::Config config;
  int iterations = 40, log_every = 5;
  std::string svg = "vkad-training.svg";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "vkad-example: %s needs a value\n%s", a.c_str(), kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--particles")
        config.particles = static_cast<uint32_t>(std::stoul(next()));
      else if (a == "--steps")
        config.steps = static_cast<uint32_t>(std::stoul(next()));
      else if (a == "--iterations")
        iterations = std::stoi(next());
      else if (a == "--lr")
        config.learning_rate = std::stof(next());
      else if (a == "--log-every")
        log_every = std::max(1, std::stoi(next()));
      else if (a == "--device")
        options.device.device = next();
      else if (a == "--depth")
        options.retirement_depth = std::stoul(next());
      else if (a == "--svg")
        svg = next();
      else if (a == "--validation")
        options.device.enable_validation = true;
      else {
        std::printf("%s", kUsage);
        return a == "--help" || a == "-h" ? 0 : 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "vkad-example: bad value for %s\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  auto rt_result = runtime::Runtime::create(options);
  if (!rt_result.ok()) {
    std::fprintf(stderr, "vkad-example: %s\n", rt_result.status().to_string().c_str());
    return 1;
  }
  runtime::Runtime& rt = **rt_result;
  std::printf("device: %s (%s)\n", rt.caps().device_name.c_str(),
              rhi::device_kind_name(rt.caps().kind));
  std::printf("training %u particles x %u steps, %d iterations, lr %g, retirement depth %zu\n",
              config.particles, config.steps, iterations, config.learning_rate,
              rt.retirement_depth());

  auto sim_result = diffsim::Simulation::create(rt, config);
  if (!sim_result.ok()) {
    std::fprintf(stderr, "vkad-example: %s\n", sim_result.status().to_string().c_str());
    return 1;
  }
  diffsim::Simulation& sim = **sim_result;
  const uint32_t sample = std::min<uint32_t>(24, config.particles);
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "vkad-example: %s\n", s.to_string().c_str());
    return 1;
  };
  auto before = sim.trajectories(sample);
  auto first = sim.loss();
  if (!before.ok()) return fail(before.status());
  if (!first.ok()) return fail(first.status());
  std::vector<double> losses = {*first};
  std::vector<int> iters = {0};
  std::printf("iter %4d  loss %.4e\n", 0, *first);

  auto t0 = std::chrono::steady_clock::now();
  auto last_log = t0;
  int last_iter = 0;
  for (int it = 1; it <= iterations; ++it) {
    Status s = sim.step();
    if (!s.ok()) return fail(s);
    if (it % log_every == 0 || it == iterations) {
      auto l = sim.loss();  // the readback drains the retirement queue
      if (!l.ok()) return fail(l.status());
      auto now = std::chrono::steady_clock::now();
      double rate = (it - last_iter) / std::chrono::duration<double>(now - last_log).count();
      last_log = now, last_iter = it;
      losses.push_back(*l);
      iters.push_back(it);
      std::printf("iter %4d  loss %.4e  %.2f it/s\n", it, *l, rate);
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto after = sim.trajectories(sample);
  auto timing = sim.timed_step();
  if (!after.ok()) return fail(after.status());
  if (!timing.ok()) return fail(timing.status());
  double ratio = losses.front() / std::max(losses.back(), 1e-30);
  std::printf("final loss %.4e (%.1fx lower than at the start), %.2f iterations/s overall\n",
              losses.back(), ratio, iterations / secs);
  std::printf(
      "time split: compile %.1f ms (once); per iteration forward %.2f ms, adjoint %.2f ms, "
      "update %.2f ms (one synchronized iteration)\n",
      timing->compile_ms, timing->forward_ms, timing->adjoint_ms, timing->update_ms);
  auto st = *rt.stats();
  std::printf(
      "retirement: %llu entries retired by polling, %llu forced waits (%.1f ms blocked), "
      "%llu drained at readbacks, peak %llu bytes held; adstack heaps %llu bytes\n",
      (unsigned long long)st.retirement.retired_by_polling,
      (unsigned long long)st.retirement.forced_waits, st.retirement.forced_wait_us / 1000,
      (unsigned long long)st.retirement.retired_by_drain,
      (unsigned long long)st.retirement.high_water_bytes,
      (unsigned long long)st.adstack_heap_bytes);
  write_svg(svg, losses, iters, *before, *after, sim.targets(), sample, config.steps);
  std::printf("wrote %s\n", svg.c_str());
  if (rt.device().validation_message_count() > 0) {
    for (const auto& m : rt.device().validation_messages())
      std::fprintf(stderr, "validation: %s\n", m.c_str());
    return 4;
  }
  return ratio >= 10 ? 0 : 3;
}
