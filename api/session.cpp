#include "api/session.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "api/compiled_graphs.h"
#include "api/device_target.h"
#include "api/graph_compiler.h"
#include "api/session_core.h"
#include "api/step_loops.h"
#include "autodiff/in_place.h"
#include "autodiff/reverse_mode.h"
#include "graph/graph_passes.h"
#include "graph/launch_fusion.h"
#include "ir/text.h"
#include "rhi/device.h"
#include "runtime/counted_launch.h"
#include "runtime/graphs.h"
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

Result<KernelHandle> SessionCore::register_ir(const codegen::Kernel& kernel,
                                              const runtime::CompiledKernel& ck,
                                              bool generic_on_demand) {
  Result<KernelHandle> h = rt->register_kernel(ck, generic_on_demand);
  if (!h.ok()) {
    // A module read from the disk cache that validates but does not match its description
    // (an edited file): compiled again once, its file rewritten (CompileCache::rebuild).
    VKAD_ASSIGN_OR_RETURN(std::shared_ptr<const runtime::CompiledKernel> fresh,
                          compile_cache.rebuild(kernel, ck));
    if (!fresh) return h.status();
    return register_ir(kernel, *fresh, generic_on_demand);
  }
  catalog.add(h->id, kernel, ck.has_adstacks());
  note_capture_access(h->id, ck.has_adstacks());
  return *h;
}

void SessionCore::note_capture_access(uint64_t id, bool adstack) {
  const std::shared_ptr<const codegen::KernelAccess>& access = catalog.access(id);
  if (!access) return;  // unknown: a capture fences it
  CaptureAccess& ca = capture_access[id];
  ca = CaptureAccess{};
  ca.adstack = adstack;
  for (const codegen::ParamAccess& p : access->params) {
    uint8_t kinds = 0;
    for (const codegen::ArrayAccess& a : p.accesses) kinds |= kind_bit(a.kind);
    ca.params.emplace_back(p.param, kinds);
  }
}

void SessionCore::drop_tables(uint64_t id) {
  catalog.drop(id);
  capture_access.erase(id);
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

namespace {

// SessionOptions::graph_passes with the switches' and the environment's edits: the text the
// session's pipeline is parsed from (docs/graphs.md, "Graph passes"). The variables are what a
// suspected problem is checked against and how a benchmark tries another setting without
// rebuilding: VKAD_GRAPH_PASSES=<text> replaces the text, VKAD_GRAPH_FUSION / _SCHEDULE /
// _RECOMPUTE / _BLOCK / _RENAME / _PRUNE=0 remove a pass, VKAD_GRAPH_RESIDENT=<n> sets roll's
// largest range (0 removes it), VKAD_GRAPH_BLOCK_SHARED=<bytes> and VKAD_GRAPH_BLOCK_MIN_TILES=<n>
// block's options.
Result<GraphPipeline> graph_pipeline(const SessionOptions& options) {
  auto env = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  std::string text = options.graph_passes.empty() ? kDefaultGraphPipeline : options.graph_passes;
  if (text == "none") text.clear();
  if (std::optional<std::string> passes = env("VKAD_GRAPH_PASSES"))
    text = *passes == "none" ? std::string() : *passes;
  VKAD_ASSIGN_OR_RETURN(auto specs, codegen::split_pipeline(text.empty() ? "x" : text));
  if (text.empty()) specs.clear();
  auto drop = [&](const char* pass, bool off) {
    if (!off) return;
    std::erase_if(specs, [&](const auto& spec) { return spec.first == pass; });
  };
  auto set = [&](const char* pass, const char* key, const std::string& value) {
    for (auto& [name, opts] : specs) {
      if (name == pass) opts[key] = value;
    }
  };
  auto zero = [&](const char* name) {
    std::optional<std::string> v = env(name);
    return v && *v == "0";
  };
  drop("fuse", !options.fuse_graph_launches || zero("VKAD_GRAPH_FUSION"));
  drop("schedule", !options.schedule_graph_launches || zero("VKAD_GRAPH_SCHEDULE"));
  drop("recompute", zero("VKAD_GRAPH_RECOMPUTE"));
  drop("rename", zero("VKAD_GRAPH_RENAME"));
  drop("prune", zero("VKAD_GRAPH_PRUNE"));
  drop("slice", zero("VKAD_GRAPH_SLICE"));
  drop("hoist", zero("VKAD_GRAPH_HOIST"));
  drop("block", !options.block_stencils || zero("VKAD_GRAPH_BLOCK"));
  uint32_t range = options.resident_max_range;
  if (std::optional<std::string> v = env("VKAD_GRAPH_RESIDENT")) {
    // strtoull saturates; clamped rather than truncated to 32 bits ("4294967296" is not 0).
    range = static_cast<uint32_t>(
        std::min<unsigned long long>(std::strtoull(v->c_str(), nullptr, 10), UINT32_MAX));
  }
  drop("roll", range == 0);
  if (range != 256) set("roll", "max-range", std::to_string(std::min<uint32_t>(range, 999999999)));
  if (std::optional<std::string> v = env("VKAD_GRAPH_BLOCK_SHARED")) set("block", "shared", *v);
  if (std::optional<std::string> v = env("VKAD_GRAPH_BLOCK_MIN_TILES"))
    set("block", "min-tiles", *v);
  std::string edited;
  for (const auto& [name, opts] : specs) {
    edited += (edited.empty() ? "" : ", ") + name;
    std::string o;
    for (const auto& [key, value] : opts) o += (o.empty() ? "" : ", ") + key + "=" + value;
    if (!o.empty()) edited += "{" + o + "}";
  }
  return GraphPassRegistry::standard().parse(edited);
}

// Whether environment variable `name` is set to exactly `value`.
bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == value;
}

}  // namespace

Result<std::unique_ptr<Session>> Session::create_with_runtime(
    const runtime::RuntimeOptions& runtime, const SessionOptions& options) {
  VKAD_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Runtime> rt, runtime::Runtime::create(runtime));
  std::unique_ptr<Session> s(new Session());
  s->core_->compile_options = options.compile;
  // Overrides for every session, what a suspected problem is checked against and how a
  // measurement takes its baseline without editing the program: VKAD_SPECIALIZE_SHAPES=0 turns
  // shape specialization off, VKAD_CHECK_FINITE=1 the NaN / infinity checks on (a program's debug
  // run).
  codegen::CompileOptions& compile_options = s->core_->compile_options;
  if (env_is("VKAD_SPECIALIZE_SHAPES", "0")) compile_options.specialize_shapes = false;
  if (env_is("VKAD_CHECK_FINITE", "1")) compile_options.check_finite = true;
  VKAD_ASSIGN_OR_RETURN(s->core_->pipeline, graph_pipeline(options));
  const GraphPipeline& pipeline = s->core_->pipeline;
  s->core_->graph =
      GraphSwitches{pipeline.has("fuse"), pipeline.has("schedule"), roll_max_range(pipeline)};
  s->core_->target = codegen::target_from_caps(rt->caps());
  // Runs of atomic adds (spirv_emitter.cpp, combine_runs) pay from a launch size measured on an
  // H200; VKAD_COMBINE_RUNS=0 compiles without them (another GPU's users, and A/B runs).
  if (env_is("VKAD_COMBINE_RUNS", "0")) s->core_->target.subgroup_shuffle = false;
  s->core_->adjoint_options = codegen::adjoint_options_from_caps(rt->caps());
  s->core_->device_uuid = rhi::format_uuid(rt->caps().device_uuid);
  s->core_->compile_cache.set_disk_dir(rt->cache_dir());
  s->core_->rt = std::move(rt);
  return s;
}

template <typename Facet>
Session& SessionFacet<Facet>::self() {
  return static_cast<Session&>(static_cast<Facet&>(*this));
}
template <typename Facet>
const Session& SessionFacet<Facet>::self() const {
  return static_cast<const Session&>(static_cast<const Facet&>(*this));
}
template <typename Facet>
SessionCore& SessionFacet<Facet>::core() const {
  return *self().core_;
}
template class SessionFacet<SessionArrays>;
template class SessionFacet<SessionGraphs>;

Session::Session()
    : core_(std::make_unique<SessionCore>()),
      compiler_(std::make_unique<GraphCompiler>(*core_)),
      graphs_(std::make_unique<CompiledGraphs>(*core_, *compiler_)),
      loops_(std::make_unique<StepLoops>(*this, *core_, *compiler_, *graphs_)) {}

Session::~Session() {
  // The background worker reads this session's tables, prepare_loop's its compile cache: they
  // end before those go.
  graphs_->join();
  loops_->join_jobs();
}

const codegen::Target& Session::target() const { return core_->target; }
const std::string& Session::device_name() const { return core_->target.device_name; }
const std::string& Session::device_uuid() const { return core_->device_uuid; }
runtime::Runtime& Session::runtime() { return *core_->rt; }

Result<KernelHandle> Session::compile(const codegen::Kernel& kernel) {
  graphs_->join();  // register_ir writes the tables a background rework reads
  VKAD_ASSIGN_OR_RETURN(
      std::shared_ptr<const runtime::CompiledKernel> ck,
      core_->compile_cache.compile(kernel, core_->target, core_->compile_options));
  return core_->register_ir(kernel, *ck);
}

Result<KernelHandle> Session::compile(std::string_view ir_text) {
  VKAD_ASSIGN_OR_RETURN(codegen::Kernel k, codegen::parse(std::string(ir_text)));
  return compile(k);
}

namespace {

// What a tape's hazard check (api/tape_hazards.h) takes an in-place update's launch to do: its
// adjoint reads the copies, not the arrays (their reads go), and its stores to them leave no
// seed behind (AdjointOptions::clear_seeds_of), so overwriting what an earlier launch wrote,
// differentiated, spoils nothing: they count as accumulations, which the check still holds
// against earlier reads.
std::shared_ptr<const codegen::KernelAccess> in_place_hazards(const codegen::KernelAccess& access,
                                                              const codegen::InPlaceSplit& split) {
  auto out = std::make_shared<codegen::KernelAccess>(access);
  for (codegen::ParamAccess& pa : out->params) {
    const bool split_here =
        std::any_of(split.arrays.begin(), split.arrays.end(),
                    [&](const codegen::InPlaceParam& a) { return a.param == pa.param; });
    if (!split_here) continue;
    std::erase_if(pa.accesses, [](const codegen::ArrayAccess& x) {
      return x.kind == codegen::ArrayAccess::Kind::kRead;
    });
    for (codegen::ArrayAccess& x : pa.accesses) {
      if (x.kind == codegen::ArrayAccess::Kind::kOverwrite) {
        x.kind = codegen::ArrayAccess::Kind::kAccumulate;
      }
    }
  }
  return out;
}

}  // namespace

Result<Differentiated> Session::differentiate(const codegen::Kernel& forward) {
  graphs_->join();
  bool any = false;
  for (const codegen::Param& p : forward.params) any = any || p.needs_grad;
  if (!any) {
    return make_error(ErrorCode::kInvalidArgument,
                      "differentiate '" + forward.name +
                          "': no parameter is marked grad, so there is no gradient to compute");
  }
  codegen::InPlaceSplit split;
  Result<codegen::CountedAdjoint> made = adjoint_of(forward, /*clear_seeds=*/false);
  if (!made.ok()) {
    // An array updated in place (taichi#2505's x = cos(theta) x): the adjoint of the kernel
    // that reads a copy taken before the launch, which a tape keeps (autodiff/in_place.h).
    split = codegen::split_in_place(forward);
    if (split.arrays.empty()) return made.status();
    codegen::AdjointOptions o = core_->adjoint_options;
    for (const codegen::InPlaceParam& a : split.arrays) o.clear_seeds_of.push_back(a.param);
    Result<codegen::Kernel> adj = codegen::make_adjoint(split.kernel, core_->target, o);
    if (!adj.ok()) return made.status();  // refused for another reason: say the first
    VKAD_TRY(codegen::merge_copy_gradients(split, &*adj));
    made = codegen::CountedAdjoint{};
    made->adjoint = std::move(*adj);
  }
  codegen::CountedAdjoint& ca = *made;
  const codegen::Kernel& adjoint = ca.adjoint;
  VKAD_ASSIGN_OR_RETURN(
      std::shared_ptr<const runtime::CompiledKernel> fck,
      core_->compile_cache.compile(forward, core_->target, core_->compile_options));
  VKAD_ASSIGN_OR_RETURN(
      std::shared_ptr<const runtime::CompiledKernel> ack,
      core_->compile_cache.compile(adjoint, core_->target, core_->compile_options));
  Differentiated d;
  d.forward_params = static_cast<uint32_t>(forward.params.size());
  d.counted = ca.counted;
  // make_adjoint's contract (reverse_mode.h): the forward's parameters, then one gradient per
  // parameter marked grad, in parameter order (an in-place split's copies after the former;
  // their gradients are the arrays': merge_copy_gradients).
  uint32_t next = static_cast<uint32_t>(split.arrays.empty() ? forward.params.size()
                                                             : split.kernel.params.size());
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
  VKAD_ASSIGN_OR_RETURN(d.forward, core_->register_ir(forward, *fck));
  forward_ir_[d.forward.id] = std::make_shared<const codegen::Kernel>(forward);
  Result<KernelHandle> a = core_->register_ir(adjoint, *ack);
  if (!a.ok()) {
    (void)release(d.forward);  // a failed call changes nothing
    return a.status();
  }
  d.adjoint = *a;
  if (ca.counted) {
    const Status st = register_counter(d.adjoint, forward, ca, next);
    if (!st.ok()) {
      (void)release(d.adjoint);
      (void)release(d.forward);
      return st;
    }
  }
  if (!split.arrays.empty()) {
    for (const codegen::InPlaceParam& a : split.arrays) d.in_place.push_back(a.param);
    in_place_[d.adjoint.id] = {split.arrays, d.forward_params,
                               static_cast<uint32_t>(d.gradients.size()), forward.name,
                               in_place_hazards(*core_->catalog.access(d.forward.id), split)};
  }
  access_[d.forward.id] = core_->catalog.access(d.forward.id);  // register_ir computed it
  adjoint_reads_[d.adjoint.id] = codegen::used_loads(adjoint);
  whole_stores_[d.forward.id] = codegen::whole_stores(forward);
  return d;
}

Result<codegen::CountedAdjoint> Session::adjoint_of(const codegen::Kernel& forward,
                                                    bool clear_seeds) const {
  Result<codegen::Kernel> plain =
      clear_seeds ? codegen::make_clearing_adjoint(forward, core_->target, core_->adjoint_options)
                  : codegen::make_adjoint(forward, core_->target, core_->adjoint_options);
  if (plain.ok()) {
    codegen::CountedAdjoint out;
    out.adjoint = std::move(*plain);
    return out;
  }
  // Refused for want of a trip bound: the counted adjoint, whose stacks launch() sizes from
  // counts made on the device. Any other refusal is make_adjoint's, as it said it.
  Result<codegen::CountedAdjoint> counted =
      codegen::make_adjoint_counted(forward, core_->target, core_->adjoint_options, clear_seeds);
  if (!counted.ok() || counted->counted == 0) return plain.status();
  return counted;
}

Status Session::register_counter(KernelHandle adjoint, const codegen::Kernel& forward,
                                 const codegen::CountedAdjoint& ca, uint32_t args) {
  VKAD_ASSIGN_OR_RETURN(
      std::shared_ptr<const runtime::CompiledKernel> ck,
      core_->compile_cache.compile(ca.counter, core_->target, core_->compile_options));
  VKAD_ASSIGN_OR_RETURN(KernelHandle counter, core_->register_ir(ca.counter, *ck));
  counted_[adjoint.id] = {counter, ca.counted, static_cast<uint32_t>(forward.params.size()), args,
                          forward.name};
  return {};
}

std::shared_ptr<const codegen::KernelAccess> Session::in_place_access(KernelHandle adjoint) const {
  auto it = in_place_.find(adjoint.id);
  return it == in_place_.end() ? nullptr : it->second.access;
}

const std::vector<codegen::InPlaceParam>* Session::in_place(KernelHandle adjoint) const {
  auto it = in_place_.find(adjoint.id);
  return it == in_place_.end() ? nullptr : &it->second.arrays;
}

uint32_t Session::counted_loops(KernelHandle adjoint) const {
  auto it = counted_.find(adjoint.id);
  return it == counted_.end() ? 0 : it->second.counted;
}

Status Session::launch_counted(KernelHandle adjoint, const CountedLaunch& c,
                               std::span<const Arg> args, LaunchId* id) {
  core_->drop_stale_capture();
  if (core_->capture) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "launch: the adjoint of '" + c.name + "' counts the trips of " +
                          std::to_string(c.counted) +
                          " loop(s) without a trip bound on the device before it runs, and waits "
                          "for the counts, which a graph cannot replay; state max_trip on the "
                          "loop (a while loop's bound, or a for loop's) to capture it");
  }
  return runtime::launch_counted(*core_->rt, c.counter, adjoint, c.counted, c.forward_params, args,
                                 id);
}

Result<Differentiated> Session::differentiate(std::string_view ir_text) {
  VKAD_ASSIGN_OR_RETURN(codegen::Kernel k, codegen::parse(std::string(ir_text)));
  return differentiate(k);
}

void Session::drop_counter(uint64_t adjoint) {
  auto it = counted_.find(adjoint);
  if (it == counted_.end()) return;
  (void)core_->rt->unregister_kernel(it->second.counter);
  core_->drop_tables(it->second.counter.id);
  counted_.erase(it);
}

Status Session::release(KernelHandle kernel) {
  graphs_->join();
  VKAD_TRY(core_->rt->unregister_kernel(kernel));
  core_->drop_tables(kernel.id);
  drop_counter(kernel.id);
  in_place_.erase(kernel.id);
  forward_ir_.erase(kernel.id);
  auto c = clearing_.find(kernel.id);
  if (c != clearing_.end()) {
    adjoint_reads_.erase(c->second.id);
    (void)core_->rt->unregister_kernel(c->second);
    core_->drop_tables(c->second.id);
    drop_counter(c->second.id);
    clearing_.erase(c);
  }
  access_.erase(kernel.id);
  adjoint_reads_.erase(kernel.id);
  whole_stores_.erase(kernel.id);
  return {};
}

std::shared_ptr<const codegen::KernelAccess> Session::launch_access(KernelHandle forward) const {
  auto it = access_.find(forward.id);
  return it == access_.end() ? nullptr : it->second;
}

const std::vector<codegen::WholeStore>* Session::whole_stores(KernelHandle forward) const {
  auto it = whole_stores_.find(forward.id);
  return it == whole_stores_.end() ? nullptr : &it->second;
}

const std::vector<uint32_t>* Session::adjoint_reads(KernelHandle adjoint) const {
  auto it = adjoint_reads_.find(adjoint.id);
  return it == adjoint_reads_.end() ? nullptr : &it->second;
}

Result<const Differentiated*> Session::differentiated_copy(DType dtype, uint32_t rank) {
  if (dtype != DType::kF32 && dtype != DType::kF64) {
    return make_error(ErrorCode::kInvalidArgument, std::string("differentiated_copy: ") +
                                                       runtime::dtype_name(dtype) +
                                                       " arrays have no gradient (f32 and f64 do)");
  }
  const uint64_t key = static_cast<uint64_t>(dtype) << 32 | rank;
  auto it = copy_differentiated_.find(key);
  if (it != copy_differentiated_.end()) return &it->second;
  // The copy kernel's text (ir/text.h) with both arrays marked grad, under a name of its own.
  const std::string t = runtime::dtype_name(dtype), r = std::to_string(rank);
  const std::string array = "ndarray<" + t + ", " + r + ">";
  std::string text = codegen::copy_kernel_text(t, rank);
  const std::string plain = "src: " + array + ", dst: " + array;
  const size_t at = text.find(plain);
  const size_t name = text.find("vkad_copy_");
  if (at == std::string::npos || name == std::string::npos) {
    return make_error(ErrorCode::kInternal, "differentiated_copy: the copy kernel's text changed");
  }
  text.replace(at, plain.size(), "src: " + array + " grad, dst: " + array + " grad");
  text.replace(name, std::string("vkad_copy_").size(), "vkad_tape_copy_");
  VKAD_ASSIGN_OR_RETURN(Differentiated d, differentiate(std::string_view(text)));
  return &copy_differentiated_.emplace(key, std::move(d)).first->second;
}

Result<KernelHandle> Session::clearing_adjoint(const Differentiated& d) {
  graphs_->join();
  auto done = clearing_.find(d.forward.id);
  if (done != clearing_.end()) return done->second;
  auto f = forward_ir_.find(d.forward.id);
  if (f == forward_ir_.end()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "clearing_adjoint: kernel " + runtime::handle_string(d.forward.id) +
                          " is not a live differentiate() result of this session");
  }
  VKAD_ASSIGN_OR_RETURN(codegen::CountedAdjoint ca, adjoint_of(*f->second, /*clear_seeds=*/true));
  const codegen::Kernel& adjoint = ca.adjoint;
  VKAD_ASSIGN_OR_RETURN(
      std::shared_ptr<const runtime::CompiledKernel> ck,
      core_->compile_cache.compile(adjoint, core_->target, core_->compile_options));
  // Through register_ir: a checkpointed tape's captured backward is scheduled and fused like
  // any other launches (a kernel without its IR would be a fence there).
  VKAD_ASSIGN_OR_RETURN(KernelHandle h, core_->register_ir(adjoint, *ck));
  if (ca.counted) {
    const Status st = register_counter(h, *f->second, ca,
                                       static_cast<uint32_t>(adjoint.params.size()) - ca.counted);
    if (!st.ok()) {
      (void)core_->rt->unregister_kernel(h);
      core_->drop_tables(h.id);
      return st;
    }
  }
  clearing_.emplace(d.forward.id, h);
  adjoint_reads_[h.id] = codegen::used_loads(adjoint);
  return h;
}

bool Session::capture_needs_barrier(KernelHandle kernel, std::span<const Arg> args) {
  core_->capture_accesses.clear();
  bool known = true;
  auto it = core_->capture_access.find(kernel.id);
  if (it == core_->capture_access.end()) {
    known = false;  // a kernel this session did not compile: it may touch anything
  } else {
    if (it->second.adstack) {
      core_->capture_accesses.push_back(
          {ScheduleAccess::kAdstackHeaps, kind_bit(codegen::ArrayAccess::Kind::kOverwrite)});
    }
    for (const auto& [param, kinds] : it->second.params) {
      if (param >= args.size() || args[param].kind != abi::ParamKind::kNdArray) {
        known = false;  // the runtime refuses it; nothing is judged on it
        break;
      }
      core_->capture_accesses.push_back({args[param].array.id, kinds});
    }
  }
  return core_->capture_barriers.next(core_->capture_accesses, known);
}

Status Session::launch(KernelHandle kernel, std::span<const Arg> args, LaunchId* id) {
  if (!counted_.empty()) {  // most sessions have none: no lookup on their launch path
    auto c = counted_.find(kernel.id);
    // With its trips_ scalars given, a counted adjoint is launched as the caller sized it.
    if (c != counted_.end() && args.size() == c->second.args) {
      return launch_counted(kernel, c->second, args, id);
    }
  }
  if (!in_place_.empty()) {
    auto c = in_place_.find(kernel.id);
    if (c != in_place_.end() && args.size() == c->second.forward_params + c->second.grads) {
      return make_error(ErrorCode::kInvalidArgument,
                        "launch: the adjoint of '" + c->second.name +
                            "' differentiates an array it updates in place: it reads that array "
                            "as it was before the forward launch, after the forward's arguments, "
                            "which a Tape keeps for each launch it records; record the forward "
                            "on a Tape, or write the result into another array");
    }
  }
  core_->drop_stale_capture();
  // Graph scheduling's part at capture: no barrier where nothing since the last one conflicts
  // (the runtime omits only between two launches; a refused launch drops the request, and what
  // it noted here only makes later barriers likelier).
  if (core_->capture && core_->graph.schedule && !capture_needs_barrier(kernel, args)) {
    VKAD_TRY(core_->rt->graphs().omit_next_barrier());
  }
  VKAD_TRY(core_->rt->launch(kernel, args, id));
  if (core_->capture) {
    ++core_->capture->steps;
    ++core_->capture->launches;
  }
  return {};
}
Status Session::prepare(KernelHandle kernel, std::span<const Arg> args) {
  return core_->rt->prepare(kernel, args);
}
Status Session::flush() {
  Result<rhi::StreamSemaphore> r = core_->rt->flush();
  return r.ok() ? Status{} : r.status();
}
Status Session::synchronize() { return core_->rt->synchronize(); }
Status Session::release_idle_memory() { return core_->rt->release_idle_memory(); }
Status Session::reset_memory_peaks() { return core_->rt->reset_memory_peaks(); }
void Session::set_print_sink(std::function<void(std::string_view)> sink) {
  core_->rt->set_print_sink(std::move(sink));
}
Status Session::begin_timeline(uint64_t max_events, uint32_t replay_sample) {
  return core_->rt->begin_timeline(max_events, replay_sample);
}
Result<Timeline> Session::end_timeline() { return core_->rt->end_timeline(); }

Result<SessionStats> Session::stats() const {
  VKAD_ASSIGN_OR_RETURN(const runtime::RuntimeStats r, core_->rt->stats());
  SessionStats s;
  s.launches = r.launches;
  s.dispatches = r.dispatches;
  s.barriers = r.barriers;
  s.flushes = r.flushes;
  s.forced_waits = r.retirement.forced_waits;
  s.forced_wait_ms = r.retirement.forced_wait_us / 1e3;
  s.ndarrays = r.ndarrays;
  s.kernels_cached = r.pipelines_cached;
  s.memory_block_bytes = r.memory_block_bytes;
  s.memory_used_bytes = r.memory_used_bytes;
  s.memory_peak_block_bytes = r.memory_peak_block_bytes;
  s.memory_peak_used_bytes = r.memory_peak_used_bytes;
  s.adstack_heap_bytes = r.adstack_heap_bytes;
  s.vulkan_objects_created = r.live.created;
  s.kernels_compiled = core_->compile_cache.misses();
  s.compile_cache_hits = core_->compile_cache.hits();
  const codegen::CompileCache::DiskCounters disk = core_->compile_cache.disk();
  s.disk_cache_hits = disk.hits;
  s.disk_cache_misses = disk.misses;
  s.disk_cache_rebuilt = disk.rebuilt;
  s.pipeline_cache_loaded = r.pipeline_cache_loaded;
  s.pipelines_created = r.pipelines_created;
  s.pipeline_create_ms = r.pipeline_create_ms;
  s.rolled_launches = graphs_->rolled_launches();
  s.blocked_launches = graphs_->blocked_launches() + loops_->blocked_launches();
  s.rolled_loops = loops_->rolled_loops();
  s.reworked_loops = loops_->reworked_loops();
  s.recomputed_launches = graphs_->recomputed_launches();
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
