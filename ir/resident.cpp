#include "ir/resident.h"

#include <functional>
#include <map>
#include <unordered_map>

#include "ir/launch_fusion.h"

namespace vkad::codegen {

namespace {

bool residable_block(const Block& b) {
  for (const Stmt& s : b.stmts) {
    // Adstacks bind the runtime's heaps, sized per launch; a stated trip bound may read
    // scalars the roll steps; a barrier belongs to the rolled kernel alone.
    if (s.op >= Op::kStackAlloc || s.has_cap) return false;
    for (const Block& c : s.blocks) {
      if (!residable_block(c)) return false;
    }
  }
  return true;
}

// Appends statements to a block and hands out fresh ids.
struct Writer {
  Kernel& k;
  Block* to = nullptr;

  ValueId emit(Op op, DType t, std::vector<ValueId> args) {
    Stmt s;
    s.op = op;
    s.type = t;
    s.args = std::move(args);
    s.result = k.fresh();
    to->stmts.push_back(std::move(s));
    return to->stmts.back().result;
  }
  ValueId i32(int64_t v) {
    Stmt s;
    s.op = Op::kConst;
    s.type = DType::kI32;
    s.iimm = v;
    s.result = k.fresh();
    to->stmts.push_back(std::move(s));
    return to->stmts.back().result;
  }
  void barrier() {
    Stmt s;
    s.op = Op::kBarrier;
    to->stmts.push_back(std::move(s));
  }
};

}  // namespace

bool residable(const Kernel& k) {
  if (k.tasks.empty()) return false;
  for (const Task& t : k.tasks) {
    if (t.serial || !t.dims.empty() || t.index == kNoValue || !residable_block(t.body)) {
      return false;
    }
  }
  return true;
}

namespace {

// The rolled kernel's parameters (merged_param) and each member's map into them; an error
// names a member that does not match its kernel or cannot be rolled.
Status merge_params(std::span<const ResidentMember> period, ResidentKernel& out,
                    const std::function<Status(const std::string&)>& fail) {
  std::map<uint64_t, uint32_t> array_param;  // array identity -> rolled parameter
  for (size_t m = 0; m < period.size(); ++m) {
    const ResidentMember& mem = period[m];
    const Kernel& k = *mem.kernel;
    if (!residable(k)) return fail("kernel '" + k.name + "' cannot run in a resident kernel");
    if (mem.arrays.size() != k.params.size() || mem.step.size() != k.params.size() ||
        mem.ranges.size() != k.tasks.size()) {
      return fail("launch " + std::to_string(m) + " of '" + k.name + "' does not match its kernel");
    }
    std::vector<uint32_t>& pm = out.param_map.emplace_back(k.params.size());
    for (size_t p = 0; p < k.params.size(); ++p) {
      const Param& kp = k.params[p];
      if (mem.step[p] != 0 && (kp.kind != ParamKind::kScalar || kp.dtype != DType::kI32)) {
        return fail("parameter '" + kp.name + "' of '" + k.name +
                    "' steps but is not an i32 scalar");
      }
      pm[p] = merged_param(out.kernel, array_param, kp, mem.arrays[p], m);
    }
  }
  return {};
}

// Appends one repetition of one member to `body` (the repetition loop's, `r` its counter):
// its stepping scalars' values this repetition, then per task a grid-stride pass over its
// range by the workgroup (`index` the invocation), then a barrier.
void append_member(Kernel& f, Block& body, ValueId r, ValueId index, uint32_t local_size,
                   const ResidentMember& mem, const std::vector<uint32_t>& pm) {
  const Kernel& k = *mem.kernel;
  Writer w{f, &body};
  // This repetition's value of each stepping scalar: first + r * step.
  std::unordered_map<uint32_t, ValueId> stepped;
  for (size_t p = 0; p < k.params.size(); ++p) {
    if (mem.step[p] == 0) continue;
    Stmt a;
    a.op = Op::kArg;
    a.type = DType::kI32;
    a.param = pm[p];
    a.result = f.fresh();
    body.stmts.push_back(a);
    const ValueId delta = w.emit(Op::kMul, DType::kI32, {r, w.i32(mem.step[p])});
    stepped[static_cast<uint32_t>(p)] = w.emit(Op::kAdd, DType::kI32, {a.result, delta});
  }
  for (size_t ti = 0; ti < k.tasks.size(); ++ti) {
    const Task& kt = k.tasks[ti];
    const int64_t begin = mem.ranges[ti].first, end = mem.ranges[ti].second;
    const int64_t n = end > begin ? end - begin : 0;
    const int64_t passes = (n + local_size - 1) / local_size;
    MemberCopier c(f, kt.index, pm, &stepped);
    // Element begin + index (+ pass * local_size), where it is below `end`.
    auto guarded = [&](Block& into, ValueId pass) {
      Writer in{f, &into};
      ValueId i = in.emit(Op::kAdd, DType::kI32, {index, in.i32(begin)});
      if (pass != kNoValue) {
        i = in.emit(Op::kAdd, DType::kI32,
                    {i, in.emit(Op::kMul, DType::kI32, {pass, in.i32(local_size)})});
      }
      Stmt branch;
      branch.op = Op::kIf;
      branch.type = DType::kBool;
      branch.args = {in.emit(Op::kLt, DType::kBool, {i, in.i32(end)})};
      branch.blocks.resize(2);
      c.new_index = i;
      c.copy_block(kt.body, branch.blocks[0]);
      into.stmts.push_back(std::move(branch));
    };
    if (passes == 1) {
      guarded(body, kNoValue);
    } else if (passes > 1) {
      Stmt loop;
      loop.op = Op::kFor;
      loop.type = DType::kI32;
      loop.args = {w.i32(0), w.i32(passes)};
      loop.result = f.fresh();
      loop.blocks.resize(1);
      guarded(loop.blocks[0], loop.result);
      body.stmts.push_back(std::move(loop));
    }
    w.barrier();  // what this launch wrote, visible to the next
  }
}

}  // namespace

Result<ResidentKernel> roll_launches(std::span<const ResidentMember> period, uint32_t reps,
                                     uint32_t local_size, const std::string& name) {
  auto fail = [&](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "roll_launches '" + name + "': " + what);
  };
  if (period.empty()) return fail("no launch");
  if (local_size == 0) return fail("local size 0");
  ResidentKernel out;
  Kernel& f = out.kernel;
  f.name = name;
  VKAD_TRY(merge_params(period, out, fail));
  Task t;
  t.name = "resident";
  t.local_size = local_size;
  t.begin = RangeBound::constant(0);
  t.end = RangeBound::constant(local_size);
  t.index = f.fresh();
  Writer w{f, &t.body};
  // The repetitions: a loop with constant bounds (every invocation runs it alike).
  Stmt rep;
  rep.op = Op::kFor;
  rep.type = DType::kI32;
  rep.args = {w.i32(0), w.i32(reps)};
  rep.result = f.fresh();
  rep.blocks.resize(1);
  for (size_t m = 0; m < period.size(); ++m) {
    append_member(f, rep.blocks[0], rep.result, t.index, local_size, period[m], out.param_map[m]);
  }
  t.body.stmts.push_back(std::move(rep));
  f.tasks.push_back(std::move(t));
  return out;
}

}  // namespace vkad::codegen
