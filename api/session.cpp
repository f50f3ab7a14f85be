#include "api/session.h"

#include <algorithm>
#include <cstdlib>
#include <system_error>
#include <thread>
#include <utility>

#include "api/device_target.h"
#include "autodiff/reverse_mode.h"
#include "graph/launch_fusion.h"
#include "ir/text.h"
#include "rhi/device.h"
#include "runtime/runtime.h"

namespace vkad {

Result<std::vector<Arg>> Differentiated::adjoint_args(std::span<const Arg> forward_args,
                                                      std::span<const NdArrayHandle> grads) const {
  if (forward_args.size() != forward_params) {
    return make_error(ErrorCode::kInvalidArgument,
                      "adjoint_args: " + std::to_string(forward_args.size()) +
                          " forward arguments given, the forward kernel has " +
                          std::to_string(forward_params) + " parameters");
  }
  if (grads.size() != gradients.size()) {
    std::string names;
    for (const GradientParam& g : gradients) names += (names.empty() ? "" : ", ") + g.name;
    return make_error(ErrorCode::kInvalidArgument,
                      "adjoint_args: " + std::to_string(grads.size()) +
                          " gradient arrays given, the adjoint takes " +
                          std::to_string(gradients.size()) + " (" + names + ")");
  }
  std::vector<Arg> out(forward_args.begin(), forward_args.end());
  for (NdArrayHandle g : grads) out.push_back(Arg::ndarray(g));
  return out;
}

Result<std::unique_ptr<Session>> Session::create(const SessionOptions& options) {
  runtime::RuntimeOptions ro;
  ro.device.device = options.device;
  ro.device.enable_validation = options.validation;
  ro.retirement_depth = options.retirement_depth;
  ro.device.spare_blocks_per_memory_type = options.spare_memory_blocks;
  ro.cache_dir = options.cache_dir;
  return create_with_runtime(ro, options);
}

Result<std::unique_ptr<Session>> Session::create(const runtime::RuntimeOptions& runtime,
                                                 const codegen::CompileOptions& compile) {
  SessionOptions options;
  options.compile = compile;
  return create_with_runtime(runtime, options);
}

Result<std::unique_ptr<Session>> Session::create_with_runtime(
    const runtime::RuntimeOptions& runtime, const SessionOptions& options) {
  VKAD_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Runtime> rt, runtime::Runtime::create(runtime));
  std::unique_ptr<Session> s(new Session());
  s->compile_options_ = options.compile;
  // VKAD_SPECIALIZE_SHAPES=0 turns shape specialization off for every session (what a
  // suspected problem with it is checked against, and the baseline of a measurement).
  const char* shapes = std::getenv("VKAD_SPECIALIZE_SHAPES");
  if (shapes != nullptr && std::string(shapes) == "0")
    s->compile_options_.specialize_shapes = false;
  // VKAD_CHECK_FINITE=1 turns the NaN / infinity checks on for every session (a program's
  // debug run without editing it).
  const char* finite = std::getenv("VKAD_CHECK_FINITE");
  if (finite != nullptr && std::string(finite) == "1") s->compile_options_.check_finite = true;
  // VKAD_GRAPH_FUSION=0 turns launch fusion off for every session (what C and Python users
  // have, and what a suspected fusion problem is checked against).
  const char* fusion = std::getenv("VKAD_GRAPH_FUSION");
  s->fuse_graph_launches_ =
      options.fuse_graph_launches && (fusion == nullptr || std::string(fusion) != "0");
  const char* schedule = std::getenv("VKAD_GRAPH_SCHEDULE");  // the same, for scheduling
  s->schedule_graph_launches_ =
      options.schedule_graph_launches && (schedule == nullptr || std::string(schedule) != "0");
  const char* recompute = std::getenv("VKAD_GRAPH_RECOMPUTE");  // and for gather recompute
  s->recompute_graph_gathers_ = recompute == nullptr || std::string(recompute) != "0";
  // The same for resident step loops; a number sets the largest range rolled, and wins over the
  // option (what a suspected problem is checked against, and how a benchmark tries another
  // limit without rebuilding).
  s->resident_max_range_ = options.resident_max_range;
  if (const char* resident = std::getenv("VKAD_GRAPH_RESIDENT")) {
    // strtoull saturates; clamped rather than truncated to 32 bits ("4294967296" is not 0).
    s->resident_max_range_ = static_cast<uint32_t>(
        std::min<unsigned long long>(std::strtoull(resident, nullptr, 10), UINT32_MAX));
  }
  const char* block = std::getenv("VKAD_GRAPH_BLOCK");  // and for blocked stencils
  s->block_stencils_ = options.block_stencils && (block == nullptr || std::string(block) != "0");
  s->target_ = codegen::target_from_caps(rt->caps());
  s->adjoint_options_ = codegen::adjoint_options_from_caps(rt->caps());
  s->device_uuid_ = rhi::format_uuid(rt->caps().device_uuid);
  s->compile_cache_.set_disk_dir(rt->cache_dir());
  s->rt_ = std::move(rt);
  return s;
}

Session::~Session() {
  // The background worker reads this session's tables, prepare_loop's its compile cache: they
  // end before those go.
  join_rework();
  join_loop_jobs();
}

void Session::join_rework() {
  if (background_ && background_->worker.joinable()) background_->worker.join();
}

void Session::settle_rework() {
  if (!background_) return;
  join_rework();
  std::unique_ptr<BackgroundRework> bg = std::move(background_);
  if (bg->result == nullptr) return;
  Result<GraphHandle> g = install_rework(*bg->result, /*keep_captured=*/true);
  if (!g.ok() || g->id == bg->graph.id) return;
  reworked_[bg->graph.id] = *g;
  fused_graphs_.at(g->id).carried = std::move(bg->updates);
}

Result<KernelHandle> Session::compile(const codegen::Kernel& kernel) {
  join_rework();  // register_ir writes the tables a background rework reads
  VKAD_ASSIGN_OR_RETURN(std::shared_ptr<const runtime::CompiledKernel> ck,
                        compile_cache_.compile(kernel, target_, compile_options_));
  return register_ir(kernel, *ck);
}

Result<KernelHandle> Session::register_ir(const codegen::Kernel& kernel,
                                          const runtime::CompiledKernel& ck,
                                          bool generic_on_demand) {
  Result<KernelHandle> h = rt_->register_kernel(ck, generic_on_demand);
  if (!h.ok()) {
    // A module read from the disk cache that validates but does not match its description
    // (an edited file): compiled again once, its file rewritten (CompileCache::rebuild).
    VKAD_ASSIGN_OR_RETURN(std::shared_ptr<const runtime::CompiledKernel> fresh,
                          compile_cache_.rebuild(kernel, ck));
    if (!fresh) return h.status();
    return register_ir(kernel, *fresh, generic_on_demand);
  }
  note_ir(kernel, ck, h->id);
  note_capture_access(h->id, ck.has_adstacks());
  return *h;
}

void Session::note_capture_access(uint64_t id, bool adstack) {
  const std::shared_ptr<const codegen::KernelAccess>& access = catalog_.access(id);
  if (!access) return;  // unknown: a capture fences it
  CaptureAccess& ca = capture_access_[id];
  ca = CaptureAccess{};
  ca.adstack = adstack;
  for (const codegen::ParamAccess& p : access->params) {
    uint8_t kinds = 0;
    for (const codegen::ArrayAccess& a : p.accesses) kinds |= kind_bit(a.kind);
    ca.params.emplace_back(p.param, kinds);
  }
}

void Session::note_ir(const codegen::Kernel& kernel, const runtime::CompiledKernel& ck,
                      uint64_t id) {
  catalog_.add(id, kernel, ck.has_adstacks());
}

Result<KernelHandle> Session::compile(std::string_view ir_text) {
  VKAD_ASSIGN_OR_RETURN(codegen::Kernel k, codegen::parse(std::string(ir_text)));
  return compile(k);
}

Result<Differentiated> Session::differentiate(const codegen::Kernel& forward) {
  join_rework();
  bool any = false;
  for (const codegen::Param& p : forward.params) any = any || p.needs_grad;
  if (!any) {
    return make_error(ErrorCode::kInvalidArgument,
                      "differentiate '" + forward.name +
                          "': no parameter is marked grad, so there is no gradient to compute");
  }
  VKAD_ASSIGN_OR_RETURN(codegen::Kernel adjoint,
                        codegen::make_adjoint(forward, target_, adjoint_options_));
  VKAD_ASSIGN_OR_RETURN(std::shared_ptr<const runtime::CompiledKernel> fck,
                        compile_cache_.compile(forward, target_, compile_options_));
  VKAD_ASSIGN_OR_RETURN(std::shared_ptr<const runtime::CompiledKernel> ack,
                        compile_cache_.compile(adjoint, target_, compile_options_));
  Differentiated d;
  d.forward_params = static_cast<uint32_t>(forward.params.size());
  // make_adjoint's contract (reverse_mode.h): the forward's parameters, then one gradient per
  // parameter marked grad, in parameter order.
  uint32_t next = d.forward_params;
  for (uint32_t p = 0; p < forward.params.size(); ++p) {
    if (!forward.params[p].needs_grad) continue;
    if (next >= adjoint.params.size()) {
      return make_error(ErrorCode::kInternal, "differentiate '" + forward.name +
                                                  "': the adjoint lacks the gradient of '" +
                                                  forward.params[p].name + "'");
    }
    d.gradients.push_back({p, next, adjoint.params[next].name});
    ++next;
  }
  VKAD_ASSIGN_OR_RETURN(d.forward, register_ir(forward, *fck));
  forward_ir_[d.forward.id] = std::make_shared<const codegen::Kernel>(forward);
  Result<KernelHandle> a = register_ir(adjoint, *ack);
  if (!a.ok()) {
    (void)release(d.forward);  // a failed call changes nothing
    return a.status();
  }
  d.adjoint = *a;
  access_[d.forward.id] = catalog_.access(d.forward.id);  // register_ir computed it
  return d;
}

Result<Differentiated> Session::differentiate(std::string_view ir_text) {
  VKAD_ASSIGN_OR_RETURN(codegen::Kernel k, codegen::parse(std::string(ir_text)));
  return differentiate(k);
}

Status Session::release(KernelHandle kernel) {
  join_rework();
  VKAD_TRY(rt_->unregister_kernel(kernel));
  drop_tables(kernel.id);
  forward_ir_.erase(kernel.id);
  auto c = clearing_.find(kernel.id);
  if (c != clearing_.end()) {
    (void)rt_->unregister_kernel(c->second);
    drop_tables(c->second.id);
    clearing_.erase(c);
  }
  access_.erase(kernel.id);
  return {};
}

void Session::drop_tables(uint64_t id) {
  catalog_.drop(id);
  capture_access_.erase(id);
}

std::shared_ptr<const codegen::KernelAccess> Session::launch_access(KernelHandle forward) const {
  auto it = access_.find(forward.id);
  return it == access_.end() ? nullptr : it->second;
}

Result<NdArrayHandle> Session::ndarray(DType dtype, std::vector<uint32_t> shape,
                                       const std::string& name) {
  return rt_->create_ndarray(dtype, std::move(shape), name);
}
Status Session::free(NdArrayHandle array) { return rt_->free_ndarray(array); }
Status Session::zero(NdArrayHandle array) { return fill(array, 0.0); }
Status Session::copy(NdArrayHandle src, NdArrayHandle dst) { return rt_->copy(src, dst); }

Result<KernelHandle> Session::clearing_adjoint(const Differentiated& d) {
  join_rework();
  auto done = clearing_.find(d.forward.id);
  if (done != clearing_.end()) return done->second;
  auto f = forward_ir_.find(d.forward.id);
  if (f == forward_ir_.end()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "clearing_adjoint: kernel " + runtime::handle_string(d.forward.id) +
                          " is not a live differentiate() result of this session");
  }
  VKAD_ASSIGN_OR_RETURN(codegen::Kernel adjoint,
                        codegen::make_clearing_adjoint(*f->second, target_, adjoint_options_));
  VKAD_ASSIGN_OR_RETURN(std::shared_ptr<const runtime::CompiledKernel> ck,
                        compile_cache_.compile(adjoint, target_, compile_options_));
  // Through register_ir: a checkpointed tape's captured backward is scheduled and fused like
  // any other launches (a kernel without its IR would be a fence there).
  VKAD_ASSIGN_OR_RETURN(KernelHandle h, register_ir(adjoint, *ck));
  clearing_.emplace(d.forward.id, h);
  return h;
}
Status Session::zero(std::span<const NdArrayHandle> arrays) {
  if (capture_ && !rt_->capturing()) capture_.reset();  // ended through runtime()
  VKAD_TRY(rt_->zero_many(arrays));
  if (capture_) {
    // The fills' barriers order everything before them and after (none for no arrays).
    if (!arrays.empty()) capture_barriers_.clear();
    for (NdArrayHandle h : arrays) {
      const Arg a = Arg::ndarray(h);
      capture_->add(false, {}, {&a, 1}, 0.0);
    }
  }
  return {};
}
Status Session::fill(NdArrayHandle array, double value) {
  if (capture_ && !rt_->capturing()) capture_.reset();  // ended through runtime()
  VKAD_TRY(rt_->fill(array, value));
  if (capture_) {
    capture_barriers_.clear();
    const Arg a = Arg::ndarray(array);
    capture_->add(false, {}, {&a, 1}, value);
  }
  return {};
}
Status Session::upload(NdArrayHandle array, const void* data, uint64_t bytes) {
  return rt_->upload(array, data, bytes);
}
Status Session::download(NdArrayHandle array, void* out, uint64_t bytes) {
  return rt_->download(array, out, bytes);
}
Result<std::vector<uint32_t>> Session::shape(NdArrayHandle array) const {
  return rt_->shape(array);
}
Result<uint32_t> Session::extent(NdArrayHandle array, uint32_t axis) const {
  return rt_->extent(array, axis);
}
Result<DType> Session::dtype(NdArrayHandle array) const { return rt_->dtype(array); }

Result<std::string> Session::name(NdArrayHandle array) const { return rt_->name(array); }

bool Session::capture_needs_barrier(KernelHandle kernel, std::span<const Arg> args) {
  capture_accesses_.clear();
  bool known = true;
  auto it = capture_access_.find(kernel.id);
  if (it == capture_access_.end()) {
    known = false;  // a kernel this session did not compile: it may touch anything
  } else {
    if (it->second.adstack) {
      capture_accesses_.push_back(
          {ScheduleAccess::kAdstackHeaps, kind_bit(codegen::ArrayAccess::Kind::kOverwrite)});
    }
    for (const auto& [param, kinds] : it->second.params) {
      if (param >= args.size() || args[param].kind != abi::ParamKind::kNdArray) {
        known = false;  // the runtime refuses it; nothing is judged on it
        break;
      }
      capture_accesses_.push_back({args[param].array.id, kinds});
    }
  }
  return capture_barriers_.next(capture_accesses_, known);
}

Status Session::launch(KernelHandle kernel, std::span<const Arg> args, LaunchId* id) {
  if (capture_ && !rt_->capturing()) capture_.reset();  // ended through runtime()
  // Graph scheduling's part at capture: no barrier where nothing since the last one conflicts
  // (the runtime omits only between two launches; a refused launch drops the request, and what
  // it noted here only makes later barriers likelier).
  if (capture_ && schedule_graph_launches_ && !capture_needs_barrier(kernel, args)) {
    VKAD_TRY(rt_->omit_next_barrier());
  }
  VKAD_TRY(rt_->launch(kernel, args, id));
  if (capture_) capture_->add(true, kernel, args, 0.0);
  return {};
}
Status Session::prepare(KernelHandle kernel, std::span<const Arg> args) {
  return rt_->prepare(kernel, args);
}
Status Session::flush() {
  Result<rhi::StreamSemaphore> r = rt_->flush();
  return r.ok() ? Status{} : r.status();
}
Status Session::synchronize() { return rt_->synchronize(); }
Status Session::release_idle_memory() { return rt_->release_idle_memory(); }
void Session::set_print_sink(std::function<void(std::string_view)> sink) {
  rt_->set_print_sink(std::move(sink));
}
Status Session::begin_timeline(uint64_t max_events, uint32_t replay_sample) {
  return rt_->begin_timeline(max_events, replay_sample);
}
Result<Timeline> Session::end_timeline() { return rt_->end_timeline(); }
Status Session::begin_capture(const std::string& name, CaptureOptions options) {
  VKAD_TRY(rt_->begin_capture(name, options.run));
  capture_.emplace();
  capture_fixed_.clear();
  capture_barriers_.clear();
  capture_name_ = name;
  capture_background_ = options.background_rework;
  return {};
}
Result<GraphHandle> Session::end_capture() {
  LaunchRanges fixed = std::exchange(capture_fixed_, {});
  Result<GraphHandle> g = end_capture_log();
  if (g.ok() && !fixed.empty()) fixed_launches_[g->id] = std::move(fixed);
  return g;
}
Status Session::check_fixed_updates(GraphHandle graph, std::span<const GraphUpdate> updates) const {
  if (updates.empty() || fixed_launches_.empty()) return {};  // a plain replay: no lookup
  auto it = fixed_launches_.find(graph.id);
  if (it == fixed_launches_.end()) return {};
  for (const GraphUpdate& u : updates) {
    for (const auto& [first, end] : it->second) {
      if (u.launch < first || u.launch >= end) continue;
      return make_error(ErrorCode::kInvalidArgument,
                        "replay: update of launch " + std::to_string(u.launch) +
                            ", made by a launch_loop that runs as one resident kernel or as its "
                            "reworked launches: its scalars are fixed (replace them through an "
                            "array, or capture the loop's launches one by one)");
    }
  }
  return {};
}
Result<GraphHandle> Session::end_capture_log() {
  VKAD_ASSIGN_OR_RETURN(GraphHandle g, rt_->end_capture());
  if (!capture_) return g;  // the capture was begun through runtime(): nothing to fuse
  CaptureLog log = std::move(*capture_);
  capture_.reset();
  if (!fuse_graph_launches_ && !schedule_graph_launches_) return g;
  // Steps recorded through runtime() while Session captured are not in the log: the graph is
  // then kept as the runtime captured it.
  Result<size_t> n_steps = rt_->graph_steps(g);
  if (!n_steps.ok() || *n_steps != log.steps.size()) return g;
  settle_rework();  // one rework at a time: the previous one is installed first
  snapshot_extents(log);
  if (capture_background_) {
    auto bg = std::make_unique<BackgroundRework>();
    bg->graph = g;
    bg->log = std::move(log);
    BackgroundRework* b = bg.get();
    // The worker reads the session's kernel tables and caches, which are left alone until
    // join_rework, and writes only its result slot and `done`.
    auto work = [this, b, name = capture_name_]() {
      try {
        b->result = prepare_rework(b->graph, b->log.unpack(), name);
      } catch (...) {  // out of memory: the graph stays as captured
        b->result = std::make_unique<PreparedRework>();
        b->result->graph = b->graph;
        b->result->kernels = std::move(unregistered_);
        unregistered_.clear();
      }
      b->done.store(true, std::memory_order_release);
    };
    try {
      bg->worker = std::thread(work);
      background_ = std::move(bg);
      return g;
    } catch (const std::system_error&) {
      log = std::move(bg->log);  // no thread to be had: the rework runs here
    }
  }
  std::unique_ptr<PreparedRework> p = prepare_rework(g, log.unpack(), capture_name_);
  return install_rework(*p, /*keep_captured=*/false);
}
void Session::keep_latest(std::span<const GraphUpdate> updates, std::vector<GraphUpdate>* kept) {
  for (const GraphUpdate& u : updates) {
    auto same = [&](const GraphUpdate& a) { return a.launch == u.launch && a.param == u.param; };
    auto at = std::find_if(kept->begin(), kept->end(), same);
    if (at == kept->end()) {
      kept->push_back(u);
    } else {
      *at = u;
    }
  }
}
Status Session::finish_rework(GraphHandle graph) {
  if (!background_ || background_->graph.id != graph.id) return {};
  if (rt_->capturing()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "finish_rework: a capture is open; end it first (the rework records the "
                      "reworked graph)");
  }
  settle_rework();
  return {};
}
Status Session::replay(GraphHandle graph, std::span<const GraphUpdate> updates, LaunchId* first) {
  VKAD_TRY(check_fixed_updates(graph, updates));
  if (background_ && background_->graph.id == graph.id) {
    if (background_->done.load(std::memory_order_acquire) && !rt_->capturing()) {
      settle_rework();
    } else {
      // The launches as captured until the rework is done; the updates carry over to it.
      VKAD_TRY(rt_->replay(graph, updates, first));
      keep_latest(updates, &background_->updates);
      return {};
    }
  }
  if (auto rw = reworked_.find(graph.id); rw != reworked_.end()) graph = rw->second;
  auto it = fused_graphs_.find(graph.id);
  std::vector<GraphUpdate> carried;  // a background rework's updates from before its install
  if (it != fused_graphs_.end() && !it->second.carried.empty()) {
    carried = it->second.carried;
    carried.insert(carried.end(), updates.begin(), updates.end());
    updates = carried;
  }
  Status st = replay_reworked(graph, updates, first);
  if (st.ok() && it != fused_graphs_.end()) it->second.carried.clear();
  return st;
}
Status Session::replay_reworked(GraphHandle graph, std::span<const GraphUpdate> updates,
                                LaunchId* first) {
  auto it = fused_graphs_.find(graph.id);
  if (it == fused_graphs_.end() || updates.empty()) {
    if (it != fused_graphs_.end() && it->second.on_original) {
      return rt_->replay(it->second.original, updates, first);
    }
    return rt_->replay(graph, updates, first);
  }
  FusedGraph& f = it->second;
  if (f.original.id != 0) {
    bool pinned = f.on_original;
    for (const GraphUpdate& u : updates) {
      pinned = pinned || (u.launch < f.pinned.size() && u.param < f.pinned[u.launch].size() &&
                          f.pinned[u.launch][u.param]);
    }
    if (pinned) {
      // The schedule's premise may not hold for the new values: the launches as captured,
      // with every update so far, from now on.
      std::vector<GraphUpdate> all = f.on_original ? std::vector<GraphUpdate>{} : f.applied;
      all.insert(all.end(), updates.begin(), updates.end());
      VKAD_TRY(rt_->replay(f.original, all, first));
      f.on_original = true;
      f.applied.clear();
      return {};
    }
  }
  std::vector<GraphUpdate> mapped;
  VKAD_TRY(translate(f, updates, &mapped));
  Status st = rt_->replay(graph, mapped, first);
  if (st.ok()) {
    // The latest value per launch and parameter: what the graph as captured would need.
    if (f.original.id != 0) keep_latest(updates, &f.applied);
    return st;
  }
  // The runtime checks the values (dtype, range) in the fused graph's numbering: say which
  // captured launch and parameter each fused one stands for.
  std::string map;
  for (size_t i = 0; i < updates.size(); ++i) {
    map += (map.empty() ? "" : "; ") + std::string("captured launch ") +
           std::to_string(updates[i].launch) + " parameter " + std::to_string(updates[i].param) +
           " is launch " + std::to_string(mapped[i].launch) + " parameter " +
           std::to_string(mapped[i].param) + " of the fused graph";
  }
  return make_error(st.code(),
                    st.message() + " (launches scheduled and fused at end_capture: " + map + ")");
}
Status Session::release_graph(GraphHandle graph) {
  if (background_ && background_->graph.id == graph.id) {
    // Its rework is dropped; the kernels it compiled are registered (the caches name them).
    join_rework();
    if (background_->result != nullptr) (void)register_rework_kernels(*background_->result);
    background_.reset();
  }
  VKAD_TRY(rt_->release_graph(graph));
  auto forget = [&](uint64_t id) {  // a reworked graph's map, and the stashes it owns
    auto f = fused_graphs_.find(id);
    if (f == fused_graphs_.end()) return;
    for (NdArrayHandle a : f->second.owned) (void)free(a);
    fused_graphs_.erase(f);
  };
  if (auto rw = reworked_.find(graph.id); rw != reworked_.end()) {
    // The reworked graph installed for it: its graph as captured is the one just released.
    (void)rt_->release_graph(rw->second);
    forget(rw->second.id);
    reworked_.erase(rw);
  }
  auto it = fused_graphs_.find(graph.id);
  if (it != fused_graphs_.end() && it->second.original.id != 0) {
    (void)rt_->release_graph(it->second.original);
  }
  forget(graph.id);
  fixed_launches_.erase(graph.id);
  return {};
}
Result<std::vector<std::string>> Session::graph_launch_names(GraphHandle graph) const {
  VKAD_ASSIGN_OR_RETURN(std::vector<std::string> names, rt_->graph_launch_kernels(graph));
  // A reworked graph's own launches are fused and reordered: updates (and so names) keep the
  // captured numbering, which its FusedGraph records.
  GraphHandle g = graph;
  if (auto rw = reworked_.find(graph.id); rw != reworked_.end()) g = rw->second;
  if (auto it = fused_graphs_.find(g.id); it != fused_graphs_.end()) names = it->second.kernel;
  std::unordered_map<std::string, uint32_t> seen;
  for (std::string& n : names) {
    const uint32_t k = seen[n]++;
    if (k > 0) n += "#" + std::to_string(k);
  }
  return names;
}
Result<uint32_t> Session::graph_launch(GraphHandle graph, std::string_view name) const {
  VKAD_ASSIGN_OR_RETURN(const std::vector<std::string> names, graph_launch_names(graph));
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<uint32_t>(i);
  }
  std::string some;
  for (size_t i = 0; i < names.size() && i < 8; ++i) some += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > 8) some += ", ...";
  return make_error(ErrorCode::kNotFound,
                    "graph_launch: the graph has no launch named '" + std::string(name) +
                        "' (its " + std::to_string(names.size()) + " launches: " + some + ")");
}
Result<SessionStats> Session::stats() const {
  VKAD_ASSIGN_OR_RETURN(const runtime::RuntimeStats r, rt_->stats());
  SessionStats s;
  s.launches = r.launches;
  s.dispatches = r.dispatches;
  s.flushes = r.flushes;
  s.forced_waits = r.retirement.forced_waits;
  s.forced_wait_ms = r.retirement.forced_wait_us / 1e3;
  s.ndarrays = r.ndarrays;
  s.kernels_cached = r.pipelines_cached;
  s.memory_block_bytes = r.memory_block_bytes;
  s.memory_used_bytes = r.memory_used_bytes;
  s.adstack_heap_bytes = r.adstack_heap_bytes;
  s.vulkan_objects_created = r.live.created;
  s.kernels_compiled = compile_cache_.misses();
  s.compile_cache_hits = compile_cache_.hits();
  const codegen::CompileCache::DiskCounters disk = compile_cache_.disk();
  s.disk_cache_hits = disk.hits;
  s.disk_cache_misses = disk.misses;
  s.disk_cache_rebuilt = disk.rebuilt;
  s.pipeline_cache_loaded = r.pipeline_cache_loaded;
  s.pipelines_created = r.pipelines_created;
  s.pipeline_create_ms = r.pipeline_create_ms;
  s.rolled_launches = rolled_launches_;
  s.blocked_launches = blocked_launches_;
  s.rolled_loops = rolled_loops_;
  s.reworked_loops = reworked_loops_;
  s.recomputed_launches = recomputed_launches_;
  s.user_bytes = r.user_bytes;
  s.args_ring_bytes = r.args_ring_bytes;
  s.readback_ring_bytes = r.readback_ring_bytes;
  s.spare_block_bytes = r.spare_block_bytes;
  s.ndarray_pool_bytes = r.ndarray_pool_bytes;
  s.runtime_bytes = r.args_ring_bytes + r.readback_ring_bytes + r.adstack_heap_bytes +
                    r.spare_block_bytes + r.ndarray_pool_bytes;
  s.live_buffers = r.live.buffers < 0 ? 0 : static_cast<uint64_t>(r.live.buffers);
  return s;
}

}  // namespace vkad
