// Dispatch benchmark: the cost rhi adds over raw Vulkan, and the cost of knowing what finished.
//
//   vkad-bench-dispatch [--device <index|name>] [--dispatches N] [--reps R] [--json out.json]
//
// Reports, on the chosen device in one run:
//  - us per dependent dispatch (push constants + dispatch + compute->compute barrier), recorded,
//    submitted and waited for, through rhi and through the same loop written against Vulkan,
//    and the raw loop with a buffer memory barrier (the written buffer only), an
//    execution-only barrier and none (what the barrier costs), and with a timestamp after each
//    dispatch (what a timeline's stamp costs);
//  - the host cost of recording one launch, by the commands it records;
//  - the same through rhi with a fresh descriptor set per dispatch (what a runtime launch does);
//  - ns per is_signaled() on a finished submission (cached) and on an unfinished one (a device
//    query each call), in timeline and in fence mode;
//  - submit + wait round trip, in each mode.
#include <volk.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "abi/spirv_tools.h"
#include "bench/bench_util.h"
#include "rhi/buffer.h"
#include "rhi/device.h"
#include "rhi/pipeline.h"
#include "rhi/stream.h"
#include "support/sample_kernels.h"

using namespace vkad;
using namespace vkad::bench;

namespace {

struct Push {
  uint32_t n, add, spin;
};

#define CHECK_OK(expr)                                                        \
  do {                                                                        \
    auto&& check_ok_ = (expr);                                                \
    if (!::vkad::detail::to_status(check_ok_).ok()) {                         \
      std::fprintf(stderr, "%s failed: %s\n", #expr,                          \
                   ::vkad::detail::to_status(check_ok_).to_string().c_str()); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

// What follows each dispatch of the raw loop: the compute -> compute memory barrier a dependent
// launch needs; an execution-only barrier (no memory dependency: not enough for a launch that
// reads what the last wrote, measured to split the barrier's cost); nothing (independent
// dispatches, which the device may overlap).
// A buffer memory barrier on the written buffer only (issue 53, point 4: barriers as narrow as
// the data) is measured beside the global one.
enum class Follow { kMemoryBarrier, kBufferBarrier, kExecutionBarrier, kNothing };

// A timestamp per dispatch, as a timeline writes one (runtime/timeline.h): none, or at `stage`
// after the barrier (where the next launch's begins) or before it.
struct Stamp {
  VkPipelineStageFlagBits stage = VK_PIPELINE_STAGE_NONE;
  bool before_barrier = false;
};

double raw_dependent_dispatch_us(rhi::Device& dev, rhi::ComputePipeline& p, rhi::Buffer& a,
                                 rhi::Buffer& b, int n, int reps,
                                 Follow follow = Follow::kMemoryBarrier, Stamp stamp = {}) {
  VkDevice d = dev.handle();
  VkQueue queue;
  dev.fn().vkGetDeviceQueue(d, dev.queue_family(), 0, &queue);
  VkCommandPoolCreateInfo cpci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  cpci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  cpci.queueFamilyIndex = dev.queue_family();
  VkCommandPool pool;
  dev.fn().vkCreateCommandPool(d, &cpci, nullptr, &pool);
  VkCommandBufferAllocateInfo cbai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  cbai.commandPool = pool;
  cbai.commandBufferCount = 1;
  VkCommandBuffer cb;
  dev.fn().vkAllocateCommandBuffers(d, &cbai, &cb);
  VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  VkFence fence;
  dev.fn().vkCreateFence(d, &fci, nullptr, &fence);
  VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 2};
  VkDescriptorPoolCreateInfo dpci{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  dpci.maxSets = 1;
  dpci.poolSizeCount = 1;
  dpci.pPoolSizes = &size;
  VkDescriptorPool dpool;
  dev.fn().vkCreateDescriptorPool(d, &dpci, nullptr, &dpool);
  VkDescriptorSetLayout layout = p.set_layout();
  VkDescriptorSetAllocateInfo dsai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  dsai.descriptorPool = dpool;
  dsai.descriptorSetCount = 1;
  dsai.pSetLayouts = &layout;
  VkDescriptorSet set = VK_NULL_HANDLE;
  if (!p.push_descriptors()) dev.fn().vkAllocateDescriptorSets(d, &dsai, &set);
  VkDescriptorBufferInfo infos[2] = {{a.handle(), 0, VK_WHOLE_SIZE},
                                     {b.handle(), 0, VK_WHOLE_SIZE}};
  VkWriteDescriptorSet writes[2];
  for (int i = 0; i < 2; ++i) {
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstSet = set;
    writes[i].dstBinding = i;
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  // A pipeline made with push descriptors (where the device has them) has a push-descriptor
  // set layout, from which no set may be allocated: its buffers are pushed instead (once).
  const bool push = p.push_descriptors();
  if (!push) dev.fn().vkUpdateDescriptorSets(d, 2, writes, 0, nullptr);
  VkQueryPool queries = VK_NULL_HANDLE;
  if (stamp.stage != VK_PIPELINE_STAGE_NONE) {
    VkQueryPoolCreateInfo qci{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qci.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qci.queryCount = static_cast<uint32_t>(n);
    dev.fn().vkCreateQueryPool(d, &qci, nullptr, &queries);
  }

  std::vector<double> samples;
  Push pc{64, 1, 0};
  for (int r = 0; r < reps; ++r) {
    double t0 = now_us();
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    dev.fn().vkBeginCommandBuffer(cb, &bi);
    dev.fn().vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p.handle());
    if (push) {
      dev.fn().vkCmdPushDescriptorSetKHR(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout(), 0, 2,
                                         writes);
    } else {
      dev.fn().vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout(), 0, 1, &set,
                                       0, nullptr);
    }
    if (queries != VK_NULL_HANDLE) {
      dev.fn().vkCmdResetQueryPool(cb, queries, 0, static_cast<uint32_t>(n));
    }
    for (int i = 0; i < n; ++i) {
      dev.fn().vkCmdPushConstants(cb, p.layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, &pc);
      dev.fn().vkCmdDispatch(cb, 1, 1, 1);
      if (queries != VK_NULL_HANDLE && stamp.before_barrier) {
        dev.fn().vkCmdWriteTimestamp(cb, stamp.stage, queries, static_cast<uint32_t>(i));
      }
      if (follow == Follow::kNothing) continue;
      VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
      mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
      mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
      const bool memory = follow == Follow::kMemoryBarrier;
      VkBufferMemoryBarrier bb{VK_STRUCTURE_TYPE_BUFFER_MEMORY_BARRIER};
      bb.srcAccessMask = mb.srcAccessMask;
      bb.dstAccessMask = mb.dstAccessMask;
      bb.srcQueueFamilyIndex = bb.dstQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED;
      bb.buffer = b.handle();
      bb.size = VK_WHOLE_SIZE;
      const bool buffer = follow == Follow::kBufferBarrier;
      dev.fn().vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                    VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, memory ? 1 : 0,
                                    memory ? &mb : nullptr, buffer ? 1 : 0, buffer ? &bb : nullptr,
                                    0, nullptr);
      if (queries != VK_NULL_HANDLE && !stamp.before_barrier) {
        dev.fn().vkCmdWriteTimestamp(cb, stamp.stage, queries, static_cast<uint32_t>(i));
      }
    }
    dev.fn().vkEndCommandBuffer(cb);
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cb;
    dev.fn().vkQueueSubmit(queue, 1, &si, fence);
    dev.fn().vkWaitForFences(d, 1, &fence, VK_TRUE, UINT64_MAX);
    dev.fn().vkResetFences(d, 1, &fence);
    samples.push_back((now_us() - t0) / n);
  }
  if (queries != VK_NULL_HANDLE) dev.fn().vkDestroyQueryPool(d, queries, nullptr);
  dev.fn().vkDestroyDescriptorPool(d, dpool, nullptr);
  dev.fn().vkDestroyFence(d, fence, nullptr);
  dev.fn().vkDestroyCommandPool(d, pool, nullptr);
  return median(samples);
}

double rhi_dependent_dispatch_us(rhi::Stream& s, rhi::ComputePipeline& p, rhi::Buffer& a,
                                 rhi::Buffer& b, int n, int reps, bool set_per_dispatch) {
  std::vector<double> samples;
  Push pc{64, 1, 0};
  rhi::Buffer* bufs[] = {&a, &b};
  for (int r = 0; r < reps; ++r) {
    double t0 = now_us();
    auto list = s.begin();
    CHECK_OK(list);
    list->bind_pipeline(p);
    if (!set_per_dispatch) CHECK_OK(list->bind_buffers(p, bufs));
    for (int i = 0; i < n; ++i) {
      if (set_per_dispatch) CHECK_OK(list->bind_buffers(p, bufs));
      list->push_constants(p, &pc, sizeof pc);
      list->dispatch(1);
      list->barrier(rhi::Barrier::kComputeToCompute);
    }
    auto sem = s.submit(*list);
    CHECK_OK(sem);
    sem->wait();
    samples.push_back((now_us() - t0) / n);
  }
  return median(samples);
}

// Host cost of recording one dependent launch, by what the launch records (no submission timed):
// the floor (push constants + dispatch + barrier), then with the pipeline bound again, with the
// buffers pushed again (the args binding at a moving offset, as a launch's ring slot), and both,
// which is the shape Runtime::dispatch_into records per launch. Where vkad-bench-launch's
// "record only" figure sits above the last row is vkad's own bookkeeping.
enum class Shape { kFloor, kRebind, kRepush, kLaunch };

double record_cost_ns(rhi::Stream& s, rhi::ComputePipeline& p, rhi::Buffer& a, rhi::Buffer& b,
                      int n, int reps, Shape shape) {
  std::vector<double> samples;
  Push pc{64, 1, 0};
  rhi::Buffer* bufs[] = {&a, &b};
  const bool rebind = shape == Shape::kRebind || shape == Shape::kLaunch;
  const bool repush = shape == Shape::kRepush || shape == Shape::kLaunch;
  for (int r = 0; r < reps; ++r) {
    auto list = s.begin();
    CHECK_OK(list);
    list->bind_pipeline(p);
    CHECK_OK(list->bind_buffers(p, bufs));
    double t0 = now_us();
    for (int i = 0; i < n; ++i) {
      // Through Vulkan: CommandList::bind_pipeline skips the pipeline it bound last.
      if (rebind)
        s.device().fn().vkCmdBindPipeline(list->handle(), VK_PIPELINE_BIND_POINT_COMPUTE,
                                          p.handle());
      // 256-byte steps: the offset alignment every device accepts for storage buffers.
      if (repush) CHECK_OK(list->bind_buffers(p, bufs, {uint64_t(i % 8) * 256, 256}));
      list->push_constants(p, &pc, sizeof pc);
      list->dispatch(1);
      list->barrier(rhi::Barrier::kComputeToCompute);
    }
    samples.push_back((now_us() - t0) * 1000.0 / n);
    auto sem = s.submit(*list);
    CHECK_OK(sem);
    sem->wait();
  }
  return median(samples);
}

// `a` gets seeded random words (through a staging buffer) before anything is timed.
void upload_words(rhi::Device& dev, rhi::Stream& s, rhi::Buffer& a,
                  const std::vector<uint32_t>& words) {
  auto up = dev.create_buffer({4 * words.size(), rhi::MemoryUsage::kUpload, "a upload"});
  CHECK_OK(up);
  std::memcpy(up->mapped(), words.data(), 4 * words.size());
  auto list = s.begin();
  CHECK_OK(list);
  list->copy(*up, a, 4 * words.size());
  list->barrier(rhi::Barrier::kTransferToCompute);
  auto sem = s.submit(*list);
  CHECK_OK(sem);
  sem->wait();
}

// After timing: every dispatch wrote b[i] = a[i] * 2 + 1 for i < 64 (Push{64, 1, 0}); b is read
// back and compared, and a wrong word fails the benchmark (exit 3, bench_util.h).
void check_scale_add(rhi::Device& dev, rhi::Stream& s, rhi::Buffer& b,
                     const std::vector<uint32_t>& a0, const char* after) {
  auto rb = dev.create_buffer({4096, rhi::MemoryUsage::kReadback, "b readback"});
  CHECK_OK(rb);
  auto list = s.begin();
  CHECK_OK(list);
  list->barrier(rhi::Barrier::kComputeToTransfer);
  list->copy(b, *rb, 4096);
  list->barrier(rhi::Barrier::kToHost);
  auto sem = s.submit(*list);
  CHECK_OK(sem);
  sem->wait();
  std::vector<uint32_t> got(64);
  std::memcpy(got.data(), rb->mapped(), 4 * got.size());
  for (uint32_t i = 0; i < 64; ++i) {
    if (got[i] != a0[i] * 2u + 1u) {
      check_failed(std::string("scale_add after ") + after + ": b[" + std::to_string(i) + "] = " +
                   std::to_string(got[i]) + ", expected " + std::to_string(a0[i] * 2u + 1u));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is printed, also into a pipe or file
  Args args(
      argc, argv,
      "usage: vkad-bench-dispatch [--device D] [--dispatches N] [--reps R] [--json F]\n"
      "  dependent dispatches in one command buffer (raw Vulkan vs rhi, timeline and fence),\n"
      "  is_signaled() cost, submit->wait round trip (blocking and spin-then-block)\n"
      "  --device D      device index or name substring (default: automatic)\n"
      "  --dispatches N  dispatches per command buffer (default 2000)\n"
      "  --reps R        repetitions, median reported (default 15)\n"
      "  --json F        also write the results as JSON to F\n",
      {"device", "dispatches", "reps", "json"});
  int n = static_cast<int>(args.get_int("dispatches", 2000));
  int reps = static_cast<int>(args.get_int("reps", 15));
  rhi::DeviceOptions opts;
  opts.device = args.get("device", "");
  auto dev_r = rhi::Device::create(opts);
  CHECK_OK(dev_r);
  rhi::Device& dev = **dev_r;
  std::string device_name = dev.caps().device_name;
  std::printf("device: %s\n", device_name.c_str());

  rhi::ComputePipelineDesc desc;
  auto words = codegen::assemble_spirv(testing::kScaleAddSpirv);
  CHECK_OK(words);
  desc.spirv = *words;
  desc.storage_buffer_count = 2;
  desc.push_constant_bytes = sizeof(Push);
  desc.name = "scale_add";
  auto p = dev.create_compute_pipeline(desc);
  CHECK_OK(p);
  auto a = dev.create_buffer({4096, rhi::MemoryUsage::kDeviceLocal, "a"});
  auto b = dev.create_buffer({4096, rhi::MemoryUsage::kDeviceLocal, "b"});
  CHECK_OK(a);
  CHECK_OK(b);

  JsonRecords json;
  auto record = [&](const char* what, const char* mode, double value, const char* unit) {
    std::printf("  %-44s %-9s %10.3f %s\n", what, mode, value, unit);
    json.begin();
    json.field("metric", what);
    json.field("mode", mode);
    json.field("value", value);
    json.field("unit", unit);
  };

  // Seeded random input words (bench_util.h), checked through the output after each timing.
  std::vector<uint32_t> a0(1024);
  {
    Random rng(1);
    for (uint32_t& w : a0) w = static_cast<uint32_t>(rng.next());
    auto s = dev.create_stream({rhi::SyncMode::kAuto, "bench setup"});
    CHECK_OK(s);
    upload_words(dev, **s, *a, a0);
  }
  std::printf("dependent dispatches: %d per command buffer, median of %d\n", n, reps);
  // Warm up both paths once (pipeline compilation on first use, page faults).
  raw_dependent_dispatch_us(dev, *p, *a, *b, 16, 2);
  double raw = raw_dependent_dispatch_us(dev, *p, *a, *b, n, reps);
  record("dependent dispatch, raw Vulkan", "-", raw, "us");
  record("dispatch + buffer memory barrier, raw", "-",
         raw_dependent_dispatch_us(dev, *p, *a, *b, n, reps, Follow::kBufferBarrier), "us");
  record("dispatch + execution-only barrier, raw", "-",
         raw_dependent_dispatch_us(dev, *p, *a, *b, n, reps, Follow::kExecutionBarrier), "us");
  record("independent dispatch (no barrier), raw", "-",
         raw_dependent_dispatch_us(dev, *p, *a, *b, n, reps, Follow::kNothing), "us");
  // What a timestamp per dependent dispatch adds (the timeline's cost), by where it is written.
  if (dev.caps().timestamps) {
    const struct {
      const char* what;
      Stamp stamp;
    } stamps[] = {
        {"+ timestamp BOTTOM_OF_PIPE after barrier", {VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, false}},
        {"+ timestamp BOTTOM_OF_PIPE before barrier", {VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, true}},
        {"+ timestamp COMPUTE_SHADER after barrier", {VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, false}},
        {"+ timestamp COMPUTE_SHADER before barrier", {VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, true}},
        {"+ timestamp TOP_OF_PIPE after barrier", {VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, false}},
    };
    for (const auto& v : stamps) {
      record(v.what, "-",
             raw_dependent_dispatch_us(dev, *p, *a, *b, n, reps, Follow::kMemoryBarrier, v.stamp),
             "us");
    }
  }
  {
    auto s = dev.create_stream({rhi::SyncMode::kAuto, "bench check"});
    CHECK_OK(s);
    check_scale_add(dev, **s, *b, a0, "the raw Vulkan loop");
  }
  for (rhi::SyncMode mode : {rhi::SyncMode::kTimeline, rhi::SyncMode::kFence}) {
    if (mode == rhi::SyncMode::kTimeline && !dev.caps().timeline_semaphore) continue;
    const char* m = rhi::sync_mode_name(mode);
    auto s = dev.create_stream({mode, std::string("bench ") + m});
    CHECK_OK(s);
    rhi::Stream& stream = **s;
    upload_words(dev, stream, *a, a0);  // the previous mode's round trips filled `a`
    rhi_dependent_dispatch_us(stream, *p, *a, *b, 16, 2, false);
    double via_rhi = rhi_dependent_dispatch_us(stream, *p, *a, *b, n, reps, false);
    record("dependent dispatch, rhi", m, via_rhi, "us");
    record("rhi / raw ratio", m, via_rhi / raw, "x");
    double per_set = rhi_dependent_dispatch_us(stream, *p, *a, *b, n, reps, true);
    record("dependent dispatch, rhi, set per dispatch", m, per_set, "us");
    check_scale_add(dev, stream, *b, a0, m);
    if (mode == rhi::SyncMode::kTimeline || !dev.caps().timeline_semaphore) {
      const char* binding = p->push_descriptors() ? "push descriptors" : "descriptor sets";
      std::printf("recording one dependent launch (host ns, %s):\n", binding);
      record("record: push constants + dispatch + barrier", m,
             record_cost_ns(stream, *p, *a, *b, n, reps, Shape::kFloor), "ns");
      record("record: + bind pipeline again", m,
             record_cost_ns(stream, *p, *a, *b, n, reps, Shape::kRebind), "ns");
      record("record: + push buffers again", m,
             record_cost_ns(stream, *p, *a, *b, n, reps, Shape::kRepush), "ns");
      record("record: + both (a launch's shape)", m,
             record_cost_ns(stream, *p, *a, *b, n, reps, Shape::kLaunch), "ns");
      upload_words(dev, stream, *a, a0);
      rhi_dependent_dispatch_us(stream, *p, *a, *b, 16, 1, false);
    }

    // is_signaled on a finished submission: the cached fast path.
    auto list = stream.begin();
    CHECK_OK(list);
    list->fill(*a, 0);
    auto sem = stream.submit(*list);
    CHECK_OK(sem);
    sem->wait();
    const int polls = 1000000;
    volatile bool sink = false;
    double t0 = now_us();
    for (int i = 0; i < polls; ++i) sink = sink ^ sem->is_signaled();
    record("is_signaled, finished (cached)", m, (now_us() - t0) * 1000.0 / polls, "ns");

    // is_signaled on an unfinished submission: held behind a host-signalled gate, so every
    // call asks the device (vkGetSemaphoreCounterValue / vkGetFenceStatus).
    VkSemaphoreTypeCreateInfo type{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
    type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    VkSemaphoreCreateInfo sci{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
    sci.pNext = &type;
    VkSemaphore gate;
    dev.fn().vkCreateSemaphore(dev.handle(), &sci, nullptr, &gate);
    auto gated = stream.begin();
    CHECK_OK(gated);
    gated->fill(*a, 1);
    rhi::Stream::TimelineWait wait{gate, 1};
    auto pending = stream.submit(*gated, {&wait, 1});
    CHECK_OK(pending);
    const int slow_polls = 200000;
    t0 = now_us();
    for (int i = 0; i < slow_polls; ++i) sink = sink ^ pending->is_signaled();
    record("is_signaled, unfinished (device query)", m, (now_us() - t0) * 1000.0 / slow_polls,
           "ns");
    VkSemaphoreSignalInfo sig{VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO};
    sig.semaphore = gate;
    sig.value = 1;
    dev.fn().vkSignalSemaphore(dev.handle(), &sig);
    pending->wait();
    dev.fn().vkDestroySemaphore(dev.handle(), gate, nullptr);

    // Submit + wait round trip of a tiny list: blocking in the driver at once, then
    // spin-then-block (the stream's default on GPUs), so the two are compared in one run.
    for (int64_t spin : {int64_t{0}, rhi::StreamOptions::kDefaultSpinNs}) {
      stream.set_spin_ns(spin);
      std::vector<double> rt;
      for (int i = 0; i < 500; ++i) {
        double t = now_us();
        auto l = stream.begin();
        CHECK_OK(l);
        l->fill(*a, 2, 0, 256);
        auto s2 = stream.submit(*l);
        CHECK_OK(s2);
        s2->wait();
        rt.push_back(now_us() - t);
      }
      record(spin == 0 ? "submit + wait round trip, blocking wait"
                       : "submit + wait round trip, spin-then-block (50 us)",
             m, median(rt), "us");
    }
  }
  std::string out = args.get("json", "");
  if (!out.empty() && !json.write(out, device_name)) {
    std::fprintf(stderr, "cannot write %s\n", out.c_str());
    return 1;
  }
  return 0;
}
