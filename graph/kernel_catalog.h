// The kernels a session's graph passes may see, by kernel handle id: each kernel's IR, its access
// summary (ir/launch_access.h), whether it has adstacks, and the facts the passes derive from
// its IR on first use (fusible, may it be gather recompute's producer, loops in its first task,
// the launch-uniform values it indexes with). One table: a kernel is added and dropped in one
// place, and a pass asks one object for everything it knows of a kernel.
//
// Not thread-safe, and not meant to be: it belongs to whoever runs a graph rework -- the
// session's thread, or a background rework's worker while the session's thread stays out of it
// (CompiledGraphs::join before anything that adds or drops a kernel). What a capture on the
// session's thread reads while a background rework runs (Session::CaptureAccess) is kept apart,
// outside this table, for that reason.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ir/ir.h"
#include "ir/launch_access.h"

namespace vkad {

class KernelCatalog {
 public:
  using IndexExprs = std::vector<std::pair<codegen::ValueId, codegen::UniformExpr>>;

  // A kernel with its IR: fusion, gather recompute and step-loop rolling may rewrite it.
  void add(uint64_t id, const codegen::Kernel& kernel, bool adstack);
  // A kernel known only by what it accesses (a rework's kernel kept without IR: later reworks
  // schedule it but do not rewrite it again).
  void add_access(uint64_t id, const codegen::Kernel& kernel, bool adstack);
  void drop(uint64_t id);

  // Its IR; null where the kernel is unknown or kept without IR.
  const std::shared_ptr<const codegen::Kernel>& ir(uint64_t id) const;
  // Its IR where launch fusion may merge it (graph/launch_fusion.h, fusible()), else null.
  const std::shared_ptr<const codegen::Kernel>& fusible_ir(uint64_t id) const;
  // Its IR where step-loop rolling may take it (graph/resident.h, residable(), decides the
  // rest): a fusible kernel, or one of one serial task (DiffTaichi's kernels of top-level
  // statements, which fusion leaves alone: one invocation owns no element); else null.
  const std::shared_ptr<const codegen::Kernel>& rollable_ir(uint64_t id) const;
  // Its access summary; null where unknown (a capture then fences the kernel's launches).
  const std::shared_ptr<const codegen::KernelAccess>& access(uint64_t id) const;
  bool adstack(uint64_t id) const;

  // Derived from the IR once per kernel (false / empty for a kernel without IR):
  // may it be gather recompute's producer (graph/gather_recompute.h, recompute_producer()),
  // as written or with its ifs converted (graph/if_conversion.h).
  bool recompute_producer(uint64_t id) const;
  // The IR recompute copies of it as a producer (its ifs converted where that makes it one);
  // null where it cannot be one.
  std::shared_ptr<const codegen::Kernel> producer_ir(uint64_t id) const;
  // Never a producer from now on (a recomputed kernel: copies of copies would grow with every
  // step of a chain).
  void refuse_producer(uint64_t id);
  // Whether the first task of its fusible IR has loops.
  bool first_task_loops(uint64_t id) const;
  // The launch-uniform values it indexes arrays with, sorted by value id.
  const IndexExprs& index_exprs(uint64_t id) const;

 private:
  struct Entry {
    std::shared_ptr<const codegen::Kernel> ir;
    std::shared_ptr<const codegen::Kernel> fusible;
    std::shared_ptr<const codegen::Kernel> rollable;
    std::shared_ptr<const codegen::KernelAccess> access;
    bool adstack = false;
    mutable std::optional<bool> producer;
    mutable std::shared_ptr<const codegen::Kernel> producer_ir;  // once producer is known
    mutable std::optional<bool> loops;
    mutable std::optional<IndexExprs> index_exprs;
  };
  const Entry* find(uint64_t id) const;
  std::unordered_map<uint64_t, Entry> entries_;
};

}  // namespace vkad
