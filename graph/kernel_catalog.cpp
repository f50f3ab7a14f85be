#include "graph/kernel_catalog.h"

#include "graph/gather_recompute.h"
#include "graph/graph_rework.h"
#include "graph/if_conversion.h"
#include "graph/launch_fusion.h"

namespace vkad {

void KernelCatalog::add(uint64_t id, const codegen::Kernel& kernel, bool adstack) {
  Entry e;
  e.ir = std::make_shared<const codegen::Kernel>(kernel);
  if (codegen::fusible(kernel)) e.fusible = e.ir;
  // (A range that steps or is too wide for one workgroup's walk is the roll's to refuse.)
  const bool serial = kernel.tasks.size() == 1 && kernel.tasks[0].serial;
  if (e.fusible || serial) e.rollable = e.ir;
  e.access = std::make_shared<const codegen::KernelAccess>(codegen::kernel_access(kernel));
  e.adstack = adstack;
  entries_[id] = std::move(e);
}

void KernelCatalog::add_access(uint64_t id, const codegen::Kernel& kernel, bool adstack) {
  Entry e;
  e.access = std::make_shared<const codegen::KernelAccess>(codegen::kernel_access(kernel));
  e.adstack = adstack;
  entries_[id] = std::move(e);
}

void KernelCatalog::drop(uint64_t id) { entries_.erase(id); }

const KernelCatalog::Entry* KernelCatalog::find(uint64_t id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

const std::shared_ptr<const codegen::Kernel>& KernelCatalog::ir(uint64_t id) const {
  static const std::shared_ptr<const codegen::Kernel> kNone;
  const Entry* e = find(id);
  return e ? e->ir : kNone;
}

const std::shared_ptr<const codegen::Kernel>& KernelCatalog::fusible_ir(uint64_t id) const {
  static const std::shared_ptr<const codegen::Kernel> kNone;
  const Entry* e = find(id);
  return e ? e->fusible : kNone;
}

const std::shared_ptr<const codegen::Kernel>& KernelCatalog::rollable_ir(uint64_t id) const {
  static const std::shared_ptr<const codegen::Kernel> kNone;
  const Entry* e = find(id);
  return e ? e->rollable : kNone;
}

const std::shared_ptr<const codegen::KernelAccess>& KernelCatalog::access(uint64_t id) const {
  static const std::shared_ptr<const codegen::KernelAccess> kNone;
  const Entry* e = find(id);
  return e ? e->access : kNone;
}

bool KernelCatalog::adstack(uint64_t id) const {
  const Entry* e = find(id);
  return e && e->adstack;
}

bool KernelCatalog::recompute_producer(uint64_t id) const {
  const Entry* e = find(id);
  if (!e || !e->ir) return false;
  if (!e->producer) {
    if (codegen::recompute_producer(*e->ir)) {
      e->producer_ir = e->ir;
    } else if (std::optional<codegen::Kernel> c = codegen::if_converted(*e->ir);
               c && codegen::recompute_producer(*c)) {
      e->producer_ir = std::make_shared<const codegen::Kernel>(std::move(*c));
    }
    e->producer = e->producer_ir != nullptr;
  }
  return *e->producer;
}

std::shared_ptr<const codegen::Kernel> KernelCatalog::producer_ir(uint64_t id) const {
  if (!recompute_producer(id)) return nullptr;
  return find(id)->producer_ir;
}

void KernelCatalog::refuse_producer(uint64_t id) {
  auto it = entries_.find(id);
  if (it != entries_.end()) it->second.producer = false;
}

bool KernelCatalog::first_task_loops(uint64_t id) const {
  const Entry* e = find(id);
  if (!e || !e->fusible || e->fusible->tasks.empty()) return false;
  if (!e->loops) e->loops = has_loops(e->fusible->tasks[0].body);
  return *e->loops;
}

const KernelCatalog::IndexExprs& KernelCatalog::index_exprs(uint64_t id) const {
  static const IndexExprs kNone;
  const Entry* e = find(id);
  if (!e || !e->ir) return kNone;
  if (!e->index_exprs) e->index_exprs = codegen::uniform_index_exprs(*e->ir);
  return *e->index_exprs;
}

}  // namespace vkad
