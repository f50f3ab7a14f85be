#include "abi/compiled_kernel_io.h"

#include <cstring>

#include "abi/print_records.h"

namespace vkad::abi {

namespace {

constexpr uint32_t kMagic = 0x4b4b4456;  // "VDKK"
constexpr uint32_t kVersion = 4;         // 2: finite_sites; 3: access_sites; 4: print sites

class Writer {
 public:
  template <typename T>
  void put(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    out_ += s;
  }
  void words(const std::vector<uint32_t>& w) {
    put<uint64_t>(w.size());
    out_.append(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(uint32_t));
  }
  Status size_expr(const adstack::SizeExpr& root) {
    // Pre-order with explicit depth tracking: operands count, then each operand.
    struct Item {
      const adstack::SizeExpr* e;
      uint32_t depth;
    };
    std::vector<Item> work{{&root, 0}};
    while (!work.empty()) {
      Item it = work.back();
      work.pop_back();
      if (it.depth > kMaxSerializedSizeDepth) {
        return make_error(ErrorCode::kInvalidArgument, "size expression nests deeper than " +
                                                           std::to_string(kMaxSerializedSizeDepth));
      }
      const adstack::SizeExpr& e = *it.e;
      put<uint8_t>(static_cast<uint8_t>(e.kind));
      put<int64_t>(e.value);
      put<uint32_t>(e.param);
      put<uint32_t>(e.dim);
      put<uint32_t>(static_cast<uint32_t>(e.operands.size()));
      for (size_t i = e.operands.size(); i-- > 0;) work.push_back({&e.operands[i], it.depth + 1});
    }
    return {};
  }
  void range(const RangeBound& r) {
    put<uint8_t>(static_cast<uint8_t>(r.kind));
    put<int64_t>(r.value);
    put<uint32_t>(r.param);
    put<uint32_t>(r.dim);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool failed() const { return failed_; }
  template <typename T>
  T get() {
    T v{};
    if (in_.size() - pos_ < sizeof(T)) {
      failed_ = true;
      return v;
    }
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // A count of elements of `elem_bytes` each that the remaining bytes can hold.
  uint64_t count(uint64_t elem_bytes) {
    uint64_t n = get<uint64_t>();
    if (failed_ || n > (in_.size() - pos_) / elem_bytes) {
      failed_ = true;
      return 0;
    }
    return n;
  }
  std::string str() {
    uint64_t n = count(1);
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  std::vector<uint32_t> words() {
    uint64_t n = count(sizeof(uint32_t));
    std::vector<uint32_t> w(n);
    if (n) std::memcpy(w.data(), in_.data() + pos_, n * sizeof(uint32_t));
    pos_ += n * sizeof(uint32_t);
    return w;
  }
  template <typename E>
  E enum_at_most(E last) {
    uint8_t v = get<uint8_t>();
    if (v > static_cast<uint8_t>(last)) failed_ = true;
    return static_cast<E>(v);
  }
  adstack::SizeExpr size_expr(uint32_t depth = 0) {
    adstack::SizeExpr e;
    if (depth > kMaxSerializedSizeDepth) {
      failed_ = true;
      return e;
    }
    e.kind = enum_at_most(adstack::SizeExpr::Kind::kNegScalar);
    e.value = get<int64_t>();
    e.param = get<uint32_t>();
    e.dim = get<uint32_t>();
    uint32_t n = get<uint32_t>();
    // Each operand takes at least 21 bytes: a count past that is corrupt.
    if (failed_ || n > (in_.size() - pos_) / 21) {
      failed_ = true;
      return e;
    }
    for (uint32_t i = 0; i < n && !failed_; ++i) e.operands.push_back(size_expr(depth + 1));
    return e;
  }
  RangeBound range() {
    RangeBound r;
    r.kind = enum_at_most(RangeBound::Kind::kArrayDim);
    r.value = get<int64_t>();
    r.param = get<uint32_t>();
    r.dim = get<uint32_t>();
    return r;
  }
  bool at_end() const { return pos_ == in_.size(); }

 private:
  std::string_view in_;
  size_t pos_ = 0;
  bool failed_ = false;
};

}  // namespace

Result<std::string> serialize_compiled_kernel(const CompiledKernel& k) {
  Writer w;
  w.put<uint32_t>(kMagic);
  w.put<uint32_t>(kVersion);
  w.str(k.name);
  w.put<uint64_t>(k.params.size());
  for (const KernelParam& p : k.params) {
    w.str(p.name);
    w.put<uint8_t>(static_cast<uint8_t>(p.kind));
    w.put<uint8_t>(static_cast<uint8_t>(p.dtype));
    w.put<uint32_t>(p.rank);
    w.put<uint8_t>(p.written ? 1 : 0);
  }
  w.put<uint64_t>(k.tasks.size());
  for (const CompiledTask& t : k.tasks) {
    w.str(t.name);
    w.words(t.spirv);
    w.put<uint32_t>(t.local_size);
    w.range(t.begin);
    w.range(t.end);
    w.put<uint8_t>(t.serial ? 1 : 0);
    w.put<uint64_t>(t.dim_begin.size());
    for (size_t d = 0; d < t.dim_begin.size(); ++d) {
      VKAD_TRY(w.size_expr(t.dim_begin[d]));
      VKAD_TRY(w.size_expr(t.dim_end[d]));
    }
    w.put<uint64_t>(t.adstacks.size());
    for (const adstack::StackDesc& s : t.adstacks) {
      w.str(s.name);
      w.put<uint8_t>(static_cast<uint8_t>(s.heap));
      VKAD_TRY(w.size_expr(s.capacity));
      w.put<uint8_t>(s.adjoint ? 1 : 0);
    }
    VKAD_TRY(w.size_expr(t.loop_passes));
    w.put<uint64_t>(t.loop_passes_idle);
    w.words(t.spec_words);
    w.put<uint64_t>(t.finite_sites.size());
    for (const std::string& site : t.finite_sites) w.str(site);
    w.put<uint64_t>(t.access_sites.size());
    for (const std::string& site : t.access_sites) w.str(site);
    w.put<uint64_t>(t.print_sites.size());
    for (const PrintSite& p : t.print_sites) {
      w.str(p.format);
      w.put<uint64_t>(p.values.size());
      for (DType v : p.values) w.put<uint8_t>(static_cast<uint8_t>(v));
      w.str(p.stmt);
      w.put<uint32_t>(p.dims);
      w.put<uint8_t>(p.is_assert ? 1 : 0);
    }
  }
  w.put<uint32_t>(k.print_bytes);
  return w.take();
}

namespace {

Status corrupt(const char* what) {
  return make_error(ErrorCode::kInvalidArgument,
                    std::string("compiled kernel bytes are corrupt: ") + what);
}

// A task's print and assert sites.
Status read_print_sites(Reader& r, CompiledTask& t) {
  const uint64_t prints = r.count(8);
  for (uint64_t s = 0; s < prints && !r.failed(); ++s) {
    PrintSite p;
    p.format = r.str();
    const uint64_t values = r.count(1);
    if (values > kMaxPrintValues) return corrupt("print values");
    for (uint64_t v = 0; v < values && !r.failed(); ++v)
      p.values.push_back(r.enum_at_most(DType::kBool));
    p.stmt = r.str();
    p.dims = r.get<uint32_t>();
    if (p.dims < 1 || p.dims > 3) return corrupt("print dimensions");
    p.is_assert = r.get<uint8_t>() != 0;
    t.print_sites.push_back(std::move(p));
  }
  return {};
}

// One task's description (serialize_compiled_kernel's order).
Status read_task(Reader& r, CompiledTask& t) {
  t.name = r.str();
  t.spirv = r.words();
  t.local_size = r.get<uint32_t>();
  t.begin = r.range();
  t.end = r.range();
  t.serial = r.get<uint8_t>() != 0;
  uint64_t dims = r.count(42);
  if (dims > 3) return corrupt("task dimensions");
  for (uint64_t d = 0; d < dims && !r.failed(); ++d) {
    t.dim_begin.push_back(r.size_expr());
    t.dim_end.push_back(r.size_expr());
  }
  uint64_t stacks = r.count(8);
  if (stacks > kMaxTaskAdstacks) return corrupt("adstack count");
  for (uint64_t s = 0; s < stacks && !r.failed(); ++s) {
    adstack::StackDesc d;
    d.name = r.str();
    d.heap = r.enum_at_most(static_cast<adstack::Heap>(adstack::kHeapCount - 1));
    d.capacity = r.size_expr();
    d.adjoint = r.get<uint8_t>() != 0;
    t.adstacks.push_back(std::move(d));
  }
  t.loop_passes = r.size_expr();
  t.loop_passes_idle = r.get<uint64_t>();
  t.spec_words = r.words();
  const uint64_t sites = r.count(8);  // each site is at least its length
  for (uint64_t s = 0; s < sites && !r.failed(); ++s) t.finite_sites.push_back(r.str());
  const uint64_t accesses = r.count(8);
  for (uint64_t s = 0; s < accesses && !r.failed(); ++s) t.access_sites.push_back(r.str());
  return read_print_sites(r, t);
}

}  // namespace

Result<CompiledKernel> deserialize_compiled_kernel(std::string_view bytes) {
  Reader r(bytes);
  if (r.get<uint32_t>() != kMagic || r.get<uint32_t>() != kVersion || r.failed()) {
    return corrupt("magic or version");
  }
  CompiledKernel k;
  k.name = r.str();
  uint64_t params = r.count(8);
  if (params > kMaxKernelParams) return corrupt("parameter count");
  for (uint64_t i = 0; i < params && !r.failed(); ++i) {
    KernelParam p;
    p.name = r.str();
    p.kind = r.enum_at_most(ParamKind::kNdArray);
    p.dtype = r.enum_at_most(DType::kBool);
    p.rank = r.get<uint32_t>();
    p.written = r.get<uint8_t>() != 0;
    k.params.push_back(std::move(p));
  }
  uint64_t tasks = r.count(8);
  if (tasks > kMaxKernelTasks) return corrupt("task count");
  for (uint64_t i = 0; i < tasks && !r.failed(); ++i) {
    CompiledTask t;
    VKAD_TRY(read_task(r, t));
    k.tasks.push_back(std::move(t));
  }
  k.print_bytes = r.get<uint32_t>();
  if (k.print_bytes % 16 != 0 || k.print_bytes > kMaxPrintBytes ||
      (k.print_bytes != 0 && k.print_bytes < kMinPrintBytes))
    return corrupt("print area size");
  if (r.failed()) return corrupt("truncated or out of range");
  if (!r.at_end()) return corrupt("trailing bytes");
  return k;
}

}  // namespace vkad::abi
