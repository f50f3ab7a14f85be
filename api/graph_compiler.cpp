// The graph compiler (api/graph_compiler.h): a capture's rework planned by the session's pipeline
// of graph passes (graph/program.h), the kernels they make compiled. The runtime captured the
// launches one by one, which checked them; when some can roll into a resident loop, be
// reordered, lose a barrier or merge, the same steps are recorded again that way and the first
// graph is dropped (or kept, where scalar updates may need it). This is an optimisation:
// whatever keeps a launch from being reworked (a kernel vkad did not compile, a kernel the
// device refuses) leaves it as it was.
#include "api/graph_compiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "api/phase_clock.h"
#include "ir/text.h"
#include "runtime/runtime.h"

namespace vkad {

const std::vector<uint32_t>* GraphCompiler::extents_of(uint64_t array) const {
  // snapshot_extents' answer: the rework may run on another thread than the runtime's user.
  auto it = rework_extents_.find(array);
  return it != rework_extents_.end() && it->second ? &*it->second : nullptr;
}

void GraphCompiler::snapshot_extents(std::span<const CapturedStep> steps) {
  rework_extents_.clear();
  rework_dtypes_.clear();
  for (const CapturedStep& s : steps) add_extents(s.args);
}

void GraphCompiler::snapshot_extents(std::span<const Arg> args) {
  rework_extents_.clear();
  rework_dtypes_.clear();
  add_extents(args);
}

void GraphCompiler::add_extents(std::span<const Arg> args) {
  for (const Arg& a : args) {
    if (a.kind != abi::ParamKind::kNdArray) continue;
    auto [it, fresh] = rework_extents_.try_emplace(a.array.id);
    if (!fresh) continue;
    Result<std::vector<uint32_t>> shape = core_.rt->shape(a.array);
    if (shape.ok()) it->second = std::move(*shape);
    Result<DType> t = core_.rt->dtype(a.array);
    if (t.ok()) rework_dtypes_[a.array.id] = *t;
  }
}

std::vector<Result<KernelHandle>> GraphCompiler::make(std::span<const codegen::Kernel> ks,
                                                      bool keep_ir) {
  // Once per printed IR: a step loop's rework asks for the same few kernels again and again,
  // and a later rework for those of an earlier one.
  std::unordered_map<std::string, KernelHandle>& made = made_[keep_ir ? 1 : 0];
  std::vector<Result<KernelHandle>> out(ks.size(), KernelHandle{});
  std::vector<std::string> keys(ks.size());
  std::vector<codegen::Kernel> fresh;
  std::vector<size_t> fresh_at;  // their index in ks
  for (size_t i = 0; i < ks.size(); ++i) {
    keys[i] = codegen::print(ks[i]);
    if (auto it = made.find(keys[i]); it != made.end()) {
      out[i] = it->second;
    } else if (refused_kernels_.count(keys[i])) {
      out[i] = make_error(ErrorCode::kInvalidArgument,
                          "graph rework: the device refused kernel '" + ks[i].name + "' before");
    } else {
      fresh.push_back(ks[i]);
      fresh_at.push_back(i);
    }
  }
  if (fresh.empty()) return out;
  std::vector<Result<KernelHandle>> compiled = compile_all(fresh, keep_ir);
  for (size_t j = 0; j < fresh.size(); ++j) {
    const size_t i = fresh_at[j];
    if (compiled[j].ok()) made.emplace(keys[i], *compiled[j]);
    out[i] = std::move(compiled[j]);
  }
  return out;
}

std::vector<Result<KernelHandle>> GraphCompiler::compile_all(std::span<const codegen::Kernel> ks,
                                                             bool keep_ir) {
  const auto t0 = std::chrono::steady_clock::now();
  // A rework kernel is launched only by graphs, each launch with the shapes of its capture:
  // its extents become pipeline constants (launch_spec.h), and its generic pipeline is made
  // only if a launch ever needs it.
  codegen::CompileOptions options = core_.compile_options;
  options.specialize_shapes = true;
  // Compiled side by side (CompileCache is thread-safe): a step loop's rework makes a dozen or
  // more kernels, each emitted and validated on its own (diffmpm with cold caches: 140 ms one
  // by one on the development machine).
  using Compiled = Result<std::shared_ptr<const runtime::CompiledKernel>>;
  std::vector<std::optional<Compiled>> compiled(ks.size());
  std::atomic<size_t> next{0};
  // Nothing may leave a helper thread (std::terminate): a compile that throws leaves its slot
  // empty, read below as a failed compile.
  auto work = [&]() noexcept {
    for (size_t i = next++; i < ks.size(); i = next++) {
      try {
        compiled[i] = core_.compile_cache.compile(ks[i], core_.target, options);
      } catch (...) {
        compiled[i].reset();
      }
    }
  };
  const size_t want =
      std::min<size_t>(ks.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> helpers;
  helpers.reserve(want);  // emplace_back below then allocates only the threads themselves
  try {
    while (helpers.size() + 1 < want) helpers.emplace_back(work);
  } catch (...) {
    // Fewer threads than asked for: this one and those made share the rest.
  }
  work();
  for (std::thread& t : helpers) t.join();
  std::vector<Result<KernelHandle>> out;
  for (size_t i = 0; i < ks.size(); ++i) {
    if (!compiled[i]) {
      compiled[i] = Compiled(make_error(ErrorCode::kOutOfHostMemory,
                                        "compiling '" + ks[i].name + "' threw (out of memory?)"));
    }
    Compiled& ck = *compiled[i];
    Result<KernelHandle> h = ck.ok() ? core_.rt->reserve_kernel_handle() : ck.status();
    if (h.ok()) {
      if (keep_ir) {
        core_.catalog.add(h->id, ks[i], (*ck)->has_adstacks());
      } else {
        // No IR (later reworks do not fuse or recompute it again), but its access summary:
        // a capture that launches it directly (a reworked step loop, GraphCompiler::rework_loop)
        // judges its barriers and a rework of that capture schedules it, instead of fencing.
        core_.catalog.add_access(h->id, ks[i], (*ck)->has_adstacks());
      }
      unregistered_.push_back({*h, std::move(*ck)});
    }
    out.push_back(std::move(h));
  }
  rework_compile_ms_ +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

Status GraphCompiler::materialize_stashes(std::span<const StashNeed> needs, ReworkPlan* w,
                                          std::vector<NdArrayHandle>* owned) {
  for (const StashNeed& n : needs) {
    const bool twin = !n.shape.empty();
    VKAD_ASSIGN_OR_RETURN(
        NdArrayHandle a, core_.rt->create_ndarray(n.dtype, twin ? n.shape : std::vector{n.elements},
                                                  twin ? "renamed array's twin" : "stencil stash"));
    owned->push_back(a);
    for (CapturedStep& s : w->steps) {
      for (Arg& x : s.args) {
        if (x.kind == abi::ParamKind::kNdArray && x.array.id == n.placeholder) x.array = a;
      }
    }
  }
  return {};
}

void GraphCompiler::trace_rework(const ReworkPlan& w, const std::string& name) const {
  // One line per launch the reworked graph runs (a fused run: its members joined by '+'), in
  // run order, with the number of launches a resident loop stands for: what a user checks
  // when a replay issues more launches than expected (VKAD_GRAPH_TRACE).
  std::vector<const CapturedStep*> launches;
  for (const CapturedStep& s : w.steps) {
    if (s.launch) launches.push_back(&s);
  }
  std::fprintf(stderr, "vkad graph '%s': %zu launches in %zu runs\n", name.c_str(), launches.size(),
               w.runs.size());
  for (const codegen::FusionRun& r : w.runs) {
    std::string line;
    for (size_t m = 0; m < r.count; ++m) {
      const std::shared_ptr<const codegen::Kernel>& k =
          core_.catalog.fusible_ir(launches[r.first + m]->kernel.id);
      line += (m ? "+" : "") + (k ? k->name : std::string("?"));
    }
    std::fprintf(stderr, "  %s\n", line.c_str());
  }
}

void GraphCompiler::dump_rework(const ReworkPlan& w, const std::string& name) const {
  // The whole plan, fills included, appended to the file VKAD_GRAPH_DUMP names (docs/graphs.md,
  // "Diagnostics"): what the trace's runs leave out.
  const std::string text = print_plan(
      w,
      [this](uint64_t k) {
        const std::shared_ptr<const codegen::Kernel>& ir = core_.catalog.fusible_ir(k);
        return ir ? ir->name : "k" + std::to_string(k);
      },
      [](uint64_t a) { return "a" + std::to_string(a); });
  append_graph_dump("=== " + name + "\n" + text + "\n");
}

void append_graph_dump(const std::string& text) {
  const char* path = std::getenv("VKAD_GRAPH_DUMP");
  if (FILE* f = path ? std::fopen(path, "a") : nullptr) {
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
}

std::unique_ptr<GraphCompiler::PreparedRework> GraphCompiler::prepare_rework(
    GraphHandle graph, std::vector<CapturedStep> captured, const std::string& name) {
  auto p = std::make_unique<PreparedRework>();
  p->graph = graph;
  p->name = name.empty() ? "graph" : name;
  p->captured = std::move(captured);
  // Extents of this rework only: an array freed later must not be found here.
  struct Forget {
    GraphCompiler* s;
    ~Forget() {
      s->rework_extents_.clear();
      s->rework_dtypes_.clear();
    }
  } forget{this};
  PhaseClock clock("vkad graph rework", &rework_compile_ms_);
  ProgramTarget target;
  target.max_loop_passes = core_.rt->caps().max_loop_passes;
  target.max_local_size = core_.target.max_local_size;
  target.max_storage_buffers = core_.rt->caps().max_storage_buffers;
  target.bounds_checks = core_.compile_options.bounds_checks;
  target.cas_float_atomics_f32 =
      codegen::cas_float_atomics(core_.compile_options, core_.target, false);
  target.cas_float_atomics_f64 =
      codegen::cas_float_atomics(core_.compile_options, core_.target, true);
  // A graph's arrays' types, for the rename pass; a step loop's plan (graph 0) keeps its fills:
  // its zeros are planned around them (StepLoops::plan_zeros).
  PassContext::DTypes dtypes = nullptr;
  if (graph.id != 0) {
    dtypes = [this](uint64_t array) -> std::optional<DType> {
      auto it = rework_dtypes_.find(array);
      return it == rework_dtypes_.end() ? std::nullopt : std::optional<DType>(it->second);
    };
  }
  PassContext ctx(
      core_.catalog, *this, target, [this](uint64_t array) { return extents_of(array); },
      std::move(dtypes));
  Program program = Program::of(p->captured);
  const bool planned =
      core_.pipeline.run(program, ctx, [&](const std::string& pass) { clock.mark(pass.c_str()); });
  if (program.planned && std::getenv("VKAD_GRAPH_TRACE") != nullptr)
    trace_rework(program.w, p->name);
  // Only a plan the pipeline finished: a failed fusion leaves runs without their kernels.
  if (planned && program.planned && std::getenv("VKAD_GRAPH_DUMP") != nullptr)
    dump_rework(program.w, p->name);

  // Registered at the install, or where the rework is dropped: the caches name them. (Where a
  // pass throws they stay in unregistered_ for the caller.)
  p->kernels = std::move(unregistered_);
  unregistered_.clear();
  if (!planned || !program.changed()) return p;
  p->w = std::move(program.w);
  p->roll_index = std::move(program.launch_index);
  p->rolled = std::move(program.merged);
  p->blocked = program.blocked;
  p->dropped = program.dropped;
  p->stashes = std::move(program.stashes);
  p->recompute_pins = std::move(program.recompute_pins);
  p->pinned = std::move(program.pinned);
  // Renaming turns fills into launches and prune leaves launches out: the captured launches'
  // numbering then goes through roll_index as a rolled graph's does.
  p->any_rolled = program.any_merged || program.renumbered;
  p->renumbered_only = program.renumbered && !program.any_merged;
  p->any_recomputed = program.any_recomputed;
  p->reordered = program.reordered;
  p->relaxed = program.relaxed;
  p->rows_used = program.rows_used;
  std::unordered_set<uint64_t> kept;  // the plan's kernels' fusible IR, which w.launches names
  for (const CapturedStep& s : p->w.steps) {
    if (!s.launch || !kept.insert(s.kernel.id).second) continue;
    const std::shared_ptr<const codegen::Kernel>& ir = core_.catalog.fusible_ir(s.kernel.id);
    if (ir) p->ir.push_back(ir);
  }
  p->rework = true;
  return p;
}

bool GraphCompiler::register_rework_kernels(PreparedRework& p) {
  bool all = true;
  for (PendingKernel& k : p.kernels) {
    Result<KernelHandle> h =
        core_.rt->register_kernel(*k.compiled, /*generic_on_demand=*/true, k.handle);
    if (!h.ok()) {
      // This rework keeps the graph as captured; later reworks leave that kernel's piece out
      // (a rolled segment or recomputed gather stays as launched; a fused run's graph stays as
      // captured, as when its kernel fails to compile).
      forget_kernel(k.handle.id);
      all = false;
      continue;
    }
    core_.note_capture_access(h->id, k.compiled->has_adstacks());
  }
  p.kernels.clear();
  return all;
}

void GraphCompiler::forget_kernel(uint64_t id) {
  for (auto& made : made_) {
    for (auto it = made.begin(); it != made.end();) {
      if (it->second.id != id) {
        ++it;
        continue;
      }
      refused_kernels_.insert(it->first);
      it = made.erase(it);
    }
  }
  core_.drop_tables(id);
  core_.pipeline.forget(id);
}

}  // namespace vkad
