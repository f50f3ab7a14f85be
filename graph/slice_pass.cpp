// The slice pass (graph/graph_passes.h, docs/graphs.md "Copies sliced for fusion"): a whole-
// array copy launch (the session's `vkad_copy_<dtype>_<rank>`, a checkpointed tape's new
// version of an array a launch then writes in part) whose next launch touching the copy's
// destination is a 1-d task over one axis of it, touching each element only at the invocation
// whose index is that element's coordinate on the axis, becomes a copy over that task: invocation
// p copies the elements whose coordinate on the axis is p (the other axes unrolled). The copy
// then has the launch's range, and fusion (graph/launch_fusion.h) merges it into the launch as
// an element-wise chain: a budgeted diffmpm's particle rings (x[2, n, 2], C[2, n, 2, 2]) are
// copied in the g2p and p2g that read one row and write the other, not in a dispatch of their
// own that the launches after it wait for.
//
// The sliced copy writes what the whole copy wrote, so the pass never changes a result: where
// fusion does not merge it, it is a copy of another shape. Only graphs (the copy kernel is made
// for the array's dtype, which a step loop's plan does not know), copies whose other axes hold
// at most kMaxUnrolled elements (no loop: lavapipe keeps kernels with loops out of fusion; 32
// takes a 3-D MPM's C and F rings, [2, n, 3, 3]: 18).
#include <algorithm>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/graph_passes.h"
#include "ir/launch_access.h"
#include "ir/text.h"

namespace vkad {

namespace {

constexpr uint64_t kMaxUnrolled = 32;

// The sliced copy's IR: a 1-d task over axis `axis` of arrays of `dtype` with extents `shape`;
// every element of the other axes loaded from src and stored to dst, one statement each.
std::string sliced_copy_ir(const std::string& t, const std::vector<uint32_t>& shape,
                           uint32_t axis) {
  const uint32_t rank = static_cast<uint32_t>(shape.size());
  const std::string array = "ndarray<" + t + ", " + std::to_string(rank) + ">";
  std::string name =
      "vkad_copy_" + t + "_" + std::to_string(rank) + "_along" + std::to_string(axis);
  for (uint32_t a = 0; a < rank; ++a) name += a == axis ? "" : "_" + std::to_string(shape[a]);
  return codegen::unrolled_array_kernel_text(
      name, "src: " + array + ", dst: " + array, "copy", "src", shape, axis, axis + 1, "",
      [&](const std::string& index, uint64_t e) {
        const std::string v = "%v" + std::to_string(e);
        return "    " + v + " = load src[" + index + "] : " + t + "\n    store dst[" + index +
               "], " + v + "\n";
      });
}

// The one axis on which some access of `pa` (arrays of `rank` axes) is not launch-uniform, the
// same axis in all of them; nullopt where there is none or more than one.
std::optional<uint32_t> one_varying_axis(const codegen::ParamAccess& pa, size_t rank) {
  std::optional<uint32_t> axis;
  for (const codegen::ArrayAccess& x : pa.accesses) {
    if (x.rows.size() != rank) return std::nullopt;
    for (uint32_t a = 0; a < x.rows.size(); ++a) {
      if (x.rows[a] == codegen::ArrayAccess::kNotUniform && axis && *axis != a) return std::nullopt;
      if (x.rows[a] == codegen::ArrayAccess::kNotUniform) axis = a;
    }
  }
  return axis;
}

class SlicePass final : public GraphPass {
 public:
  std::string name() const override { return "slice"; }
  Stage stage() const override { return Stage::kRewrite; }

  bool run(Program& p, PassContext& ctx) override {
    if (!ctx.knows_dtypes()) return true;  // as rename: a step loop's plan keeps its copies
    for (size_t i = 0; i < p.steps.size(); ++i) {
      CapturedStep& c = p.steps[i];
      if (!c.launch || c.args.size() != 2 || c.args[1].kind != abi::ParamKind::kNdArray) continue;
      const uint64_t src = c.args[0].array.id, dst = c.args[1].array.id;
      const std::vector<uint32_t>* shape = ctx.extents(dst);
      const std::optional<runtime::DType> t = ctx.dtype(dst);
      // The session's copy binds arrays of one shape; a kernel of the same text on others (a
      // user's) iterates src's extents, the sliced one dst's: left as it is.
      const std::vector<uint32_t>* src_shape = ctx.extents(src);
      if (shape == nullptr || shape->size() < 2 || !t || src == dst || src_shape == nullptr ||
          *src_shape != *shape ||
          !whole_copy(c.kernel.id, runtime::dtype_name(*t), shape->size(), ctx))
        continue;
      const std::optional<uint32_t> axis = slice_axis(p.steps, i, dst, *shape, ctx);
      if (!axis) continue;
      uint64_t rest = 1;
      for (uint32_t a = 0; a < shape->size(); ++a) rest *= a == *axis ? 1 : (*shape)[a];
      if (rest > kMaxUnrolled) continue;
      const std::string text = sliced_copy_ir(runtime::dtype_name(*t), *shape, *axis);
      auto made = made_.find(text);
      if (made == made_.end()) {
        Result<codegen::Kernel> k = codegen::parse(text);
        if (!k.ok()) continue;
        Result<KernelHandle> h = ctx.sink.make(*k, /*keep_ir=*/true);
        if (!h.ok()) continue;  // the copy stays whole
        made = made_.emplace(text, *h).first;
      }
      c.kernel = made->second;
      ++p.sliced;
    }
    return true;
  }

  void forget(uint64_t id) override {
    for (auto it = made_.begin(); it != made_.end();) {
      it = it->second.id == id ? made_.erase(it) : std::next(it);
    }
    copies_.erase(id);
  }

 private:
  // Whether kernel `id` is the session's whole-array copy of its rank and dtype (its IR printed
  // is the copy kernel's: codegen::copy_kernel_text).
  bool whole_copy(uint64_t id, const std::string& t, size_t rank, const PassContext& ctx) {
    auto known = copies_.find(id);
    if (known != copies_.end()) return known->second;
    bool yes = false;
    const std::shared_ptr<const codegen::Kernel>& k = ctx.catalog.ir(id);
    if (k && k->name.rfind("vkad_copy_", 0) == 0 && k->params.size() == 2) {
      Result<codegen::Kernel> want =
          codegen::parse(codegen::copy_kernel_text(t, static_cast<uint32_t>(rank)));
      yes = want.ok() && codegen::print(*want) == codegen::print(*k);
    }
    copies_.emplace(id, yes);
    return yes;
  }

  // The axis of `dst` (extents `shape`) to slice copy `i` along: the next launch touching dst
  // is a fusible 1-d task over [0, N), binds dst at one parameter, and every access of it there
  // is at a launch-uniform index on every axis but one, the same one in all of them, whose
  // extent is N.
  static std::optional<uint32_t> slice_axis(const std::vector<CapturedStep>& steps, size_t i,
                                            uint64_t dst, const std::vector<uint32_t>& shape,
                                            const PassContext& ctx) {
    for (size_t j = i + 1; j < steps.size(); ++j) {
      const CapturedStep& l = steps[j];
      if (!l.launch) {
        if (!l.args.empty() && l.args[0].array.id == dst) return std::nullopt;  // a fill of it
        continue;
      }
      int param = -1;
      for (size_t a = 0; a < l.args.size(); ++a) {
        if (l.args[a].kind != abi::ParamKind::kNdArray || l.args[a].array.id != dst) continue;
        if (param >= 0) return std::nullopt;  // dst at two parameters
        param = static_cast<int>(a);
      }
      const std::shared_ptr<const codegen::KernelAccess>& acc = ctx.catalog.access(l.kernel.id);
      if (!acc) return std::nullopt;
      const codegen::ParamAccess* pa = nullptr;
      for (const codegen::ParamAccess& q : acc->params) {
        if (param >= 0 && q.param == static_cast<uint32_t>(param)) pa = &q;
      }
      if (pa == nullptr) continue;  // does not touch dst (or binds it and never accesses it)
      const std::shared_ptr<const codegen::Kernel>& k = ctx.catalog.fusible_ir(l.kernel.id);
      if (!k) return std::nullopt;
      const std::optional<std::vector<std::pair<int64_t, int64_t>>> r = ctx.task_ranges(l, *k);
      if (!r || r->size() != 1 || (*r)[0].first != 0) return std::nullopt;
      const std::optional<uint32_t> axis = one_varying_axis(*pa, shape.size());
      if (!axis || shape[*axis] != static_cast<uint64_t>((*r)[0].second)) return std::nullopt;
      return axis;
    }
    return std::nullopt;
  }

  std::unordered_map<std::string, KernelHandle> made_;  // by IR text
  std::unordered_map<uint64_t, bool> copies_;           // kernel id -> whole_copy
};

}  // namespace

std::unique_ptr<GraphPass> make_slice_pass() { return std::make_unique<SlicePass>(); }

}  // namespace vkad
