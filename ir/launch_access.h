// Launch access: what a kernel reads and writes of each ndarray parameter, with the rows each
// access touches where a launch's arguments decide them. A tape (api/tape_hazards.h) uses it to
// refuse a recorded launch that overwrites what an earlier recorded launch read: reverse mode
// replays each launch's adjoint on the arrays as they are at backward, so such a launch would
// give wrong gradients without an error.
//
// Per ndarray parameter, every load, store, atomic_add and atomic_max of it is one access
// (identical ones are listed once). Per axis of the parameter, an access's index is either
// *launch-uniform* -- the same value in every invocation of a launch: integer constants, i32 /
// u32 / bool scalar parameters, shape() queries and integer arithmetic, comparisons, select and
// i32 / u32 / bool casts of them (the set disjoint_access.h proves with) -- or not (a task or
// loop index, a local, a loaded value, a float or i64 anywhere). A launch-uniform index is kept
// as an expression (UniformExpr) that evaluate() computes from a launch's scalar arguments and
// array shapes, with the IR's i32 / u32 semantics (ir.h, "Operation semantics"), so the tape
// learns the concrete row each access touches on that axis.
//
// Conservative on purpose: an access inside a branch or loop that may not run is listed as if
// it ran, and an out-of-bounds row (which touches nothing on the device) as if it touched its
// row. A caller comparing rows may refuse a harmless program; it never misses an overlap.
//
// Pure: reads the kernel only. Computed once per kernel (Session::differentiate caches it).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ir/ir.h"

namespace vkad::codegen {

// A launch-uniform i32 / u32 / bool value as a small expression DAG, operands before their
// users; the value is the last node's.
struct UniformExpr {
  struct Node {
    Op op = Op::kConst;
    DType type = DType::kI32;          // the result type
    DType from = DType::kI32;          // the operand type (comparisons, casts)
    int64_t imm = 0;                   // kConst
    uint32_t param = 0, dim = 0;       // kArg: param; kShape: param, dim
    uint32_t operands[3] = {0, 0, 0};  // node indices (unary: [0]; select: cond, a, b)
    bool operator==(const Node&) const = default;
  };
  std::vector<Node> nodes;
  bool operator==(const UniformExpr&) const = default;
};

// Where an expression's leaves come from at a launch: the value of scalar parameter `param`
// (i32, u32 or bool: the argument's integer value), and extent `dim` of ndarray parameter
// `param` (nullopt when it is not known: the expression's value is then unknown too).
struct UniformInputs {
  std::function<int64_t(uint32_t param)> scalar;
  std::function<std::optional<uint32_t>(uint32_t param, uint32_t dim)> extent;
};

// The value of `e` as a 32-bit word (an i32 as its two's complement bits; a bool 0 or 1), or
// nullopt when an extent it needs is unknown. Never fails otherwise: x / 0 and the other edge
// cases give the IR's defined results.
std::optional<uint32_t> evaluate(const UniformExpr& e, const UniformInputs& in);

struct ArrayAccess {
  enum class Kind : uint8_t {
    kRead,        // load
    kAccumulate,  // atomic_add: adds to what is there
    kOverwrite,   // store, atomic_max: replaces what is there
  };
  static constexpr uint32_t kNotUniform = UINT32_MAX;
  Kind kind = Kind::kRead;
  // Per axis of the parameter: the index into KernelAccess::exprs of this access's launch-
  // uniform index on that axis, or kNotUniform.
  std::vector<uint32_t> rows;
  bool operator==(const ArrayAccess&) const = default;
};

struct ParamAccess {
  uint32_t param = 0;
  uint32_t rank = 0;
  bool needs_grad = false;
  std::vector<ArrayAccess> accesses;  // distinct; never empty
};

struct KernelAccess {
  std::string kernel;               // the kernel's name, for messages
  std::vector<std::string> names;   // every parameter's name, by index
  std::vector<ParamAccess> params;  // the ndarray parameters accessed, in parameter order
  std::vector<UniformExpr> exprs;   // the distinct launch-uniform indices
};

// `k` must verify. Pure.
KernelAccess kernel_access(const Kernel& k);

// A parameter every invocation of `k`'s one parallel task stores to at the top of the task's
// body (not in a branch or loop), and that `k` accesses no other way (no load, no atomic, no
// store elsewhere): per axis of the parameter, what the stores' indices are there. A launch
// overwrites every element of the array when each axis is covered at its extent E: a task
// dimension whose range is [0, E) (`end` evaluates to E; its begin is 0), constants that are
// 0 .. E-1 together (one axis at most varies across the stores: a vector's components), or an
// extent of 1 whose launch-uniform index is 0 (`kUniform`: the caller evaluates the access's
// row, ir/launch_access's rows). A checkpointed tape then need not start a new version of the
// array from the old one (api/tape.h).
struct WholeStore {
  struct Axis {
    enum class Kind : uint8_t { kTaskDim, kConst, kUniform };
    Kind kind = Kind::kUniform;
    SizeExpr end;                 // kTaskDim: the dimension's range end
    std::vector<int64_t> consts;  // kConst: the stores' constants, sorted and distinct
  };
  uint32_t param = 0;
  std::vector<Axis> axes;
};
// `k` must verify. Pure.
std::vector<WholeStore> whole_stores(const Kernel& k);

// Whether whole store `w` of a launch covers every element of an array of extents `shape`:
// per axis, a task dimension whose range end (`end_of`: its value at the launch, nullopt where
// it does not evaluate) is the extent, constants 0 .. E-1 together, or an extent of 1 at which
// every access of the parameter in `access` (null: unknown) has launch-uniform row 0 with
// `rows`. What a checkpointed tape (api/tape.h) and the prune graph pass ask.
bool whole_store_covers(const WholeStore& w, std::span<const uint32_t> shape,
                        const std::function<std::optional<int64_t>(const SizeExpr&)>& end_of,
                        const KernelAccess* access, const UniformInputs& rows);

// The ndarray parameters of `k` whose loaded values it uses: a load whose result reaches,
// through any chain of operations, a store or atomic, a local or shared store, a stack
// operation, a branch's condition, a loop's bounds, a print or an assert. A load nothing uses
// does not count (an adjoint replays its forward's loads whether its derivatives need them or
// not: a linear kernel's adjoint loads its input and uses only gradients). Sorted, distinct.
// `k` must verify. Pure.
std::vector<uint32_t> used_loads(const Kernel& k);

// The values of `k` that are launch-uniform (the set above: what an index may be built from
// to count as a launch-uniform row). `k` must verify. Pure.
std::unordered_set<ValueId> launch_uniform_values(const Kernel& k);

// The values of `k` an invocation takes from a table: loads of an i32 / u32 / bool ndarray
// (an actuator id, a material, a spring's anchor), and i32 / u32 / bool arithmetic,
// comparisons, select and casts of such values and launch-uniform ones only. Elements a
// program builds object by object carry such an index in long runs, so the invocations of one
// subgroup often agree on it: what the SPIR-V emitter combines a subgroup's atomic_add on
// (spirv_emitter.cpp, atomic_add). A task or loop index mixed in, or a float cast (an MPM
// grid cell), takes a value out: those differ from invocation to invocation. `k` must verify.
// Pure.
std::unordered_set<ValueId> table_index_values(const Kernel& k);

// The float values of `k` that are zero wherever a condition or a flag says so: a float zero,
// a select with such an arm, a bool -- or an integer every definition of which is a constant, 0
// among them (`flag = 0; if inside: flag = 1`) -- cast to float, products and quotients of such
// a value, negations, sums and differences of two, and loads of a local every store of which
// gives one or lies inside more `if`s than the local's alloca (a local, zero from its alloca,
// that only a branch changes; a reverse-mode accumulator of such values: the greatest such set,
// so a local that adds to itself counts). Reverse mode adds a read's adjoint wherever the read
// ran; behind a mask -- a ray's sample outside the volume, a clamp, a relu, a contact that did
// not happen (the adjoint accumulated inside the contact's branch) -- it is zero,
// which the SPIR-V emitter then does not add atomically (spirv_emitter.cpp, atomic_add). A
// heuristic of where zeros are likely, not a proof that a value is ever zero. `k` must verify.
// Pure.
std::unordered_set<ValueId> masked_values(const Kernel& k);

// The launch-uniform values `k` uses as array indices, with their expressions, sorted by value
// id. `k` must verify. Pure.
std::vector<std::pair<ValueId, UniformExpr>> uniform_index_exprs(const Kernel& k);

// Evaluated launch-uniform values of one launch, sorted by value id (ids unique). A graph
// rework builds one per captured launch (~10^4 for a DiffTaichi iteration): a sorted vector
// is one allocation where a hash map took one per value, most of the rework's time.
struct UniformWords {
  std::vector<std::pair<ValueId, uint32_t>> sorted;
  std::optional<uint32_t> find(ValueId v) const;
};

// The launch-uniform values of `k` evaluated for one launch (each as evaluate() gives it);
// those whose extents `in` does not know are left out. `k` must verify. Pure.
UniformWords launch_uniform_words(const Kernel& k, const UniformInputs& in);

}  // namespace vkad::codegen
