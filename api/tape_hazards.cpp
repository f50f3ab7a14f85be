#include "api/tape_hazards.h"

#include <optional>

namespace vkad {

namespace {

using codegen::ArrayAccess;

std::string array_label(const Session& s, NdArrayHandle a) {
  Result<std::string> name = s.name(a);
  const std::string id = runtime::handle_string(a.id);
  if (!name.ok() || name->empty()) return "ndarray " + id;
  return "ndarray '" + *name + "' (" + id + ")";
}

std::string launch_label(uint32_t index, const codegen::KernelAccess& k) {
  return "launch " + std::to_string(index) + " ('" + k.kernel + "')";
}

}  // namespace

TapeHazards::By TapeHazards::overlap(const Touched& t, const int64_t* rows, size_t rank,
                                     uint32_t* axis) const {
  *axis = UINT32_MAX;
  if (t.first.launch == kNone) return {};
  // Disjoint when one axis has the write's row known, every earlier touch's row known there
  // too, and none of them equal.
  for (size_t a = 0; a < rank && a < t.axes.size(); ++a) {
    if (rows[a] == kUnknownRow) continue;
    const AxisRows& ar = t.axes[a];
    if (ar.unknown.launch == kNone && !ar.find(static_cast<uint32_t>(rows[a]))) return {};
  }
  // They may overlap: name a witness, at a known row where there is one.
  for (size_t a = 0; a < rank && a < t.axes.size(); ++a) {
    if (rows[a] == kUnknownRow) continue;
    if (const By* by = t.axes[a].find(static_cast<uint32_t>(rows[a]))) {
      *axis = static_cast<uint32_t>(a);
      return *by;
    }
  }
  for (size_t a = 0; a < rank && a < t.axes.size(); ++a) {
    if (rows[a] != kUnknownRow && t.axes[a].unknown.launch != kNone) return t.axes[a].unknown;
  }
  return t.first;
}

void TapeHazards::add(Touched& t, const int64_t* rows, size_t rank, By by) {
  if (t.first.launch == kNone) t.first = by;
  if (t.axes.size() < rank) t.axes.resize(rank);
  for (size_t a = 0; a < rank; ++a) {
    AxisRows& ar = t.axes[a];
    if (rows[a] == kUnknownRow) {
      if (ar.unknown.launch == kNone) ar.unknown = by;
    } else {
      ar.add(static_cast<uint32_t>(rows[a]), by);
    }
  }
}

Status TapeHazards::check(const Session& session,
                          std::shared_ptr<const codegen::KernelAccess> access,
                          std::span<const Arg> args) {
  auto extent = [&](NdArrayHandle a, uint32_t d) -> std::optional<uint32_t> {
    Result<uint32_t> e = session.extent(a, d);  // no shape copied
    if (!e.ok()) return std::nullopt;
    return *e;
  };
  return check_with(extent, &session, std::move(access), args);
}

bool TapeHazards::accepts(const Extent& extent, std::shared_ptr<const codegen::KernelAccess> access,
                          std::span<const Arg> args) {
  return check_with(extent, nullptr, std::move(access), args).ok();
}

Status TapeHazards::check_with(const Extent& extent_of, const Session* session,
                               std::shared_ptr<const codegen::KernelAccess> access,
                               std::span<const Arg> args) {
  pending_ = nullptr;
  if (!access) {
    return make_error(ErrorCode::kInvalidArgument,
                      "tape.launch: the forward kernel is not one this session's differentiate() "
                      "made (or it was released), so the tape cannot check what it overwrites");
  }
  const codegen::KernelAccess& k = *access;
  evaluate(extent_of, k, args);
  for (Evaluated& e : evaluated_) {
    const codegen::ParamAccess& p = k.params[e.param_slot];
    const ArrayAccess& a = p.accesses[e.access];
    auto rec = arrays_.find(args[p.param].array.id);
    if (rec == arrays_.end()) continue;
    e.rec = &rec->second;
    if (a.kind == ArrayAccess::Kind::kRead) continue;
    const int64_t* rows = rows_.data() + e.row_begin;
    uint32_t axis = UINT32_MAX;
    By earlier = overlap(rec->second.read, rows, a.rows.size(), &axis);
    if (earlier.launch != kNone) {
      return make_error(ErrorCode::kInvalidArgument,
                        session ? conflict(*session, k, args, e, earlier, axis, false) : "");
    }
    if (a.kind == ArrayAccess::Kind::kOverwrite) {
      earlier = overlap(rec->second.written, rows, a.rows.size(), &axis);
      if (earlier.launch != kNone) {
        return make_error(ErrorCode::kInvalidArgument,
                          session ? conflict(*session, k, args, e, earlier, axis, true) : "");
      }
    }
  }
  if (const Evaluated* aliased = alias(k, args)) {
    return make_error(ErrorCode::kInvalidArgument,
                      session ? alias_conflict(*session, k, args, aliased[0], aliased[1]) : "");
  }
  pending_ = std::move(access);
  pending_args_.assign(args.begin(), args.end());
  return {};
}

Status TapeHazards::check_aliasing(const Session& session, const codegen::KernelAccess& access,
                                   std::span<const Arg> args) {
  TapeHazards scratch;  // evaluates without touching this recording's pending check
  auto extent = [&](NdArrayHandle a, uint32_t d) -> std::optional<uint32_t> {
    Result<uint32_t> e = session.extent(a, d);
    if (!e.ok()) return std::nullopt;
    return *e;
  };
  scratch.evaluate(extent, access, args);
  if (const Evaluated* aliased = scratch.alias(access, args)) {
    return make_error(ErrorCode::kInvalidArgument,
                      scratch.alias_conflict(session, access, args, aliased[0], aliased[1]));
  }
  return {};
}

void TapeHazards::evaluate(const Extent& extent_of, const codegen::KernelAccess& k,
                           std::span<const Arg> args) {
  const codegen::UniformInputs inputs{
      [&](uint32_t p) -> int64_t { return p < args.size() ? args[p].i : 0; },
      [&](uint32_t p, uint32_t d) -> std::optional<uint32_t> {
        if (p >= args.size() || args[p].kind != runtime::ParamKind::kNdArray) return std::nullopt;
        return extent_of(args[p].array, d);
      }};
  expr_values_.resize(k.exprs.size());
  for (size_t i = 0; i < k.exprs.size(); ++i) {
    std::optional<uint32_t> v = codegen::evaluate(k.exprs[i], inputs);
    expr_values_[i] = v ? static_cast<int64_t>(*v) : kUnknownRow;
  }
  evaluated_.clear();
  rows_.clear();
  for (uint32_t slot = 0; slot < k.params.size(); ++slot) {
    const codegen::ParamAccess& p = k.params[slot];
    if (p.param >= args.size() || args[p.param].kind != runtime::ParamKind::kNdArray) continue;
    for (uint32_t ai = 0; ai < p.accesses.size(); ++ai) {
      const ArrayAccess& a = p.accesses[ai];
      evaluated_.push_back({slot, ai, static_cast<uint32_t>(rows_.size()), nullptr});
      for (uint32_t r : a.rows) {
        rows_.push_back(r == ArrayAccess::kNotUniform ? kUnknownRow : expr_values_[r]);
      }
    }
  }
}

// Two parameters bound to one array are one array to the adjoint too, but make_adjoint proved
// its rules (disjoint_access.h) for distinct parameters: the adjoint replays the forward's loads
// after the forward stored through the other parameter, so `b[i] = sin(a[i])` launched with
// a = b = x reads sin(x) where it needs x. Same rule as between launches: a write of one
// parameter may not meet a read of the other, nor an overwrite a differentiated write.
const TapeHazards::Evaluated* TapeHazards::alias(const codegen::KernelAccess& k,
                                                 std::span<const Arg> args) {
  alias_pair_[0] = alias_pair_[1] = {};
  // Almost every launch binds distinct arrays: a pass over the parameter pairs (a handful)
  // settles it before any access is compared.
  bool shared = false;
  for (size_t i = 0; i < k.params.size() && !shared; ++i) {
    const uint32_t pi = k.params[i].param;
    if (pi >= args.size() || args[pi].kind != runtime::ParamKind::kNdArray) continue;
    for (size_t j = i + 1; j < k.params.size() && !shared; ++j) {
      const uint32_t pj = k.params[j].param;
      shared = pj < args.size() && args[pj].kind == runtime::ParamKind::kNdArray &&
               args[pj].array.id == args[pi].array.id;
    }
  }
  if (!shared) return nullptr;
  for (const Evaluated& w : evaluated_) {
    const codegen::ParamAccess& wp = k.params[w.param_slot];
    const ArrayAccess& wa = wp.accesses[w.access];
    if (wa.kind == ArrayAccess::Kind::kRead) continue;
    for (const Evaluated& o : evaluated_) {
      const codegen::ParamAccess& op = k.params[o.param_slot];
      if (op.param == wp.param || args[op.param].array.id != args[wp.param].array.id) continue;
      const ArrayAccess& oa = op.accesses[o.access];
      const bool conflicts = oa.kind == ArrayAccess::Kind::kRead ||
                             (wa.kind == ArrayAccess::Kind::kOverwrite && op.needs_grad);
      if (!conflicts) continue;
      // Disjoint when an axis has both rows known and different (row f read, row f + 1 written).
      bool disjoint = false;
      for (size_t d = 0; d < wa.rows.size() && d < oa.rows.size(); ++d) {
        const int64_t x = rows_[w.row_begin + d], y = rows_[o.row_begin + d];
        disjoint = disjoint || (x != kUnknownRow && y != kUnknownRow && x != y);
      }
      if (disjoint) continue;
      alias_pair_[0] = w;
      alias_pair_[1] = o;
      return alias_pair_;
    }
  }
  return nullptr;
}

std::string TapeHazards::alias_conflict(const Session& session, const codegen::KernelAccess& k,
                                        std::span<const Arg> args, const Evaluated& w,
                                        const Evaluated& o) const {
  const codegen::ParamAccess& wp = k.params[w.param_slot];
  const codegen::ParamAccess& op = k.params[o.param_slot];
  const ArrayAccess& wa = wp.accesses[w.access];
  const bool read = op.accesses[o.access].kind == ArrayAccess::Kind::kRead;
  const uint32_t now = static_cast<uint32_t>(kernels_.size());
  const char* verb = wa.kind == ArrayAccess::Kind::kAccumulate ? "atomically adds to" : "writes";
  std::string out = "tape.launch: " + launch_label(now, k) + " passes " +
                    array_label(session, args[wp.param].array) + " as both parameter '" +
                    k.names[wp.param] + "', which it " + verb + ", and parameter '" +
                    k.names[op.param] + "', which it " +
                    (read ? "reads" : "writes, differentiated") + ", at rows that may overlap. ";
  out += read ? "The adjoint replays the kernel's loads after its stores, so it would read the "
                "values the launch wrote where it needs those it read"
              : "Its adjoint would hand the gradient of one parameter's values to the other's "
                "inputs too";
  out += ": the gradients would be wrong. Pass a separate array for '" + k.names[wp.param] +
         "' (an output beside the input, e.g. Session.empty_like, or a time axis written at row "
         "f + 1 and read at row f); docs/tape.md, \"Tapes and memory\". Nothing was launched or "
         "recorded";
  return out;
}

void TapeHazards::record() {
  if (!pending_) return;
  const codegen::KernelAccess& k = *pending_;
  const uint32_t launch = static_cast<uint32_t>(kernels_.size());
  for (const Evaluated& e : evaluated_) {
    const codegen::ParamAccess& p = k.params[e.param_slot];
    const ArrayAccess& a = p.accesses[e.access];
    if (a.kind != ArrayAccess::Kind::kRead && !p.needs_grad) continue;
    // check() found it, or it is new (a node's address stays put as others are added).
    ArrayRecord& rec = e.rec != nullptr ? *e.rec : arrays_[pending_args_[p.param].array.id];
    add(a.kind == ArrayAccess::Kind::kRead ? rec.read : rec.written, rows_.data() + e.row_begin,
        a.rows.size(), By{launch, p.param});
  }
  kernels_.push_back(std::move(pending_));
  pending_ = nullptr;
}

void TapeHazards::reset() {
  arrays_.clear();
  kernels_.clear();
  pending_ = nullptr;
}

std::string TapeHazards::conflict(const Session& session, const codegen::KernelAccess& k,
                                  std::span<const Arg> args, const Evaluated& e, By earlier,
                                  uint32_t axis, bool overwrite_of_write) const {
  const codegen::ParamAccess& p = k.params[e.param_slot];
  const ArrayAccess& a = p.accesses[e.access];
  const codegen::KernelAccess& ek = *kernels_[earlier.launch];
  const uint32_t now = static_cast<uint32_t>(kernels_.size());
  const char* verb = a.kind == ArrayAccess::Kind::kAccumulate ? "atomically adds to"
                     : overwrite_of_write                     ? "overwrites"
                                                              : "writes";
  // Where the write is: the witness axis's row, else the first row known, else none.
  uint32_t shown = axis;
  for (uint32_t i = 0; shown == UINT32_MAX && i < a.rows.size(); ++i) {
    if (rows_[e.row_begin + i] != kUnknownRow) shown = i;
  }
  const std::string thread_rows = " at rows that depend on the thread, a loop or data";
  const std::string where = shown == UINT32_MAX
                                ? thread_rows
                                : " at row " + std::to_string(rows_[e.row_begin + shown]) +
                                      " of axis " + std::to_string(shown);
  const std::string earlier_where = axis != UINT32_MAX    ? " there"
                                    : shown != UINT32_MAX ? thread_rows
                                                          : "";
  std::string out = "tape.launch: " + launch_label(now, k) + " " + verb + " " +
                    array_label(session, args[p.param].array) + " (parameter '" + k.names[p.param] +
                    "')" + where + ", which " + launch_label(earlier.launch, ek) +
                    (overwrite_of_write ? " wrote, differentiated," : " read") + earlier_where +
                    " (parameter '" + ek.names[earlier.param] + "'). ";
  out += overwrite_of_write
             ? "Backward would hand the gradient of the new values to launch " +
                   std::to_string(earlier.launch) + "'s adjoint too"
             : "Backward runs launch " + std::to_string(earlier.launch) +
                   "'s adjoint on the arrays as they are then, so it would read the new values";
  out +=
      ": its gradients would be wrong. Keep one row or one array per step (an array with a time "
      "axis, read at row f and written at row f + 1, or one array per step), give the tape a "
      "memory budget (Tape::set_memory_budget, Python's t.memory_budget: it checkpoints and "
      "takes reused arrays), or differentiate the steps before the overwrite in a recording of "
      "their own; docs/tape.md, \"Tapes and memory\". Nothing was launched or recorded";
  return out;
}

}  // namespace vkad
