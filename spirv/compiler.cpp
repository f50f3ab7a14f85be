#include "spirv/compiler.h"

#include <spirv-tools/libspirv.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <spirv-tools/optimizer.hpp>
#include <unordered_map>

#include "abi/compiled_kernel_io.h"
#include "abi/print_records.h"
#include "abi/spirv_tools.h"
#include "base/cache_file.h"
#include "base/log.h"
#include "ir/loop_passes.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "ir/walk.h"
#include "spirv/launch_spec.h"
#include "spirv/spirv_emitter.h"
#include "spirv/spirv_outline.h"

namespace vkad::codegen {

namespace {

// Whether any statement of `b` satisfies `pred`.
template <typename Pred>
bool any_stmt(const Block& b, Pred pred) {
  bool found = false;
  for_each_stmt(b, [&](const Stmt& s) { found = found || pred(s); });
  return found;
}

// VKAD_DUMP_SPIRV=<dir> (docs/debugging.md, "The SPIR-V a kernel runs"): each compiled task's
// module, as the driver gets it, into <dir>/<kernel>.<task>.<16 hex digits of its FNV-1a>.spv,
// so that two compiles of one task with different options or targets keep both files. Best
// effort: a directory that does not exist or cannot be written is reported once a process on
// the log and the compile goes on (a debugging aid must not make a kernel fail).
void dump_spirv(const Kernel& k, size_t task, const std::vector<uint32_t>& words) {
  const char* dir = std::getenv("VKAD_DUMP_SPIRV");
  if (dir == nullptr || *dir == '\0') return;
  auto safe = [](std::string n) {
    for (char& c : n) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-' || c == '.';
      if (!ok) c = '_';
    }
    return n;
  };
  const std::string_view bytes(reinterpret_cast<const char*>(words.data()), words.size() * 4);
  const std::string path = std::string(dir) + "/" + safe(k.name) + "." + safe(k.tasks[task].name) +
                           "." + hex16(fnv1a64(bytes)) + ".spv";
  FILE* f = std::fopen(path.c_str(), "wb");
  const bool ok = f != nullptr && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (f != nullptr) std::fclose(f);
  static std::atomic<bool> warned{false};  // compiles run on several threads
  if (!ok && !warned.exchange(true)) {
    log(LogLevel::kWarning, "VKAD_DUMP_SPIRV: cannot write '" + path + "'; SPIR-V is not dumped");
  }
}

bool writes(const Block& b, uint32_t param) {
  return any_stmt(b, [param](const Stmt& s) {
    return (s.op == Op::kStore || s.op == Op::kAtomicAdd || s.op == Op::kAtomicMax) &&
           s.param == param;
  });
}

bool has_loops(const Block& b) {
  return any_stmt(b, [](const Stmt& s) { return s.op == Op::kFor || s.op == Op::kWhile; });
}

bool uses_adjoint(const Block& b, ValueId stack) {
  return any_stmt(b, [stack](const Stmt& s) {
    return (s.op == Op::kStackTopAdj || s.op == Op::kStackAccAdj) && s.args[0] == stack;
  });
}

// The task's adstacks in statement order (adjoint uses may sit outside the block of the
// allocation, so they are looked for in the whole body).
void collect_stacks(const Kernel& k, const Block& body, std::vector<adstack::StackDesc>* out) {
  for_each_stmt(body, [&](const Stmt& s) {
    if (s.op != Op::kStackAlloc) return;
    adstack::StackDesc d;
    // The loop whose iterations it saves, where the IR says (Stmt::loc): its trip bound is
    // what an overflow asks to raise.
    const std::string loop = s.loc ? " of the loop @\"" + source_location(s.loc) + "\"" : "";
    d.name = "%" + std::to_string(s.result) + " (" + abi::dtype_name(s.type) + ", capacity " +
             print_size(k, s.cap) + ")" + loop;
    d.heap = stack_heap(s.type);
    d.capacity = s.cap;
    d.adjoint = uses_adjoint(body, s.result);
    out->push_back(std::move(d));
  });
}

// Each value's type in `b` (results; a loop's index is i32).
void value_types(const Block& b, std::unordered_map<ValueId, DType>* out) {
  for_each_stmt(b, [&](const Stmt& s) {
    if (s.result != kNoValue) (*out)[s.result] = s.type;
  });
}

// The print and assert statements of each task (CompiledTask::print_sites) and the kernel's
// print area, before any task is emitted: the emitter writes records at print_offset().
Status describe_prints(const Kernel& k, const CompileOptions& options, abi::CompiledKernel* out) {
  bool any = false, prints = false;
  for (size_t i = 0; i < k.tasks.size(); ++i) {
    const Task& t = k.tasks[i];
    std::unordered_map<ValueId, DType> types;
    for (ValueId ix : task_indices(t)) types[ix] = DType::kI32;
    value_types(t.body, &types);
    for (const Stmt* s : print_sites(k, i)) {
      abi::PrintSite p;
      p.is_assert = s->op == Op::kAssert;
      p.format = source_location(static_cast<uint32_t>(s->iimm));
      for (size_t a = p.is_assert ? 1 : 0; a < s->args.size(); ++a)
        p.values.push_back(types.at(s->args[a]));
      p.stmt = print_stmt(k, *s);
      p.dims = static_cast<uint32_t>(task_indices(t).size());
      prints = prints || !p.is_assert;
      out->tasks[i].print_sites.push_back(std::move(p));
      any = true;
    }
  }
  if (!any) return {};
  const uint32_t bytes = options.print_buffer_bytes;
  if (bytes % 16 != 0 || bytes < abi::kMinPrintBytes || bytes > abi::kMaxPrintBytes) {
    return make_error(ErrorCode::kInvalidArgument,
                      "kernel '" + k.name + "': CompileOptions::print_buffer_bytes is " +
                          std::to_string(bytes) + "; it must be a multiple of 16 from " +
                          std::to_string(abi::kMinPrintBytes) + " to " +
                          std::to_string(abi::kMaxPrintBytes));
  }
  // Asserts alone record only where they fail, and the first failure is what the error
  // reports: the smallest area holds it. A graph uploads and reads back every launch's args at
  // each replay, so an area per launch is traffic per replay (diffmpm with its --debug asserts
  // in a 16 KiB area: 1.52x its iteration on the H200; docs/debugging.md).
  out->print_bytes = prints ? bytes : abi::kMinPrintBytes;
  return {};
}

}  // namespace

Result<std::vector<uint32_t>> optimize_spirv(const std::vector<uint32_t>& words) {
  spvtools::Optimizer opt(SPV_ENV_VULKAN_1_2);
  std::string log;
  opt.SetMessageConsumer([&log](spv_message_level_t, const char*, const spv_position_t&,
                                const char* m) { log += std::string(m) + "\n"; });
  opt.RegisterPerformancePasses();
  std::vector<uint32_t> out;
  if (!opt.Run(words.data(), words.size(), &out)) {
    return make_error(ErrorCode::kInternal, "spirv-opt failed:\n" + log);
  }
  return out;
}

Result<abi::CompiledKernel> compile(const Kernel& k, const Target& target,
                                    const CompileOptions& options) {
  VKAD_TRY(verify(k, target));
  abi::CompiledKernel out;
  out.name = k.name;
  for (uint32_t i = 0; i < k.params.size(); ++i) {
    const Param& p = k.params[i];
    bool w = false;
    for (const Task& t : k.tasks) w = w || writes(t.body, i);
    out.params.push_back({p.name, p.kind, p.dtype, p.rank, w});
  }
  for (const Task& t : k.tasks) {
    abi::CompiledTask ct;
    ct.name = t.name;
    ct.begin = t.begin;
    ct.end = t.end;
    for (const TaskDim& dim : t.dims) {
      ct.dim_begin.push_back(dim.begin);
      ct.dim_end.push_back(dim.end);
    }
    ct.serial = t.serial;
    // Serial tasks run on one invocation. Tasks with serial loops (long per-thread work,
    // adstack rows) get smaller groups than straight-line ones.
    ct.local_size = t.local_size        ? t.local_size
                    : t.serial          ? 1
                    : has_loops(t.body) ? 64
                                        : options.default_local_size;
    ct.local_size = std::min(ct.local_size, target.max_local_size);
    collect_stacks(k, t.body, &ct.adstacks);
    // The emitter lowers a float atomic add to a compare-and-swap loop under these conditions.
    LoopPassBound passes = loop_pass_bound(k, t, cas_float_atomics(options, target, false),
                                           cas_float_atomics(options, target, true));
    ct.loop_passes = std::move(passes.per_iteration);
    ct.loop_passes_idle = passes.idle;
    out.tasks.push_back(std::move(ct));
  }
  for (size_t i = 0; i < k.tasks.size(); ++i)
    out.tasks[i].spec_words = launch_spec_words(k, i, out, options.specialize_shapes);
  VKAD_TRY(describe_prints(k, options, &out));
  for (size_t i = 0; i < k.tasks.size(); ++i) {
    EmitOptions eo;
    eo.native_float_atomics = options.native_float_atomics;
    eo.bounds_checks = options.bounds_checks;
    eo.local_size = out.tasks[i].local_size;
    eo.unroll = std::max(options.unroll, 1u);
    eo.check_finite = options.check_finite;
    eo.read_only_buffers = options.read_only_buffers;
    if (options.check_finite) {
      for (const Stmt* s : finite_check_sites(k, i)) {
        out.tasks[i].finite_sites.push_back(print_stmt(k, *s));
      }
    }
    if (options.bounds_checks) {
      for (const Stmt* s : access_sites(k, i)) {
        out.tasks[i].access_sites.push_back(print_stmt(k, *s));
      }
    }
    std::vector<uint32_t> words =
        outline_deep_loops(emit_task(k, i, out, target, eo), kOutlineLoopDepth);
    Status valid = validate_spirv(words);
    if (!valid.ok()) {
      return make_error(ErrorCode::kInternal, "codegen bug: kernel '" + k.name + "', task '" +
                                                  k.tasks[i].name + "' emitted invalid SPIR-V. " +
                                                  valid.message());
    }
    if (options.optimize) {
      VKAD_ASSIGN_OR_RETURN(words, optimize_spirv(words));
      VKAD_TRY(validate_spirv(words));
    }
    dump_spirv(k, i, words);
    out.tasks[i].spirv = std::move(words);
  }
  return out;
}

std::string compile_key(const Kernel& k, const Target& target, const CompileOptions& o) {
  // The text form is the kernel's content; target and options change the code too.
  std::string key = print(k);
  key += "|" + target.device_name + (target.float64 ? "d" : "") + (target.int64 ? "l" : "") +
         (target.atomic_float32_add ? "a" : "") + (target.atomic_float64_add ? "A" : "") +
         (target.atomic_int64 ? "I" : "") + (target.subgroup_arithmetic ? "s" : "") +
         (target.subgroup_shuffle ? "r" : "") + std::to_string(target.max_local_size) +
         adstack::layout_name(target.adstack_layout) + (target.preserve_nan_inf_f32 ? "n" : "") +
         (target.preserve_nan_inf_f64 ? "N" : "") + "|" + (o.optimize ? "O" : "") +
         (o.native_float_atomics ? "N" : "") + (o.bounds_checks ? "B" : "") +
         std::to_string(o.default_local_size) + "u" + std::to_string(o.unroll) +
         (o.specialize_shapes ? "S" : "") + (o.check_finite ? "F" : "") +
         (o.read_only_buffers ? "R" : "") + "p" + std::to_string(o.print_buffer_bytes);
  key += "|vkad-compiler ";
  key += compiler_fingerprint();
  key += " spirv-tools ";
  key += spvSoftwareVersionString();
  return key;
}

namespace {

// The disk layer's payload: the whole key (so a 64-bit hash match of the file name and header
// is never taken as proof), then the serialized kernel.
std::string disk_payload(const std::string& key, const std::string& kernel) {
  std::string p;
  const uint64_t n = key.size();
  p.append(reinterpret_cast<const char*>(&n), sizeof n);
  p += key;
  p += kernel;
  return p;
}

// The kernel in `payload` if it was written for `key`.
std::optional<abi::CompiledKernel> from_disk_payload(const std::string& key,
                                                     std::string_view payload) {
  uint64_t n = 0;
  if (payload.size() < sizeof n) return std::nullopt;
  std::memcpy(&n, payload.data(), sizeof n);
  payload.remove_prefix(sizeof n);
  if (n != key.size() || payload.substr(0, n) != key) return std::nullopt;
  Result<abi::CompiledKernel> k = abi::deserialize_compiled_kernel(payload.substr(n));
  if (!k.ok()) return std::nullopt;
  return std::move(k).value();
}

}  // namespace

Result<std::shared_ptr<const abi::CompiledKernel>> CompileCache::compile(const Kernel& k,
                                                                         const Target& target,
                                                                         const CompileOptions& o) {
  // print() recurses, so the nesting limit is checked first (compile() verifies the rest).
  VKAD_TRY(check_nesting(k));
  std::string key = compile_key(k, target, o);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      ++hits_;
      return it->second;
    }
  }
  const std::string file = disk_dir_.empty() ? "" : cache_file_name("kernel", key);
  bool rebuilt = false;
  if (!disk_dir_.empty()) {
    CacheFile f = read_cache_file(disk_dir_, file, CacheKind::kCompiledKernel, key);
    if (f.outcome == CacheRead::kHit) {
      std::optional<abi::CompiledKernel> ck = from_disk_payload(key, f.payload);
      // A checksum is no proof that the file is what we wrote (an edit can fix it up): every
      // module read back passes the validation gate again, so a damaged entry is rebuilt here
      // rather than refused at registration in every later process.
      Status valid = ck ? Status{} : make_error(ErrorCode::kInternal, "undecodable kernel");
      for (size_t i = 0; ck && valid.ok() && i < ck->tasks.size(); ++i) {
        valid = abi::validate_spirv_once(ck->tasks[i].spirv);
      }
      if (valid.ok()) {
        auto ptr = std::make_shared<const abi::CompiledKernel>(std::move(*ck));
        std::lock_guard<std::mutex> lock(mu_);
        ++disk_.hits;
        auto [it, added] = entries_.emplace(key, ptr);
        if (added) from_disk_.emplace(ptr.get(), FromDisk{std::move(key), target, o});
        return it->second;
      }
      // Removed before the rebuild's write, so a write that fails leaves no bad entry behind.
      ::unlink((disk_dir_ + "/" + file).c_str());
      const std::string why = valid.message().substr(0, valid.message().find('\n'));
      log(LogLevel::kWarning, "disk cache: '" + disk_dir_ + "/" + file + "' of kernel '" + k.name +
                                  "' is unusable (" + why + "); removed, compiling again");
    }
    rebuilt = f.outcome != CacheRead::kMissing;
  }
  VKAD_ASSIGN_OR_RETURN(abi::CompiledKernel ck, codegen::compile(k, target, o));
  const bool write_failed = !disk_dir_.empty() && !write_entry(key, file, ck);
  auto ptr = std::make_shared<const abi::CompiledKernel>(std::move(ck));
  std::lock_guard<std::mutex> lock(mu_);
  ++misses_;
  if (!disk_dir_.empty()) {
    ++disk_.misses;
    disk_.rebuilt += rebuilt;
    disk_.write_errors += write_failed;
  }
  return entries_.emplace(std::move(key), ptr).first->second;
}

bool CompileCache::write_entry(const std::string& key, const std::string& file,
                               const abi::CompiledKernel& ck) {
  Result<std::string> bytes = abi::serialize_compiled_kernel(ck);
  return bytes.ok() && write_cache_file(disk_dir_, file, CacheKind::kCompiledKernel, key,
                                        disk_payload(key, *bytes))
                           .ok();
}

Result<std::shared_ptr<const abi::CompiledKernel>> CompileCache::rebuild(
    const Kernel& k, const abi::CompiledKernel& bad) {
  FromDisk from;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = from_disk_.find(&bad);
    if (it == from_disk_.end()) return std::shared_ptr<const abi::CompiledKernel>();
    from = std::move(it->second);
    from_disk_.erase(it);
    entries_.erase(from.key);
  }
  const std::string file = cache_file_name("kernel", from.key);
  ::unlink((disk_dir_ + "/" + file).c_str());
  log(LogLevel::kWarning, "disk cache: '" + disk_dir_ + "/" + file + "' of kernel '" + k.name +
                              "' was refused by the runtime; removed, compiling again");
  VKAD_ASSIGN_OR_RETURN(abi::CompiledKernel ck, codegen::compile(k, from.target, from.options));
  const bool write_failed = !write_entry(from.key, file, ck);
  auto ptr = std::make_shared<const abi::CompiledKernel>(std::move(ck));
  std::lock_guard<std::mutex> lock(mu_);
  ++misses_;
  ++disk_.misses;
  ++disk_.rebuilt;
  disk_.hits -= disk_.hits > 0;  // the read that gave `bad` was no hit after all
  disk_.write_errors += write_failed;
  return entries_.insert_or_assign(std::move(from.key), ptr).first->second;
}

CompileCache::DiskCounters CompileCache::disk() const {
  std::lock_guard<std::mutex> lock(mu_);
  return disk_;
}

uint64_t CompileCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

uint64_t CompileCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

size_t CompileCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace vkad::codegen
