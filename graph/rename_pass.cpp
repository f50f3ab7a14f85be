// The rename and prune passes (graph/graph_passes.h, docs/graphs.md "Arrays refilled every
// step"): arrays a program fills whole again and again get a ring of buffers, and those fills
// become launches; launches whose every write is overwritten before anything reads it go.
//
// DiffTaichi's idiom clears one grid before every step, scatters into it and gathers from it
// (diffmpm_simple, diffmpm_checkpointing; a checkpointed tape's forward and the gradients it
// zeroes in reverse). Each fill is a stretch boundary for scheduling and fusion, and every step
// touches the same buffer, so step f's gather can never run in one dispatch with step f + 1's
// scatter, as it does where the grid has a time axis. But a whole-array fill ends what the
// array held: the accesses between two fills (a lifetime) depend on nothing before the first and
// nothing after the second reads them. So lifetimes may live in different buffers: the last in
// the caller's array (what a replay leaves there is what it would leave), the one before the
// first fill too (it reads what the caller put there), the others in turn in up to two twins
// the graph owns (StashNeed with a shape: made at the install, freed with the graph) and the
// caller's array -- a ring of three, so a lifetime's fill need not wait for the one before it.
// Each fill of a renamed array becomes a launch of a fill kernel (`vkad_fill_<dtype>_<rank>`,
// one per dtype and rank) writing its lifetime's buffer: a launch the schedule places by what it
// touches, so the launches around it are no longer cut apart.
//
// Renamed: arrays of rank >= 2 (a 1-d array's zero fill is what fusion reads as constants and
// leaves out, launch_fusion.h), of f32, i32 or u32, filled at least twice, at most 512 KiB each
// and 8 MiB of twins per program (kMaxRenamedBytes), in programs whose arrays' types are known
// (graphs; step loops' plans keep their fills, api/step_loops.cpp).
#include <algorithm>
#include <optional>
#include <string>
#include <unordered_map>

#include "adstack/size_expr.h"
#include "graph/graph_passes.h"
#include "ir/text.h"
#include "ir/walk.h"

namespace vkad {

namespace {

// A ring of buffers trades the one buffer's cache residency for fusion: on an H200 the 2-D
// diffmpm in a budget (128^2 grids of 64-128 KiB) ran 55 -> 38 ms an iteration renamed, the 3-D
// one (64^3 grids of 1-3 MiB) 146 -> 164 ms, though with fewer dispatches.
constexpr uint64_t kMaxRenamedBytes = uint64_t{512} << 10;
constexpr uint64_t kMaxTwinBytes = uint64_t{8} << 20;
constexpr size_t kRing = 3;  // buffers per renamed array, the caller's included

// A fill kernel's IR: `dst[i...] = value` over every element of an array of `dtype` with these
// extents, an N-d task over the first three axes; the elements of the others are stored one by
// one where they are at most kMaxUnrolled (a grid's vector components: no loop, so lavapipe,
// which keeps kernels with loops out of fusion, fuses it), else walked by serial loops.
constexpr uint64_t kMaxUnrolled = 16;

// The fill kernel of an array whose leading axes have extent 1 (DiffTaichi's one grid kept at
// grid[0, i, j]): an N-d task over the axes after them -- the box of the grid's cell kernels,
// so fusion can merge the fill with a cell kernel of another buffer that the schedule puts
// beside it -- with index 0 on the leading axes and the axes after the task's unrolled;
// nullopt where there are none, or fewer than two task axes after them, or too many elements to
// unroll.
std::optional<std::string> row_fill_kernel_ir(const std::string& t,
                                              const std::vector<uint32_t>& shape) {
  const uint32_t rank = static_cast<uint32_t>(shape.size());
  uint32_t lead = 0;
  while (lead < rank && shape[lead] == 1) ++lead;
  // The task's axes: up to three after the leading ones, not a last axis of at most 4 (a
  // vector's components: cell kernels store them one by one).
  uint32_t task_end = std::min(rank, lead + 3);
  if (task_end == rank && shape[rank - 1] <= 4) --task_end;
  if (lead == 0 || task_end < lead + 2) return std::nullopt;  // all-ones shapes too
  uint64_t rest = 1;
  for (uint32_t a = task_end; a < rank; ++a) rest *= shape[a];
  if (rest > kMaxUnrolled) return std::nullopt;
  const std::string r = std::to_string(rank);
  std::string name = "vkad_fill_" + t + "_" + r + "_row0";
  for (uint32_t a = task_end; a < rank; ++a) name += "_" + std::to_string(shape[a]);
  return codegen::unrolled_array_kernel_text(
      name, "dst: ndarray<" + t + ", " + r + ">, value: " + t, "fill", "dst", shape, lead, task_end,
      "    %v = arg value : " + t + "\n",
      [](const std::string& index, uint64_t) { return "    store dst[" + index + "], %v\n"; });
}

std::string fill_kernel_ir(DType dtype, const std::vector<uint32_t>& shape) {
  if (std::optional<std::string> row = row_fill_kernel_ir(runtime::dtype_name(dtype), shape))
    return *row;
  const uint32_t rank = static_cast<uint32_t>(shape.size());
  uint64_t rest = 1;
  for (uint32_t a = 3; a < rank; ++a) rest *= shape[a];
  const bool unrolled = rank > 3 && rest <= kMaxUnrolled;
  const std::string t = runtime::dtype_name(dtype), r = std::to_string(rank);
  std::string name = "vkad_fill_" + t + "_" + r;
  for (uint32_t a = 3; unrolled && a < rank; ++a) name += "_" + std::to_string(shape[a]);
  // Unrolled: the task's indices, then every index of the trailing axes (the last fastest).
  auto stores = [&](const std::string& lead) {
    std::string out;
    std::vector<uint32_t> at(rank - 3, 0);
    for (uint64_t e = 0; e < rest; ++e) {
      std::string index = lead;
      for (size_t k = 0; k < at.size(); ++k) {
        const std::string c = "%c" + std::to_string(e) + "_" + std::to_string(k);
        out += "    " + c + " = const " + std::to_string(at[k]) + " : i32\n";
        index += ", " + c;
      }
      out += "    store dst[" + index + "], %v\n";
      for (size_t k = at.size(); k-- > 0;) {
        if (++at[k] < shape[3 + k]) break;
        at[k] = 0;
      }
    }
    return out;
  };
  return codegen::whole_array_kernel_text(
      name, "dst: ndarray<" + t + ", " + r + ">, value: " + t, "fill", "dst", unrolled ? 3 : rank,
      "    %v = arg value : " + t + "\n", [&](const std::string& index) {
        return unrolled ? stores(index) : "    store dst[" + index + "], %v\n";
      });
}

Arg fill_value(DType t, double v) {
  switch (t) {
    case DType::kI32: return Arg::i32(static_cast<int32_t>(v));
    case DType::kU32: return Arg::u32(static_cast<uint32_t>(v));
    default: return Arg::f32(static_cast<float>(v));
  }
}

// An array the pass renames and where its rewrite stands.
struct Renamed {
  DType dtype = DType::kF32;
  size_t fills = 0;                    // its lifetimes after the first fill: 1 .. fills
  size_t seen = 0;                     // fills the rewrite met so far
  uint64_t buffer[kRing] = {0, 0, 0};  // [0] the caller's array, then the twins
  uint64_t current = 0;                // the buffer of the lifetime the rewrite is in
};

// The arrays to rename (see the file's comment), with their dtype and number of fills. The
// twins' budget goes to the arrays filled most often first (ties: the first filled first): a
// budgeted tape's deepest level fills each step's grid version once a segment, its reverse the
// one gradient grid once a step, and only the latter's fills cut every step apart.
std::unordered_map<uint64_t, Renamed> candidates(const Program& p, const PassContext& ctx) {
  std::unordered_map<uint64_t, Renamed> out;
  std::vector<uint64_t> order;  // by first fill
  for (const CapturedStep& s : p.steps) {
    if (!s.launch && !s.args.empty() && s.args[0].kind == abi::ParamKind::kNdArray) {
      if (out[s.args[0].array.id].fills++ == 0) order.push_back(s.args[0].array.id);
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](uint64_t a, uint64_t b) { return out[a].fills > out[b].fills; });
  uint64_t twin_bytes = 0;
  for (uint64_t id : order) {
    Renamed& r = out[id];
    const std::vector<uint32_t>* shape = ctx.extents(id);
    const std::optional<DType> t = ctx.dtype(id);
    uint64_t bytes = 0;
    if (shape != nullptr && t) {
      bytes = runtime::dtype_bytes(*t);
      for (uint32_t e : *shape) bytes *= e;
    }
    const uint64_t twins = std::min<uint64_t>(kRing - 1, r.fills - 1);
    const bool keep = r.fills >= 2 && shape != nullptr && shape->size() >= 2 && t &&
                      (*t == DType::kF32 || *t == DType::kI32 || *t == DType::kU32) && bytes > 0 &&
                      bytes <= kMaxRenamedBytes && twin_bytes + twins * bytes <= kMaxTwinBytes;
    if (!keep) {
      out.erase(id);
      continue;
    }
    twin_bytes += twins * bytes;
    r.dtype = *t;
  }
  return out;
}

// Whether a size has no scalar in it (an update cannot change it).
bool scalar_free(const adstack::SizeExpr& e) {
  if (e.kind == adstack::SizeExpr::Kind::kScalar || e.kind == adstack::SizeExpr::Kind::kNegScalar)
    return false;
  for (const adstack::SizeExpr& o : e.operands) {
    if (!scalar_free(o)) return false;
  }
  return true;
}

// Whether launch `s` (kernel `k`, accesses `acc`) stores every element of `array` and touches
// it no other way: a whole store (ir/launch_access.h) at the array's only parameter whose axes
// are task dimensions over the extent by sizes without scalars, constants 0 .. E-1, or an axis
// of extent 1 at a launch-uniform row that is 0 with these arguments (one grid of DiffTaichi's
// layout, `grid[g, i, j]`: the caller pins the launch's scalars, so an update that could move
// the row runs the graph as captured).
bool overwrites_whole(const CapturedStep& s, std::span<const codegen::WholeStore> whole,
                      const codegen::KernelAccess& acc, uint64_t array, const PassContext& ctx) {
  const std::vector<uint32_t>* shape = ctx.extents(array);
  if (shape == nullptr) return false;
  int param = -1;
  for (size_t a = 0; a < s.args.size(); ++a) {
    if (s.args[a].kind != abi::ParamKind::kNdArray || s.args[a].array.id != array) continue;
    if (param >= 0) return false;  // the array at two parameters
    param = static_cast<int>(a);
  }
  if (param < 0) return false;
  const codegen::ExtentOf extent = ctx.extents_in(s.args);
  const adstack::SizeInputs sizes{
      [](uint32_t) -> int64_t { return 0; },
      [&](uint32_t p, uint32_t d) { return extent(p, d).value_or(-1); }};
  // Task-dimension ends by sizes without scalars: an update cannot shrink the store.
  auto end_of = [&](const adstack::SizeExpr& e) -> std::optional<int64_t> {
    if (!scalar_free(e)) return std::nullopt;
    Result<int64_t> v = adstack::evaluate(e, sizes);
    return v.ok() ? std::optional<int64_t>(*v) : std::nullopt;
  };
  for (const codegen::WholeStore& w : whole) {
    if (w.param == static_cast<uint32_t>(param))
      return codegen::whole_store_covers(w, *shape, end_of, &acc, ctx.launch_inputs(s));
  }
  return false;
}

// What prune asks of each kernel once (a budgeted forward launches a few kernels thousands of
// times): its whole stores, and whether it may be left out (only_writes).
struct KernelFacts {
  std::vector<codegen::WholeStore> whole;
  bool only_writes = false;
};
using FactsCache = std::unordered_map<uint64_t, KernelFacts>;

// The arrays step `s` touches: a fill its array; a launch the arrays at the parameters its
// kernel accesses (gather recompute's kernels keep the producer's unread parameters), every
// array where its kernel's accesses are unknown.
void touched_arrays(const CapturedStep& s, const PassContext& ctx, std::vector<uint64_t>* out) {
  out->clear();
  const std::shared_ptr<const codegen::KernelAccess>* acc =
      s.launch ? &ctx.catalog.access(s.kernel.id) : nullptr;
  if (acc != nullptr && *acc) {
    for (const codegen::ParamAccess& pa : (*acc)->params) {
      if (pa.param < s.args.size() && s.args[pa.param].kind == abi::ParamKind::kNdArray)
        out->push_back(s.args[pa.param].array.id);
    }
    return;
  }
  for (const Arg& a : s.args) {
    if (a.kind == abi::ParamKind::kNdArray) out->push_back(a.array.id);
  }
}

// Per step, per array it touches, the next step that touches the array (SIZE_MAX: none).
using NextTouch = std::vector<std::vector<std::pair<uint64_t, size_t>>>;
NextTouch next_touches(std::span<const CapturedStep> steps, const PassContext& ctx) {
  NextTouch next(steps.size());
  std::unordered_map<uint64_t, size_t> next_of;
  std::vector<uint64_t> touched;
  for (size_t i = steps.size(); i-- > 0;) {
    touched_arrays(steps[i], ctx, &touched);
    for (uint64_t id : touched) {
      auto it = next_of.find(id);
      next[i].emplace_back(id, it == next_of.end() ? SIZE_MAX : it->second);
    }
    for (uint64_t id : touched) next_of[id] = i;
  }
  return next;
}

// The facts of launch `s`'s kernel (null where vkad has no IR of it); may it be left out for
// what it does: a kernel vkad compiled, without adstacks, print or assert.
const KernelFacts* kernel_facts(const CapturedStep& s, const PassContext& ctx, FactsCache& facts) {
  auto [it, fresh] = facts.try_emplace(s.kernel.id);
  if (fresh) {
    const std::shared_ptr<const codegen::Kernel>& k = ctx.catalog.ir(s.kernel.id);
    if (!k || k->params.size() != s.args.size()) {
      facts.erase(it);
      return nullptr;
    }
    it->second.whole = codegen::whole_stores(*k);
    bool effects = ctx.catalog.adstack(s.kernel.id) || !ctx.catalog.access(s.kernel.id);
    codegen::for_each_stmt(*k, [&](const codegen::Stmt& st) {
      effects = effects || st.op == codegen::Op::kPrint || st.op == codegen::Op::kAssert;
    });
    it->second.only_writes = !effects;
  }
  return &it->second;
}

// Whether step `j` overwrites every element of `array` (a fill of it, or overwrites_whole);
// `pins` gets a launch's step.
bool overwritten_at(std::span<const CapturedStep> steps, size_t j, uint64_t array,
                    const PassContext& ctx, FactsCache& facts, std::vector<size_t>* pins) {
  const CapturedStep& t = steps[j];
  if (!t.launch) return !t.args.empty() && t.args[0].array.id == array;
  const KernelFacts* f = kernel_facts(t, ctx, facts);
  const std::shared_ptr<const codegen::KernelAccess>& acc = ctx.catalog.access(t.kernel.id);
  if (f == nullptr || !acc || !overwrites_whole(t, f->whole, *acc, array, ctx)) return false;
  pins->push_back(j);
  return true;
}

// Whether every array launch step `i` writes is overwritten whole by the next step touching it
// (`pins` gets those steps; left as it was where not).
bool writes_overwritten(std::span<const CapturedStep> steps, size_t i, const NextTouch& next,
                        const PassContext& ctx, FactsCache& facts, std::vector<size_t>* pins) {
  const CapturedStep& s = steps[i];
  const size_t pinned = pins->size();
  bool any_write = false;
  for (const codegen::ParamAccess& pa : ctx.catalog.access(s.kernel.id)->params) {
    const bool writes = std::any_of(pa.accesses.begin(), pa.accesses.end(), [](const auto& x) {
      return x.kind != codegen::ArrayAccess::Kind::kRead;
    });
    if (!writes) continue;
    any_write = true;
    size_t j = SIZE_MAX;
    if (pa.param < s.args.size() && s.args[pa.param].kind == abi::ParamKind::kNdArray) {
      for (const auto& [id, n] : next[i]) {
        if (id == s.args[pa.param].array.id) j = n;
      }
    }
    if (j == SIZE_MAX || !overwritten_at(steps, j, s.args[pa.param].array.id, ctx, facts, pins)) {
      pins->resize(pinned);
      return false;
    }
  }
  return any_write;
}

// Per step: a launch whose every write is overwritten whole before anything reads it -- the
// next step that touches each array it writes is a fill of that array, or a launch that stores
// every element of it (overwrites_whole) -- and that does nothing else (kernel_facts). The last
// launch touching an array is never dead: what it leaves is what the caller reads; nor the
// last launch left. A checkpointed tape's forward without copies repeats such a launch every
// step (grid_op writing the one grid_v_out that g2p recomputes: diffmpm in a memory budget).
// `pins` gets the steps of the launches that overwrite a dead one's writes (their scalars must
// keep the rows they had: the install pins them).
std::vector<bool> dead_launches(std::span<const CapturedStep> steps, const PassContext& ctx,
                                std::vector<size_t>* pins) {
  std::vector<bool> dead(steps.size(), false);
  const NextTouch next = next_touches(steps, ctx);
  size_t launches = 0, dropped = 0;
  for (const CapturedStep& s : steps) launches += s.launch ? 1 : 0;
  FactsCache facts;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!steps[i].launch || dropped + 1 >= launches) continue;
    const KernelFacts* f = kernel_facts(steps[i], ctx, facts);
    if (f == nullptr || !f->only_writes) continue;
    if (writes_overwritten(steps, i, next, ctx, facts, pins)) {
      dead[i] = true;
      ++dropped;
    }
  }
  return dead;
}

class RenamePass final : public GraphPass {
 public:
  std::string name() const override { return "rename"; }
  Stage stage() const override { return Stage::kMerge; }

  bool run(Program& p, PassContext& ctx) override {
    // A step loop's plan keeps its fills and launches: its zeros are planned around them
    // (StepLoops::plan_zeros), and its launches map to the body's by position.
    if (!ctx.knows_dtypes()) return true;
    rename(p, ctx);
    return true;
  }

 private:
  void rename(Program& p, PassContext& ctx) {
    std::unordered_map<uint64_t, Renamed> renamed = candidates(p, ctx);
    if (renamed.empty()) return;
    // The fill kernels, one per dtype and rank.
    std::unordered_map<std::string, KernelHandle> fill_kernel;
    for (auto& [id, r] : renamed) {
      const std::string key = fill_kernel_ir(r.dtype, *ctx.extents(id));
      if (fill_kernel.count(key)) continue;
      Result<codegen::Kernel> k = codegen::parse(key);
      if (!k.ok()) return;
      Result<KernelHandle> h = ctx.sink.make(*k, /*keep_ir=*/true);
      if (!h.ok()) return;  // the program keeps its fills
      fill_kernel.emplace(key, *h);
      p.fill_kernels.push_back(h->id);
    }
    // The twins: a lifetime k of n (k = 1 .. n after the k-th fill) lives in buffer (n - k) % 3,
    // so the last is the caller's; before the first fill, the caller's.
    for (auto& [id, r] : renamed) {
      r.buffer[0] = r.current = id;
      const size_t twins = std::min(kRing - 1, r.fills - 1);
      for (size_t b = 1; b <= twins; ++b) {
        r.buffer[b] = next_placeholder_++;
        p.stashes.push_back({r.buffer[b], r.dtype, 0, *ctx.extents(id)});
        ctx.alias(r.buffer[b], id);
      }
    }
    std::vector<CapturedStep> out;
    std::vector<uint32_t> launch_of;  // per launch of p.steps: its number in `out`
    uint32_t launches = 0;
    for (const CapturedStep& s : p.steps) {
      if (s.launch) {
        CapturedStep l = s;
        for (Arg& a : l.args) {
          if (a.kind != abi::ParamKind::kNdArray) continue;
          auto it = renamed.find(a.array.id);
          if (it != renamed.end()) a.array = runtime::NdArrayHandle{it->second.current};
        }
        launch_of.push_back(launches++);
        out.push_back(std::move(l));
        continue;
      }
      auto it = renamed.find(s.args[0].array.id);
      if (it == renamed.end()) {
        out.push_back(s);
        continue;
      }
      Renamed& r = it->second;
      r.current = r.buffer[(r.fills - ++r.seen) % kRing];
      CapturedStep f;
      f.kernel = fill_kernel.at(fill_kernel_ir(r.dtype, *ctx.extents(it->first)));
      f.args = {Arg::ndarray(runtime::NdArrayHandle{r.current}), fill_value(r.dtype, s.value)};
      ++launches;
      out.push_back(std::move(f));
    }
    for (uint32_t& l : p.launch_index) l = launch_of[l];
    p.steps = std::move(out);
    p.renamed = renamed.size();
    p.renumbered = true;
  }

  // Placeholder ids are array ids no ndarray has, unique for the session's life (the block
  // pass's start at 2^62).
  uint64_t next_placeholder_ = (uint64_t{1} << 62) + (uint64_t{1} << 61);
};

// The prune pass: launches whose every write is overwritten whole before anything reads it are
// left out (dead_launches).
class PrunePass final : public GraphPass {
 public:
  std::string name() const override { return "prune"; }
  Stage stage() const override { return Stage::kRewrite; }

  // Leaves out each launch whose every write is overwritten whole before anything reads it
  // (dead_launches). A captured launch left out counts as merged into the launch after it: an
  // update of its scalars runs the graph as captured (CompiledGraphs::unroll_numbering).
  bool run(Program& p, PassContext& ctx) override {
    if (!ctx.knows_dtypes()) return true;  // as rename: a step loop's plan keeps its launches
    std::vector<size_t> pin_steps;
    const std::vector<bool> dead = dead_launches(p.steps, ctx, &pin_steps);
    if (std::find(dead.begin(), dead.end(), true) == dead.end()) return true;
    std::vector<uint32_t> launch_at(p.steps.size(), 0);  // per launch step: its launch number
    for (size_t i = 0, n = 0; i < p.steps.size(); ++i) launch_at[i] = p.steps[i].launch ? n++ : n;
    std::vector<CapturedStep> out;
    std::vector<uint32_t> launch_of;  // per launch of p.steps: the launch of `out` it maps to
    std::vector<bool> dropped;        // per launch of p.steps
    uint32_t kept = 0;
    for (size_t i = 0; i < p.steps.size(); ++i) {
      if (!p.steps[i].launch) {
        out.push_back(std::move(p.steps[i]));
        continue;
      }
      dropped.push_back(dead[i]);
      launch_of.push_back(kept);  // a dropped launch: the next one kept
      if (!dead[i]) {
        ++kept;
        out.push_back(std::move(p.steps[i]));
      }
    }
    for (uint32_t& l : launch_of) l = std::min(l, kept - 1);  // kept >= 1: see dead_launches
    size_t newly = 0;  // captured launches left out here (a fill launch rename made is none)
    for (size_t c = 0; c < p.launch_index.size(); ++c) {
      const uint32_t l = p.launch_index[c];
      newly += !p.merged[c] && dropped[l] ? 1 : 0;
      p.merged[c] = p.merged[c] || dropped[l];
      p.launch_index[c] = launch_of[l];
    }
    // Recompute's pairs follow their launches; a member left out stands for the other (its own
    // scalars are pinned as a merged launch's), so no unrelated launch gets pinned for it.
    for (size_t k = 0; k + 1 < p.recompute_pins.size(); k += 2) {
      size_t& a = p.recompute_pins[k];
      size_t& b = p.recompute_pins[k + 1];
      const bool da = dropped[a], db = dropped[b];
      a = launch_of[a];
      b = launch_of[b];
      if (da && !db) a = b;
      if (db && !da) b = a;
      // Both left out: the launch after them pinned (conservative; none of theirs runs).
    }
    for (size_t st : pin_steps) {
      if (!dead[st]) p.prune_pins.push_back(launch_of[launch_at[st]]);
    }
    if (!p.memo.empty()) {
      ScheduleMemo memo;
      for (size_t i = 0; i < p.steps.size() && i < p.memo.size(); ++i) {
        if (!dead[i]) memo.push_back(std::move(p.memo[i]));
      }
      p.memo = std::move(memo);
    }
    p.steps = std::move(out);
    p.dropped += newly;
    p.renumbered = true;
    return true;
  }
};

}  // namespace

std::unique_ptr<GraphPass> make_rename_pass() { return std::make_unique<RenamePass>(); }
std::unique_ptr<GraphPass> make_prune_pass() { return std::make_unique<PrunePass>(); }

}  // namespace vkad
