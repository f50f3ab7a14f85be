// The kernel IR: what a DSL lowers its kernels into, what reverse mode rewrites, and what the
// SPIR-V emitter and the CPU reference evaluator consume.
//
// Shape of a kernel:
//   Kernel  = name, typed parameters (scalars and ndarrays), tasks.
//   Task    = a parallel range-for over [begin, end) (bounds: constants, scalar parameters or
//             ndarray shapes), or a serial task (the same range, run by one invocation).
//             The task's index is an i32 SSA value visible in its body. An N-d task ranges
//             over the product of up to 3 dimensions (`dims`), each with its own i32 index
//             and bounds that are expressions (sums, products, max) of those leaves.
//   Block   = an ordered list of statements.
//   Stmt    = one operation. A statement that yields something defines exactly one SSA id
//             (`result`): a value, a mutable local (alloca), an adstack (stack_alloc), or the
//             index of a serial for / while loop. Ids are unique within a kernel.
//
// Scoping: an id is visible after its definition in its own block and in blocks nested inside;
// a for / while loop's index is visible only in its body (a while loop's test block is a
// scope of its own, like a branch side). Values are immutable; mutation goes through
// locals (alloca / load_local / store_local), which is what reverse mode needs to see.
//
// Types: f32, f64 and i64 (where the device has them), i32, u32, bool. Arithmetic takes operands of
// one type (casts are explicit); comparisons yield bool; indices and loop bounds are i32 or u32.
// Ndarrays of bool hold one u32 (0/1) per element.
//
// The IR is plain data: build it with KernelBuilder (builder.h) or parse it (text.h); check it
// with verify() (verifier.h) before anything consumes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "abi/kernel_abi.h"
#include "adstack/adstack_layout.h"
#include "adstack/size_expr.h"

namespace vkad::codegen {

using abi::DType;
using abi::ParamKind;
using abi::RangeBound;

using ValueId = uint32_t;
inline constexpr ValueId kNoValue = UINT32_MAX;

// Operation semantics: every op has one result for every input of its types, written down
// once in docs/reference.md ("Operation semantics"); the emitter and the CPU reference both
// produce exactly it. In short: i32/u32 arithmetic wraps; div truncates, mod and floordiv
// round toward -inf; x / 0 = 0, x mod 0 = x, floordiv(x, 0) = 0, INT_MIN / -1 = INT_MIN,
// INT_MIN mod -1 = 0; float -> i32/u32 casts saturate with NaN -> 0; float min/max are
// `a < b ? a : b` / `a > b ? a : b`. Float results are IEEE on the reference and within
// Vulkan's precision requirements on a device.

// How deep for / if bodies may nest (a task body is depth 0; each for or if body one more),
// and how deep a size expression's add / mul / max may nest. The parser and the verifier
// reject deeper kernels with an error, so the recursive passes after them (printer, reverse
// mode, emitter, evaluators) have bounded stack use; reverse mode must keep the adjoint
// within it too. It also bounds compile time: SPIRV-Tools' validation grows faster than
// linearly with loop depth (docs/benchmarks-log.md, "Compile time against nesting depth").
inline constexpr uint32_t kMaxNestingDepth = 64;

// The operations, one per row of ir/ops.def (which says what each takes and yields); the
// comments below give each family's operand layout.
//   leaves: kConst (type, imm), kArg (scalar parameter `param`), kShape (i32 extent `dim` of
//     ndarray parameter `param`)
//   unary (args[0]), binary (args[0], args[1]), comparisons (-> bool)
//   kSelect: args cond, a, b; kCast: args[0] converted to `type`
//   locals: kAlloca (result: a local of `type`, initialised to zero), kLoadLocal (args: local),
//     kStoreLocal (args: local, value); kSharedAlloc (result: an array of `iimm` elements of
//     `type` shared by the invocations of one workgroup, its contents undefined until stored;
//     only at the top of a task that may hold a barrier: the graph rework's blocked stencils,
//     graph/stencil_blocking.h), kLoadShared (args: array, i32 index; result `type`),
//     kStoreShared (args: array, i32 index, value). An index outside [0, iimm) reads or writes
//     element iimm - 1 (the emitter clamps it: never outside the array)
//   ndarrays (parameter `param`; args: indices..., [value]): kLoad, kStore, kAtomicAdd, and
//     kAtomicMax (i32 / u32: element = max(element, value), atomically; not differentiable,
//     reverse mode rejects it; the counting kernels of make_adjoint_counted reduce trip
//     counts with it)
//   kFor: args: begin, end (i32); result: the i32 index; blocks[0]: body; optional `cap`: the
//     DSL's stated maximum trip count (reverse mode needs one when the bounds depend on ndarray
//     contents)
//   kIf: args: cond; blocks[0]: then, blocks[1]: else
//   kWhile: blocks[0]: the test, blocks[1]: the body; args[0]: the test's bool value (defined
//     in blocks[0]); result: the i32 iteration number (0, 1, ...), visible in the test and the
//     body. Runs `for (i = 0; test(i); ++i) body(i)`. The test block is pure (values, loads of
//     ndarrays and locals; no stores, locals, control flow): it decides, it does not compute
//     what the body uses, so reverse mode never reverses it. Optional `cap`: the stated
//     maximum trip count (reverse_mode.h)
//   kBreak leaves the innermost enclosing for / while loop; kContinue ends the innermost
//     loop's iteration (a for loop steps, a while loop tests). Both: no operands; inside a
//     loop body (branches in it included, not a while test), and the last statement of their
//     block (what would follow never runs).
//   adstacks (reverse mode; adstack/ describes storage): kStackAlloc (result: the stack; type:
//     element type; `cap`: capacity bound), kStackPush (stack, value), kStackPop (stack),
//     kStackTop (stack -> primal at the top), kStackTopAdj (stack -> adjoint at the top),
//     kStackAccAdj (stack, value: adjoint at the top += value)
//   kBarrier: every invocation of the workgroup waits here until all have arrived, and ndarray
//     stores and atomics before it are visible to loads after it in every invocation of the
//     workgroup. No operands. Only in a task that runs as exactly one workgroup (a parallel
//     1-d task over [0, local_size) with local_size set), and only where every invocation
//     reaches it alike: outside if / while, inside for loops whose bounds are launch-uniform
//     and whose bodies have no break / continue (verifier). Graph replay's resident kernels
//     (graph/resident.h) separate their phases with it. Not differentiable; the CPU evaluator,
//     which runs one invocation at a time, refuses it.
enum class Op : uint8_t {
#define VKAD_OP(family, name, text, has_result, operands, blocks, rule) k##name,
#include "ir/ops.def"
};
inline constexpr size_t kNumOps = 0  // NOLINTNEXTLINE(bugprone-macro-parentheses): sum terms
#define VKAD_OP(family, name, text, has_result, operands, blocks, rule) +1
#include "ir/ops.def"
    ;

// What the compiler's stages dispatch on: each family is handled by one function per stage,
// which switches over the family's own enum below (every member listed, no default), so an op
// added to ops.def is a compile error wherever its family's handling does not cover it.
enum class OpFamily : uint8_t {
  kLeaf,
  kUnary,
  kBinary,
  kCompare,
  kSelect,
  kCast,
  kLocal,
  kArray,
  kControl,
  kStack,
};
enum class LeafOp : uint8_t {
#define VKAD_LEAF_OP(name, text) k##name,
#include "ir/ops.def"
};
enum class UnaryOp : uint8_t {
#define VKAD_UNARY_OP(name, text, operands, rule) k##name,
#include "ir/ops.def"
};
enum class BinaryOp : uint8_t {
#define VKAD_BINARY_OP(name, text, operands, rule) k##name,
#include "ir/ops.def"
};
enum class CompareOp : uint8_t {
#define VKAD_COMPARE_OP(name, text, operands) k##name,
#include "ir/ops.def"
};
enum class LocalOp : uint8_t {
#define VKAD_LOCAL_OP(name, text, has_result) k##name,
#include "ir/ops.def"
};
enum class ArrayOp : uint8_t {
#define VKAD_ARRAY_OP(name, text, has_result) k##name,
#include "ir/ops.def"
};
enum class ControlOp : uint8_t {
#define VKAD_CONTROL_OP(name, text, has_result, blocks) k##name,
#include "ir/ops.def"
};
enum class StackOp : uint8_t {
#define VKAD_STACK_OP(name, text, has_result) k##name,
#include "ir/ops.def"
};

// Which operand types an arithmetic op or comparison accepts (the rest: their family's rule).
enum class Operands : uint8_t {
  kAny,     // every type (eq, ne; and ops whose family checks its operands itself)
  kNumber,  // not bool
  kFloat,   // f32, f64
  kInt,     // i32, u32, i64
  kBool,
};

using adstack::SizeExpr;

struct Stmt;
// A block's statements copy and free without recursion (base/tree_children.h), so a kernel
// built in memory far past kMaxNestingDepth can be copied, destroyed and then refused by
// verify() without overflowing the stack.
struct Block {
  TreeChildren<Stmt> stmts;
};

struct Stmt {
  Op op = Op::kConst;
  ValueId result = kNoValue;
  DType type = DType::kF32;  // result type; element type for alloca / stack_alloc
  std::vector<ValueId> args;
  uint32_t param = 0;         // kArg, kShape, kLoad, kStore, kAtomicAdd
  uint32_t dim = 0;           // kShape
  double fimm = 0;            // kConst of a float type
  int64_t iimm = 0;           // kConst of an integer or bool type
  std::vector<Block> blocks;  // kFor: body; kIf: then, else; kWhile: test, body
  SizeExpr cap;               // kStackAlloc: capacity; kFor, kWhile: stated max trip (if has_cap)
  bool has_cap = false;
  // Where the statement came from in the user's program (source_location(); 0: nowhere said).
  // Copies of a statement keep it; passes stamp what they make for a statement with its
  // location (codegen::Rewriter::set_location), so errors about derived kernels -- an
  // adjoint's out-of-bounds access, an adstack overflow -- name the user's line.
  uint32_t loc = 0;
};
// TreeChildren's hook: the statement lists nested in `s` (its blocks' statements).
inline void detach_children(Stmt& s, std::vector<TreeChildren<Stmt>>& out) {
  for (Block& b : s.blocks) {
    if (b.stmts.empty()) continue;
    out.push_back(std::move(b.stmts));
    b.stmts.clear();
  }
}

struct Param {
  std::string name;
  ParamKind kind = ParamKind::kScalar;
  DType dtype = DType::kF32;
  uint32_t rank = 0;        // ndarrays
  bool needs_grad = false;  // ndarrays of a float type: reverse mode produces its gradient
  bool read_only = false;   // ndarrays: stores and atomic adds into it are rejected
};

// The most dimensions an N-d task has.
inline constexpr uint32_t kMaxTaskDims = 3;

// One dimension of an N-d task: [begin, end) as size expressions of constants, integer scalar
// parameters and ndarray extents (sums, products, max; `n - 1` is add(n, -1), `a - b` is
// add(a, mul(b, -1))), evaluated per launch with SizeExpr's rules (a negative scalar counts
// as 0), and the i32 index value it binds.
struct TaskDim {
  SizeExpr begin = SizeExpr::constant(0);
  SizeExpr end = SizeExpr::constant(1);
  ValueId index = kNoValue;
};

struct Task {
  std::string name;
  bool serial = false;
  RangeBound begin = RangeBound::constant(0);
  RangeBound end = RangeBound::constant(1);
  ValueId index = kNoValue;  // i32
  Block body;
  uint32_t local_size = 0;  // 0: the compiler chooses
  // Non-empty: an N-d task (1 to kMaxTaskDims dimensions; `begin` / `end` are unused and
  // `index` is dims[0].index). Its iterations are the points of the box, in row-major order
  // (the last dimension varies fastest); a launch with an empty dimension runs none.
  std::vector<TaskDim> dims;
};

// Source locations ("file.py:12:5", a DSL's own words), interned for the process: a statement
// carries a small id, the text lives here. intern_source_location("") is 0; the text may not
// hold a double quote, a backslash or a line break (they are replaced by ' and a space: the
// text form prints it quoted). Thread-safe; ids are never reused.
uint32_t intern_source_location(std::string_view text);
// The text of `id` ("" for 0 or an id never handed out).
std::string source_location(uint32_t id);

// Whether `b` holds a statement `op` at any depth (nesting within kMaxNestingDepth).
bool contains_op(const Block& b, Op op);

// The task's index values, one per dimension ({index} for a 1-d task).
std::vector<ValueId> task_indices(const Task& t);
// For one of t's index values: a constant lower bound (>= 0) and an inclusive upper bound as
// a size expression (end - 1). False when `v` is not an index of `t`.
bool task_index_bounds(const Task& t, ValueId v, int64_t* lo, SizeExpr* up);
// A RangeBound as a size expression.
SizeExpr bound_expr(const RangeBound& b);

struct Kernel {
  std::string name;
  std::vector<Param> params;
  std::vector<Task> tasks;
  ValueId next_id = 0;  // ids below this may be in use; new ids come from here

  ValueId fresh() { return next_id++; }
  // Index of the parameter called `name`, or -1.
  int find_param(const std::string& name) const;
};

// --- op metadata (ir/ops.def, as data) ---
struct OpInfo {
  const char* name;  // the text form
  OpFamily family;
  uint8_t index;  // position within the family: the value of its family enum (LeafOp, ...)
  bool has_result;
  Operands operands;
  uint8_t blocks;  // how many nested blocks the statement holds
};
const OpInfo& op_info(Op op);
// Whether `op` reads or writes an ndarray (load, store, atomic_add, atomic_max).
inline bool accesses_array(Op op) { return op_info(op).family == OpFamily::kArray; }
// Op called `name` in the text form; false if none.
bool op_from_name(const std::string& name, Op* out);

// The member of its family's enum that `op` is; `op` must be of that family.
LeafOp leaf_op(Op op);
UnaryOp unary_op(Op op);
BinaryOp binary_op(Op op);
CompareOp compare_op(Op op);
LocalOp local_op(Op op);
ArrayOp array_op(Op op);
ControlOp control_op(Op op);
StackOp stack_op(Op op);

// `a op b` in the values' own type: the one rule of the CPU evaluator and of the passes that
// fold comparisons (an ordered comparison with a NaN is false, kNe true).
template <typename T>
bool compare_values(CompareOp op, T a, T b) {
  switch (op) {
    case CompareOp::kLt: return a < b;
    case CompareOp::kLe: return a <= b;
    case CompareOp::kGt: return a > b;
    case CompareOp::kGe: return a >= b;
    case CompareOp::kEq: return a == b;
    case CompareOp::kNe: return a != b;
  }
  return false;
}

bool is_float(DType t);
// The adstack heap holding stacks of element type `t` (f32, f64, or the integer heap).
adstack::Heap stack_heap(DType t);
bool is_int(DType t);  // i32, u32, i64
// Float math (sqrt .. ceil, pow, atan2): float operands only (Operands::kFloat in ops.def).
bool is_float_math(Op op);
// Whether `op` computes its value from its operands (and the launch's parameters) alone:
// leaves, arithmetic, comparisons, select and cast. Not locals, ndarrays, control flow or
// adstacks.
bool is_pure_value(Op op);

}  // namespace vkad::codegen
