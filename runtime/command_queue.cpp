#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "abi/print_records.h"
#include "runtime/runtime.h"

// CommandQueue (runtime.h): the command list, its submissions and their retirement, the
// recording of planned launches, the timeline.

namespace vkad::runtime {

namespace {

double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

// Adds the host time from construction to destruction to `*sink` (RuntimeOptions::
// profile_flush); with no sink it reads no clock, so the profile costs a branch when off.
class PhaseTimer {
 public:
  PhaseTimer(bool on, double* sink) : sink_(on ? sink : nullptr) {
    if (sink_) t0_ = std::chrono::steady_clock::now();
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  ~PhaseTimer() {
    if (sink_) {
      *sink_ +=
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count();
    }
  }

 private:
  double* sink_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

CommandQueue::CommandQueue() : retirement_(kDefaultRetirementDepth) {}
CommandQueue::~CommandQueue() = default;

Status CommandQueue::ensure_list() {
  if (list_.recording()) return {};
  PhaseTimer timer(options_.profile_flush, &profile_.begin_us);
  VKAD_ASSIGN_OR_RETURN(list_, stream_->begin());
  list_started_us_ = now_us();
  return {};
}

Status CommandQueue::record_host_copy(NdArray& a, const void* data) {
  VKAD_TRY(ensure_list());
  // The source: a ring slot when small (no buffer made), else a staging buffer of its own.
  rhi::Buffer* src = nullptr;
  uint64_t src_offset = 0;
  if (a.bytes <= upload_ring_->chunk_bytes()) {
    VKAD_ASSIGN_OR_RETURN(HostRing::Slot slot,
                          upload_ring_->allocate(*device_, a.bytes, &ctx_buffers_.upload_chunks));
    std::memcpy(slot.data, data, a.bytes);
    src = slot.buffer;
    src_offset = slot.offset;
  } else {
    VKAD_ASSIGN_OR_RETURN(
        rhi::Buffer staging,
        device_->create_buffer({a.bytes, rhi::MemoryUsage::kUpload, a.name + " upload"}));
    std::memcpy(staging.mapped(), data, a.bytes);
    ctx_buffers_.buffers.push_back(std::move(staging));
    src = &ctx_buffers_.buffers.back();
  }
  ctx_bytes_ += a.bytes;
  return timed(
      "upload", [&] { return "upload '" + a.name + "'"; },
      [&] {
        list_.barrier(rhi::Barrier::kComputeToTransfer);
        list_.copy(*src, a.buffer, a.bytes, src_offset, 0);
        list_.barrier(rhi::Barrier::kTransferToCompute);
      });
}

Status CommandQueue::auto_flush() {
  if (list_.dispatch_count() >= options_.max_dispatches_per_list ||
      now_us() - list_started_us_ > options_.max_list_age_us) {
    ++stats_.auto_flushes;
    VKAD_TRY(flush().status());
  }
  return {};
}

Status CommandQueue::record_launch(const std::shared_ptr<const Kernel>& k, const CommandPlan& plan,
                                   std::span<rhi::Buffer* const> arrays, const std::byte* encoded,
                                   LaunchId* id, bool final_barrier) {
  const uint32_t args_bytes = k->args_bytes;
  // The args go into a slot of the upload ring: no Vulkan object per launch (host_ring.h).
  VKAD_ASSIGN_OR_RETURN(HostRing::Slot args_slot,
                        upload_ring_->allocate(*device_, args_bytes, &ctx_buffers_.upload_chunks));
  std::memcpy(args_slot.data, encoded, args_bytes);
  bool timed = false;
  if (timeline_ && !timeline_quiet_) {
    static const std::string kNoGraph;
    VKAD_ASSIGN_OR_RETURN(timed,
                          timeline_->begin_gpu(list_, k->desc.name, "launch", next_launch_ + 1,
                                               timeline_graph_ ? *timeline_graph_ : kNoGraph));
  }
  Status recorded = record_dispatches(list_, *k, plan, arrays, *args_slot.buffer, args_slot.offset,
                                      final_barrier);
  if (timed) timeline_->end_gpu(list_);  // also after a failure: its stamp is read at the end
  VKAD_TRY(recorded);
  ctx_bytes_ += args_bytes;
  const LaunchId launch_id{++next_launch_};
  ctx_buffers_.flags.push_back({args_slot.data, k, launch_id, replay_graph_, replay_launch_,
                                replay_graph_ != 0 ? replay_origin_ : note_});
  count_launch(plan, final_barrier);
  if (id) *id = launch_id;
  return {};
}

Status CommandQueue::record_dispatches(rhi::CommandList& list, const Kernel& k,
                                       const CommandPlan& cp, std::span<rhi::Buffer* const> arrays,
                                       rhi::Buffer& args_buf, uint64_t args_offset,
                                       bool final_barrier) {
  std::array<rhi::Buffer*, adstack::kHeapCount> heaps;
  for (uint32_t h = 0; h < adstack::kHeapCount; ++h) heaps[h] = &heaps_.heap(h);
  // bindings_ reused: no allocation per launch
  return dispatch_into(list, k, cp, arrays, heaps, args_buf, args_offset, final_barrier, bindings_);
}

Status CommandQueue::dispatch_into(rhi::CommandList& list, const Kernel& k, const CommandPlan& cp,
                                   std::span<rhi::Buffer* const> arrays,
                                   std::span<rhi::Buffer* const> heaps, rhi::Buffer& args_buf,
                                   uint64_t args_offset, bool final_barrier,
                                   std::vector<rhi::Buffer*>& bindings) {
  const CompiledKernel& d = k.desc;
  const std::vector<TaskPlan>& plan = cp.lp.tasks;
  bindings.clear();
  bindings.push_back(&args_buf);
  bindings.insert(bindings.end(), arrays.begin(), arrays.end());
  // With every adstack task in the private tier the heap bindings are never accessed: the
  // args buffer stands in for them, so no heap is made.
  if (k.has_adstacks) {
    for (rhi::Buffer* h : heaps) bindings.push_back(cp.lp.any_heap_task ? h : &args_buf);
  }
  for (size_t t = 0; t < d.tasks.size(); ++t) {
    rhi::ComputePipeline& p = *cp.pipelines[t];
    list.bind_pipeline(p);
    VKAD_TRY(list.bind_buffers(p, bindings, {args_offset, k.args_bytes}));
    uint32_t push[2] = {plan[t].begin, plan[t].end};
    list.push_constants(p, push, sizeof push);
    list.dispatch(plan[t].groups);
    if (final_barrier || t + 1 < d.tasks.size()) list.barrier(rhi::Barrier::kComputeToCompute);
  }
  return {};
}

void CommandQueue::count_launch(const CommandPlan& planned, bool barrier_after) {
  const std::array<uint64_t, 3>& tier_counts = planned.lp.tier_counts;
  ++stats_.launches;
  const size_t tasks = planned.lp.tasks.size();
  stats_.dispatches += tasks;
  // dispatch_into's: one after every task but the last, and after the last with barrier_after.
  if (tasks > 0) stats_.barriers += tasks - 1 + (barrier_after ? 1 : 0);
  stats_.adstack_heap_dispatches += tier_counts[0] + tier_counts[2];
  stats_.adstack_private_dispatches += tier_counts[1];
  stats_.adstack_private_fallbacks += tier_counts[2];
  stats_.adstack_specialized_dispatches += planned.specialized;
  stats_.adstack_specialize_misses += planned.spec_misses;
  stats_.adstack_specialize_pending += planned.spec_pending;
}

Result<rhi::StreamSemaphore> CommandQueue::flush() {
  VKAD_EXCLUSIVE_USE("flush");
  VKAD_TRY(device_->status());
  if (graphs_->capturing())
    return last_sem_;  // nothing is recorded while capturing: nothing to submit
  return submit_list();
}

Result<rhi::StreamSemaphore> CommandQueue::submit_list() {
  if (!list_.recording()) {
    retirement_.poll();
    take_retired();
    return last_sem_;
  }
  // Makes device writes (args error words, readbacks) visible to the host after completion.
  list_.barrier(rhi::Barrier::kToHost);
  // Host writes through held views of non-coherent memory (ndarray_export.cpp), before the
  // submission that may read them.
  if (!host_views_.empty()) VKAD_TRY(sync_host_views(/*to_device=*/true));
  const bool profile = options_.profile_flush;
  const double submit_begin = timeline_ ? TimelineRecorder::now_us() : 0;
  Result<rhi::StreamSemaphore> sem = [&] {
    PhaseTimer timer(profile, &profile_.submit_us);
    return stream_->submit(list_);
  }();
  if (timeline_) timeline_->host("submit", "submit", submit_begin, TimelineRecorder::now_us());
  if (!sem.ok()) {
    // Nothing was submitted; the ctx buffers were only recorded into a list that is gone, so
    // they are released through the deleter (which waits for no serial that never ran).
    ctx_buffers_ = {};
    ctx_bytes_ = 0;
    return sem.status();
  }
  last_sem_ = *sem;
  ++stats_.flushes;
  profile_.flushes += profile;
  uint64_t bytes = ctx_bytes_;
  ctx_bytes_ = 0;
  // The next list's payload reuses a retired one's vectors (take_retired): no allocation.
  CtxBuffers next;
  if (!spare_ctx_.empty()) {
    next = std::move(spare_ctx_.back());
    spare_ctx_.pop_back();
  }
  const uint64_t forced_before = timeline_ ? retirement_.counters().forced_waits : 0;
  const double push_begin = timeline_ ? TimelineRecorder::now_us() : 0;
  Status pushed = [&] {
    PhaseTimer timer(profile, &profile_.poll_us);
    return retirement_.push(*sem, std::exchange(ctx_buffers_, std::move(next)), bytes);
  }();
  if (timeline_ && retirement_.counters().forced_waits != forced_before) {
    timeline_->host("retirement wait", "wait", push_begin, TimelineRecorder::now_us());
  }
  take_retired();
  VKAD_TRY(pushed);
  PhaseTimer timer(profile, &profile_.recycle_us);
  stream_->recycle();
  return *sem;
}

void CommandQueue::take_retired() {
  // Retired payloads: read the error words their launches wrote, then release their buffers
  // (clearing hands them to the deferred deleter) and keep the emptied payloads' vectors for
  // the next flushes (a few: as many as the retirement depth keeps in flight, and then some).
  PhaseTimer timer(options_.profile_flush, &profile_.release_us);
  constexpr size_t kSparePayloads = 16;
  retirement_.take_retired(retired_);
  for (CtxBuffers& b : retired_) {
    read_error_flags(b);  // before recycling: a flag site may sit in a chunk closed here
    upload_ring_->recycle(b.upload_chunks);
    readback_ring_->recycle(b.readback_chunks);
    b.buffers.clear();
    b.flags.clear();
    if (spare_ctx_.size() < kSparePayloads) spare_ctx_.push_back(std::move(b));
  }
  retired_.clear();  // the vector keeps its capacity
}

Status CommandQueue::drain_all() {
  Status s = retirement_.drain_all();
  take_retired();
  VKAD_TRY(s);
  stream_->recycle();
  return device_->status();
}

Status CommandQueue::synchronize() {
  VKAD_EXCLUSIVE_USE("synchronize");
  VKAD_TRY(graphs_->not_while_capturing("synchronize"));
  VKAD_ASSIGN_OR_RETURN(rhi::StreamSemaphore sem, flush());
  const double wait_begin = timeline_ ? TimelineRecorder::now_us() : 0;
  if (!sem.wait()) {
    VKAD_TRY(device_->status());
    return make_error(ErrorCode::kTimeout, "synchronize: the last submission did not complete");
  }
  if (timeline_) timeline_->host("synchronize", "wait", wait_begin, TimelineRecorder::now_us());
  if (!host_views_.empty()) VKAD_TRY(sync_host_views(/*to_device=*/false));
  VKAD_TRY(drain_all());
  return errors_.take();
}

Status CommandQueue::ensure_heaps(const std::array<uint64_t, adstack::kHeapCount>& need) {
  // Old heaps travel with this list's ctx buffers through the retirement queue.
  VKAD_TRY(heaps_.ensure(*device_, need, &ctx_buffers_.buffers, &ctx_bytes_,
                         &stats_.adstack_heap_growths));
  stats_.adstack_heap_bytes = heaps_.bytes();
  return {};
}

Status CommandQueue::set_retirement_depth(size_t depth) {
  VKAD_EXCLUSIVE_USE("set_retirement_depth");
  VKAD_TRY(device_->status());
  VKAD_TRY(graphs_->not_while_capturing("set_retirement_depth"));
  // The new depth's command buffers first: where the driver cannot make them, the depth stays.
  VKAD_TRY(reserve_submissions(depth));
  Status s = retirement_.set_depth(depth);
  take_retired();
  VKAD_TRY(s);
  stream_->recycle();
  return {};
}

Status CommandQueue::reserve_submissions(size_t depth) {
  // The retirement queue keeps at most `depth` flushes in flight, one more between a submit
  // and the wait its push forces, and the stream records one: the command buffers for them are
  // made now, so a steady-state loop creates none at whatever iteration a slow device first
  // lets that many pile up. Hold-until-synchronize has no bound, and a very deep queue is left
  // to grow as it is used.
  if (retirement_.policy() == RetirementPolicy::kHoldUntilSync) return {};
  constexpr size_t kMostReserved = 16;
  return stream_->reserve(std::min(depth, kMostReserved - 2) + 2);
}

void CommandQueue::print_lines(const FlagSite& site) {
  const abi::CompiledKernel& d = site.kernel->desc;
  const abi::PrintArea area = abi::read_print_area(d, site.args);
  auto emit = [this](const std::string& line) {
    if (print_sink_) {
      print_sink_(line);
      return;
    }
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fputc('\n', stdout);
  };
  for (const abi::PrintRecord& r : area.records) {
    // A failed assert's record is the device error's detail, not a line of output.
    if (!d.tasks[r.task].print_sites[r.site].is_assert) emit(abi::print_line(d, r));
  }
  if (area.dropped != 0) {
    emit("[kernel '" + d.name + "'] " + std::to_string(area.dropped) +
         " print records dropped: the launch's print area (" + std::to_string(d.print_bytes) +
         " bytes, CompileOptions::print_buffer_bytes) was full");
  }
  if (!print_sink_ && (!area.records.empty() || area.dropped != 0)) std::fflush(stdout);
}

void CommandQueue::read_error_flags(CtxBuffers& retired) {
  for (const FlagSite& site : retired.flags) {
    if (site.kernel->desc.print_bytes != 0) print_lines(site);
    if (site.graph == 0 && site.origin.empty()) {
      errors_.record(site.kernel->desc, site.args, site.launch);
      continue;
    }
    errors_.record(site.kernel->desc, site.args, site.launch, [&] {
      if (site.graph == 0) return site.origin.text();
      std::string where = graphs_->graph_launch_where(site.graph, site.graph_launch);
      if (!site.origin.empty()) where += ", captured from " + site.origin.text();
      return where;
    });
  }
}

Status CommandQueue::begin_timeline(uint64_t max_events, uint32_t replay_sample) {
  VKAD_EXCLUSIVE_USE("begin_timeline");
  VKAD_TRY(device_->status());
  VKAD_TRY(graphs_->not_while_capturing("begin_timeline"));
  if (replay_sample == 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "begin_timeline: replay_sample is 0 (at least 1: 1 times every replay)");
  }
  if (timeline_) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "begin_timeline: a timeline is already being recorded (end_timeline first)");
  }
  // The calibration stamp goes into a list of its own on an idle device: it is written as
  // soon as the submission arrives, between the two host times taken around it.
  VKAD_TRY(flush().status());
  VKAD_TRY(drain_all());
  auto recorder = std::make_unique<TimelineRecorder>(*device_, max_events, replay_sample);
  VKAD_TRY(ensure_list());
  VKAD_TRY(recorder->begin_calibration(list_, TimelineRecorder::now_us()));
  VKAD_ASSIGN_OR_RETURN(rhi::StreamSemaphore sem, flush());
  if (!sem.wait()) {
    VKAD_TRY(device_->status());
    return make_error(ErrorCode::kTimeout, "begin_timeline: the calibration did not complete");
  }
  VKAD_TRY(recorder->calibrate(TimelineRecorder::now_us()));
  timeline_ = std::move(recorder);
  return {};
}

Result<Timeline> CommandQueue::end_timeline() {
  VKAD_EXCLUSIVE_USE("end_timeline");
  VKAD_TRY(graphs_->not_while_capturing("end_timeline"));
  if (!timeline_) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "end_timeline: no timeline is being recorded (begin_timeline first)");
  }
  // Every submission complete, so every stamp is written; device errors found meanwhile stay
  // pending for the next download / synchronize (drain_all does not report them).
  std::unique_ptr<TimelineRecorder> recorder = std::move(timeline_);
  VKAD_TRY(flush().status());
  VKAD_TRY(drain_all());
  return recorder->finish(device_->caps().device_name);
}

}  // namespace vkad::runtime
