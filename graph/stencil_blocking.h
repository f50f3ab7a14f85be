// Blocked stencils: K consecutive launches of one kernel whose reads of what the run writes are
// at bounded offsets of the thread's cell (neighbour stencils, a time axis read at t - 1, t - 2,
// Jacobi sweeps) run as one dispatch, each workgroup computing its tile K steps ahead with the
// halo recomputed (temporal blocking); adjoints that scatter into a neighbourhood are first
// turned into gathers so that they block too.
//
// Why: on a GPU each dependent dispatch costs its barrier and drain (~2.8 us on an H200)
// whatever it does, and a 2-D wave step on 256^2 cells is about that much work. A CUDA graph
// pays ~1 us per kernel; vkad can only win by dispatching less. Workgroups cannot see each
// other's writes inside a dispatch, so a workgroup that is to run K steps computes, for step r
// of the K, its tile grown by the stencil's reach times (K - 1 - r) cells on each side: the
// cells step r + 1 reads. Values live in workgroup shared memory between steps; only the tile's
// own cells are written back, so every element of the arrays is written by exactly one
// invocation, as in the unblocked launches, and the launch's results are the same values.
//
// Which launches block (`stencil_steps`): a kernel of one parallel task (1-d or N-d, at most 3
// dimensions) over a box that is the same in every launch, without adstacks, barriers or
// atomic_max. An array it both reads and writes (carried: the state the steps hand on) is
// indexed [row, cell] or [cell] -- the row an integer scalar parameter plus a constant (the time
// axis), the cell's axis k the task's index k plus a bounded offset: the index value itself,
// +/- constants, clamped with min / max against constants, or either side of a select (the
// offset is evaluated at every cell of the box, so DiffTaichi's clamped neighbours count, and
// periodic wraps, whose halo then wraps around the box, too). Stores into
// it are at the thread's own cell; it is never added to atomically (a gather adjoint, below,
// removes those); a load of a row the same launch stores is at the thread's own cell. An array
// only written is stored at the thread's own cell (other axes launch-uniform) or added to
// atomically anywhere; arrays only read may be indexed any way.
//
// The blocked kernel (`block_stencil`) has the original's parameters and one 1-d task of whole
// workgroups, one per tile of the box (256 cells: 256, 16 x 16 or 8 x 8 x 4), each of as many
// invocations as the first launch's grown tile has cells (up to `max_group`):
//
//   shared: one array per (carried array, row) the K launches write, over the tile grown by
//           reach * K
//   with a stash (below): the rows some launch reads before one stores them everywhere, from
//           this dispatch's half of the stash
//   for r in [0, K): the launch's scalars + r * step; for each cell of the tile grown by
//     reach * (K - 1 - r) inside the box: the body, a carried row's loads from shared (global
//     outside the box: never written by the run), its stores to shared and, for a cell of the
//     tile, to the array; other stores and atomics for the tile's cells only; barrier
//   with a stash: the next dispatch's rows at the tile's cells into the other half
//
// K is the largest of 8 .. 2 whose shared arrays fit `shared_bytes` (Vulkan guarantees 16 KiB)
// and whose recomputed halo keeps the work within 2x the unblocked launches'.
//
// Gather adjoints (`gather_form`): reverse mode turns a read of x[i + o] into an atomic add
// into x_grad[i + o]. Where a kernel both reads an array and adds into it atomically at rows it
// does not read, at cells the offset analysis bounds inside the box, each thread j instead runs
// the body of every thread i that may add into its cell (i in j - [lo, hi]), keeps the adds that
// land on j in a local sum per statement, and finally adds the sums to its own elements: the
// same sums (in another order: atomic adds have none) without atomics, and a kernel that
// reads at bounded offsets and writes its own cell -- which blocks, with a stash (its rows
// hold earlier sums: read before written; block_stencil says why a stash).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "ir/ir.h"

namespace vkad::codegen {

// The minimum maxComputeSharedMemorySize Vulkan guarantees.
inline constexpr uint32_t kStencilSharedBytes = 16384;
// The most launches one blocked dispatch runs.
inline constexpr uint32_t kMaxStencilSteps = 8;

// One launch of the run, as its first repetition launched it.
struct StencilLaunch {
  const Kernel* kernel = nullptr;
  // Per parameter: the identity of the array bound to it (nonzero), 0 for a scalar.
  std::vector<uint64_t> arrays;
  // Per parameter: what an i32 scalar argument gains per launch of the run (0 otherwise).
  std::vector<int64_t> step;
  // Per dimension of the task (one for a 1-d task): its evaluated range [begin, end).
  std::vector<std::pair<int64_t, int64_t>> box;
  // Per parameter: the bound array's extents where known (a `shape` statement then reads a
  // constant), else empty.
  std::vector<std::vector<int64_t>> shapes;
  // Per parameter: the run's first launch's integer scalar argument (0 for the others).
  std::vector<int64_t> first;
  // The fewest tiles (workgroups) a blocked dispatch may have: each runs its K steps one after
  // another (the graph compiler: 1, VKAD_GRAPH_BLOCK_MIN_TILES sets another).
  int64_t min_tiles = 1;
  // The most invocations a blocked workgroup may have (the device's; at least a tile's 256).
  int64_t max_group = 256;
};

// How many launches of `l`'s run one blocked dispatch should take: 0 where they do not block
// (`why` says why when given).
uint32_t stencil_steps(const StencilLaunch& l, uint32_t shared_bytes = kStencilSharedBytes,
                       std::string* why = nullptr);

// The kernel that runs `steps` consecutive launches of `l`'s run (the scalars of its first).
// Its parameters are the kernel's (gradient flags cleared), and where the launches read rows
// they also write before writing them at every cell (a gathered adjoint adding into rows that
// hold earlier sums), one more: the stash, a rank-1 array of `stash_elements` elements of
// `stash_type` that the `prologue` (same parameters) fills before the run's first dispatch.
// Why a stash: a tile reads those rows around itself while the neighbouring tiles write
// their cells of them back in the same dispatch -- a race -- so each dispatch reads them from
// the stash half the previous dispatch (or the prologue) wrote and writes the next dispatch's
// rows into the other half, the two halves alternating by the dispatch's place in the run.
// Errors: the launches do not block.
struct BlockedStencil {
  Kernel kernel;
  std::optional<Kernel> prologue;
  int64_t stash_elements = 0;
  DType stash_type = DType::kF32;
};
Result<BlockedStencil> block_stencil(const StencilLaunch& l, uint32_t steps,
                                     const std::string& name);

// `k` with every atomic add into an array it also reads (at other rows) turned into a gather,
// for launches over `box` (see the file comment); `k` itself where it has none. `step` and
// `first` (StencilLaunch's), where given, fix the scalars that do not step at their first
// values (a row k + 10 t with t fixed is k + a constant): the result is then for that run only.
// Errors: such adds whose targets are not bounded offsets of the thread's cell inside the box.
Result<Kernel> gather_form(const Kernel& k, const std::vector<std::pair<int64_t, int64_t>>& box,
                           const std::vector<std::vector<int64_t>>& shapes = {},
                           const std::vector<int64_t>* step = nullptr,
                           const std::vector<int64_t>* first = nullptr);

}  // namespace vkad::codegen
