#include "runtime/pipeline_cache.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

namespace vkad::runtime {

namespace {

rhi::ComputePipelineDesc task_desc(const abi::CompiledKernel& k, uint32_t task) {
  rhi::ComputePipelineDesc desc;
  desc.spirv = k.tasks[task].spirv;
  desc.storage_buffer_count = k.binding_count();
  desc.push_constant_bytes = 8;
  desc.name = k.name + "." + k.tasks[task].name;
  return desc;
}

// The description of `task`'s pipeline for `variant`: its tier's and launch constants'
// specialization constants.
rhi::ComputePipelineDesc variant_desc(const abi::CompiledKernel& k, uint32_t task,
                                      const PipelineCache::VariantKey& variant) {
  const abi::CompiledTask& t = k.tasks[task];
  rhi::ComputePipelineDesc desc = task_desc(k, task);
  if (variant.private_tier) {
    desc.name += " (private adstacks)";
    desc.specialization.push_back({adstack::kPrivateTierSpecId, 1});
    for (uint32_t h = 0; h < adstack::kHeapCount; ++h) {
      // Only the heaps the task uses have a length constant (Vulkan would ignore the others).
      if (std::any_of(t.adstacks.begin(), t.adstacks.end(), [&](const adstack::StackDesc& s) {
            return static_cast<uint32_t>(s.heap) == h;
          })) {
        desc.specialization.push_back(
            {adstack::private_length_spec_id(static_cast<adstack::Heap>(h)), variant.len[h]});
      }
    }
  }
  if (!variant.spec_values.empty()) {
    desc.name += " (specialized)";
    for (uint32_t i = 0; i < variant.spec_values.size(); ++i) {
      desc.specialization.push_back({abi::launch_spec_flag_id(i), 1});
      desc.specialization.push_back({abi::launch_spec_value_id(i), variant.spec_values[i]});
    }
  }
  return desc;
}

}  // namespace

// The creations' turns: a counter and a condition variable (their threads outlive no cache:
// every future is taken in before an entry goes).
struct PipelineCache::Turns {
  std::mutex mu;
  std::condition_variable cv;
  uint32_t free = 0;
};

uint32_t PipelineCache::max_making() {
  const unsigned hw = std::thread::hardware_concurrency();
  return std::clamp<uint32_t>(hw > 1 ? hw - 1 : 1, 1, 8);
}

namespace {

// Makes `desc` on a thread (uncounted: the caller counts), waiting first for a turn where
// `turns` is given; std::system_error where no thread could be had.
template <typename Turns>
std::future<PipelineCache::Made> make_on_thread(rhi::Device& device,
                                                const rhi::ComputePipelineDesc& desc,
                                                std::shared_ptr<Turns> turns) {
  return std::async(std::launch::async, [d = &device, desc, turns] {
    if (turns) {
      std::unique_lock<std::mutex> lock(turns->mu);
      turns->cv.wait(lock, [&] { return turns->free > 0; });
      --turns->free;
    }
    const auto t0 = std::chrono::steady_clock::now();
    Result<rhi::ComputePipeline> p = d->create_compute_pipeline(desc, /*counted=*/false);
    const auto t1 = std::chrono::steady_clock::now();
    if (turns) {
      {
        std::lock_guard<std::mutex> lock(turns->mu);
        ++turns->free;
      }
      turns->cv.notify_one();
    }
    return PipelineCache::Made{std::move(p),
                               std::chrono::duration<double, std::milli>(t1 - t0).count()};
  });
}

// Whether `wanted`, a specialized variant not in `variants`, is past the cap of
// `max_specialized` specialized variants per task (its launches then run the tier's generic
// pipeline).
bool past_cap(const std::map<PipelineCache::VariantKey, PipelineCache::Variant>& variants,
              const PipelineCache::VariantKey& wanted, uint32_t max_specialized) {
  if (wanted.spec_values.empty()) return false;
  uint32_t made = 0;
  for (const auto& [v, p] : variants) made += !v.spec_values.empty();
  return made >= max_specialized;
}

}  // namespace

std::shared_ptr<PipelineCache::Turns> PipelineCache::turns() {
  if (!turns_) {
    turns_ = std::make_shared<Turns>();
    turns_->free = max_making();
  }
  return turns_;
}

bool PipelineCache::start_making(rhi::Device& device, const rhi::ComputePipelineDesc& desc,
                                 std::future<Made>* f, bool with_turns) {
  try {
    *f = make_on_thread(device, desc, with_turns ? turns() : nullptr);
  } catch (const std::system_error&) {  // no thread to be had: the caller makes it
    return false;
  }
  device.count_pipeline();  // now, on this thread (take_made takes it back on a failure)
  ++created_;
  return true;
}

void PipelineCache::start(rhi::Device& device, uint64_t key, uint32_t task,
                          const VariantKey& wanted, uint32_t max_specialized) {
  Entry& e = entries_.at(key);
  auto start_generic = [&] {
    if (!e.tasks.at(task).valid() && !e.making.at(task).valid()) {
      (void)start_making(device, task_desc(*e.content, task), &e.making[task]);
    }
  };
  if (!wanted.private_tier && wanted.spec_values.empty()) return start_generic();
  auto& variants = e.variants.at(task);
  if (variants.count(wanted)) return;                 // made, being made, or failed
  if (past_cap(variants, wanted, max_specialized)) {  // the tier's generic pipeline
    if (!wanted.private_tier) return start_generic();
    VariantKey tier = wanted;
    tier.spec_values.clear();
    return start(device, key, task, tier, max_specialized);
  }
  Variant v;
  if (start_background(device, variant_desc(*e.content, task, wanted), &v, /*with_turns=*/true)) {
    variants.emplace(wanted, std::move(v));
  }
}

Status PipelineCache::take_made(rhi::Device& device, std::future<Made>& f,
                                rhi::ComputePipeline* p) {
  Made made = f.get();
  create_ms_ += made.ms;
  if (!made.pipeline.ok()) {
    device.count_pipeline(-1);
    --created_;
    return made.pipeline.status();
  }
  *p = std::move(made.pipeline).value();
  return {};
}

Result<uint64_t> PipelineCache::acquire(rhi::Device& device, const abi::CompiledKernel& kernel,
                                        const std::function<Status()>& validate,
                                        bool generic_on_demand, bool* hit, bool background) {
  uint64_t key = hash_ ? hash_(kernel) : kernel.content_hash();
  auto it = entries_.find(key);
  while (it != entries_.end() && !abi::same_pipelines(*it->second.content, kernel)) {
    it = entries_.find(++key);
  }
  *hit = it != entries_.end();
  if (!*hit) {
    VKAD_TRY(validate());
    Entry e;
    e.content = std::make_shared<const abi::CompiledKernel>(kernel);
    e.tasks.resize(kernel.tasks.size());
    e.making.resize(kernel.tasks.size());
    e.device = &device;
    for (uint32_t t = 0; t < kernel.tasks.size(); ++t) {
      if (generic_on_demand && !kernel.tasks[t].spec_words.empty()) continue;
      const rhi::ComputePipelineDesc desc = task_desc(kernel, t);
      if (background && start_making(device, desc, &e.making[t])) continue;
      Result<rhi::ComputePipeline> p = create(device, desc);
      if (!p.ok()) {
        harvest_all(e);  // (the tasks made on threads so far go with `e`)
        return p.status();
      }
      e.tasks[t] = std::move(p).value();
    }
    it = entries_.emplace(key, std::move(e)).first;
  }
  ++it->second.refs;
  it->second.last_used = ++tick_;
  if (it->second.variants.size() < kernel.tasks.size()) {
    it->second.variants.resize(kernel.tasks.size());
  }
  evict_unreferenced();
  return key;
}

void PipelineCache::release(uint64_t key) {
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.refs > 0) --it->second.refs;
  evict_unreferenced();
}

Result<rhi::ComputePipeline*> PipelineCache::variant(rhi::Device& device, uint64_t key,
                                                     uint32_t task, VariantKey* wanted,
                                                     uint32_t max_specialized, bool background,
                                                     bool* pending) {
  Entry& e = entries_.at(key);
  if (!wanted->private_tier && wanted->spec_values.empty()) return generic(device, e, task);
  auto& variants = e.variants.at(task);
  // The tier's generic pipeline in place of the variant wanted (its values cleared).
  auto instead = [&]() -> Result<rhi::ComputePipeline*> {
    wanted->spec_values.clear();
    if (!wanted->private_tier) return generic(device, e, task);
    return variant(device, key, task, wanted, max_specialized);
  };
  auto it = variants.find(*wanted);
  if (it != variants.end()) {
    Variant& v = it->second;
    if (v.pending.valid()) {
      if (v.pending.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        if (pending) *pending = true;
        return instead();
      }
      harvest(v);
    }
    if (v.failed) return instead();
    return &v.pipeline;
  }
  if (past_cap(variants, *wanted, max_specialized)) return instead();
  const VariantKey& variant = *wanted;  // specialized or private tier (generic returned above)
  rhi::ComputePipelineDesc desc = variant_desc(*e.content, task, variant);
  Variant made;
  if (background && !variant.private_tier && e.making.at(task).valid()) {
    // Its generic pipeline, still being made, is what this launch would run meanwhile.
    VKAD_TRY(generic(device, e, task).status());
  }
  if (background && !variant.private_tier && e.tasks.at(task).valid() &&
      start_background(device, desc, &made)) {
    variants.emplace(variant, std::move(made));
    if (pending) *pending = true;
    wanted->spec_values.clear();
    return &e.tasks[task];
  }
  VKAD_ASSIGN_OR_RETURN(rhi::ComputePipeline pipeline, create(device, desc));
  Variant& v = variants[variant];
  v.pipeline = std::move(pipeline);
  return &v.pipeline;
}

bool PipelineCache::start_background(rhi::Device& device, const rhi::ComputePipelineDesc& desc,
                                     Variant* v, bool with_turns) {
  // Counted when started, so a count is the same whenever the thread finishes (harvest()
  // takes it back should the creation fail).
  if (!start_making(device, desc, &v->pending, with_turns)) return false;
  v->device = &device;
  return true;
}

void PipelineCache::harvest(Variant& v) {
  // A failed one: the generic pipeline serves its launches (a device loss shows at the next
  // status()).
  v.failed = !take_made(*v.device, v.pending, &v.pipeline).ok();
}

void PipelineCache::harvest_all(Entry& e) {
  for (size_t t = 0; t < e.making.size(); ++t) {
    // A failure is left for no one: the entry goes or its first use makes it again.
    if (e.making[t].valid()) (void)take_made(*e.device, e.making[t], &e.tasks[t]);
  }
  for (auto& task : e.variants) {
    for (auto& [key, v] : task) {
      if (v.pending.valid()) harvest(v);
    }
  }
}

Status PipelineCache::finish_making(uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return {};
  Entry& e = it->second;
  for (uint32_t t = 0; t < e.making.size(); ++t) {
    if (e.making[t].valid()) VKAD_TRY(generic(*e.device, e, t));
  }
  return {};
}

void PipelineCache::finish_background() {
  for (auto& [key, e] : entries_) harvest_all(e);
}

void PipelineCache::clear() {
  finish_background();
  entries_.clear();
}

uint64_t PipelineCache::pending_count() const {
  uint64_t n = 0;
  for (const auto& [key, e] : entries_) {
    for (const auto& f : e.making) n += f.valid();
    for (const auto& task : e.variants) {
      for (const auto& [k, v] : task) n += v.pending.valid();
    }
  }
  return n;
}

Result<rhi::ComputePipeline*> PipelineCache::generic(rhi::Device& device, Entry& e, uint32_t task) {
  rhi::ComputePipeline& p = e.tasks.at(task);
  // One refused on its thread is made again here: this call's error is the caller's.
  if (!p.valid() && e.making.at(task).valid()) (void)take_made(device, e.making[task], &p);
  if (!p.valid()) {
    VKAD_ASSIGN_OR_RETURN(p, create(device, task_desc(*e.content, task)));
  }
  return &p;
}

Result<rhi::ComputePipeline> PipelineCache::create(rhi::Device& device,
                                                   const rhi::ComputePipelineDesc& desc) {
  const auto t0 = std::chrono::steady_clock::now();
  Result<rhi::ComputePipeline> p = device.create_compute_pipeline(desc);
  create_ms_ +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  created_ += p.ok();
  return p;
}

uint64_t PipelineCache::private_variant_count() const {
  uint64_t n = 0;
  for (const auto& [key, e] : entries_) {
    for (const auto& task : e.variants) {
      for (const auto& [v, p] : task) n += v.private_tier;
    }
  }
  return n;
}

uint64_t PipelineCache::specialized_variant_count() const {
  uint64_t n = 0;
  for (const auto& [key, e] : entries_) {
    for (const auto& task : e.variants) {
      for (const auto& [k, v] : task) n += !k.spec_values.empty() && !v.failed;
    }
  }
  return n;
}

void PipelineCache::evict_unreferenced() {
  while (entries_.size() > capacity_) {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.refs == 0 &&
          (victim == entries_.end() || it->second.last_used < victim->second.last_used)) {
        victim = it;
      }
    }
    if (victim == entries_.end()) return;  // everything is referenced
    harvest_all(victim->second);
    entries_.erase(victim);
  }
}

}  // namespace vkad::runtime
