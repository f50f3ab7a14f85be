// A capture that runs what it captures (Runtime::Graphs::begin_capture's `run`, graphs.h).
//
// Why: a training loop's first iteration is captured, then replayed; the device sat idle while
// the caller captured (~8,000 launches from Python for a DiffTaichi iteration, tens of ms), and
// the replay after it paid the driver's recording of every launch (~5 us each on NVIDIA) before
// the device could finish. Here the device runs the captured steps while the capture goes on.
//
// How: every kBundleLaunches captured steps (the first pieces smaller, so the device starts
// sooner; and at end_capture) the caller's thread cuts a
// piece: it resolves everything the piece's recording reads -- the arrays' and fills' buffers,
// copies of the launches' plans, the adstack heaps (grown first, after the pieces in flight are
// submitted: the thread may be reading the old ones), a device buffer for the launches'
// encoded args (filled from the upload ring when the piece is submitted, copied back to the
// readback ring after it for the error words) -- and queues it. A recording thread records each
// piece into a side bundle (rhi::Stream::begin_side_bundle: a command pool per thread) and touches
// nothing else. The caller's next captured step (or end_capture, waiting) executes the recorded
// pieces in order in the runtime's list and submits them: LaunchIds, stats and error words as for a
// launch. A piece whose pipelines lack push descriptors cannot be a bundle: the caller's thread
// records it into the list directly when it submits it (also where no thread could be made).
//
// The caller's thread records the pieces itself (when it submits them) until the capture has
// cut RuntimeOptions::run_threads_after_steps steps: a capture of a few hundred or a couple of
// thousand launches -- a training iteration whose step loops are prepared -- finishes sooner that
// way on the hosts measured (the threads' hand-off, secondary command buffers and the wait for
// the last pieces' recording cost more than the driver's recording saved off the caller); a
// longer one then moves the recording to the threads.
//
// Up to kRunThreads recording threads, each with a side pool of its own, record pieces in any
// order; the caller submits them in cut order (Run::done_ is keyed by it), as many as
// are ready in one submission. What a recording thread reads stays valid: kernels and plans
// are the piece's own copies, buffers belong to arrays a free waits for (Run::drain: cut and
// submit everything first, so the buffers are marked used), heaps are replaced only after
// drain, the args buffer is the piece's. A piece's side bundle is released once it is executed:
// the stream hands it, when that submission completes, to the thread whose pool it came from
// (rhi::Stream::side_threads), so each side pool has one user at a time and a long capture
// holds the command memory of the pieces in flight, not of all it ran (NVIDIA: ~620 MiB for a
// 70,000-launch iteration when every piece's bundle was kept to the end).
#include "runtime/capture_run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <system_error>
#include <unordered_map>

namespace vkad::runtime {

namespace {
double clock_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void Runtime::Graphs::Run::thread_main(Run* r, rhi::Stream* stream, int index) {
  for (;;) {
    std::unique_ptr<Piece> p;
    {
      std::unique_lock<std::mutex> l(r->mu_);
      r->cv_.wait(l, [&] { return r->stop_ || !r->todo_.empty(); });
      if (r->stop_) return;
      p = std::move(r->todo_.front());
      r->todo_.pop_front();
    }
    if (!p->direct) {
      try {
        const double t0 = clock_us();
        p->status = record_piece(*stream, *p, index);
        p->record_us = clock_us() - t0;
      } catch (const std::bad_alloc&) {
        p->status = make_error(ErrorCode::kOutOfHostMemory, "recording a piece: out of memory");
      }
    }
    {
      std::lock_guard<std::mutex> l(r->mu_);
      const uint64_t seq = p->seq;
      r->done_.emplace(seq, std::move(p));
    }
    r->cv_.notify_all();
  }
}

// Recording threads: the driver records a piece in about as long as the device runs it
// (NVIDIA, diffmpm: ~2.3 ms for 512 launches) and the caller cuts one every ~2 ms; two keep up
// with both, a third takes a slow host's variance. Fewer where the machine has fewer cores.
constexpr int kRunThreads = 3;

Result<std::unique_ptr<Runtime::Graphs::Run>> Runtime::Graphs::Run::start(Runtime& rt,
                                                                          Graphs& graphs) {
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  int want = rt.device_->caps().push_descriptor ? std::clamp(hw - 1, 1, kRunThreads) : 0;
  // VKAD_RUN_THREADS=<n> (0 to 8) sets how many, where push descriptors allow any, and
  // VKAD_RUN_THREADS_AFTER=<steps> after how many captured steps they start: how a host's
  // balance between the caller and the recording threads is measured.
  if (const char* env = std::getenv("VKAD_RUN_THREADS"); env != nullptr && want > 0) {
    want = static_cast<int>(std::clamp(std::strtol(env, nullptr, 10), 0L, 8L));
  }
  uint64_t after = rt.options_.run_threads_after_steps;
  if (const char* env = std::getenv("VKAD_RUN_THREADS_AFTER"); env != nullptr) {
    after = std::strtoull(env, nullptr, 10);
  }
  std::unique_ptr<Run> r(new Run(rt, graphs));
  r->trace_ = std::getenv("VKAD_GRAPH_TRACE") != nullptr;
  r->want_threads_ = want;
  r->threads_after_ = after;
  if (want > 0 && after == 0) VKAD_TRY(r->start_threads());
  return r;
}

Status Runtime::Graphs::Run::start_threads() {
  threads_started_ = true;
  // A replay recorded into the open list keeps its side bundles alive up to that list's serial;
  // a graph released since queues them under it. Submit it first, or settle_side_bundles would
  // wait for a serial that is never submitted. (Mid-capture the list holds pieces already
  // executed: submitting it is what pump does anyway.)
  if (rt_.list_.recording()) VKAD_TRY(rt_.submit_list().status());
  VKAD_TRY(rt_.stream_->settle_side_bundles());
  VKAD_TRY(rt_.stream_->ensure_side_pools(want_threads_));
  rt_.stream_->side_threads(true);
  for (int i = 0; i < want_threads_; ++i) {
    try {
      threads_.emplace_back(thread_main, this, rt_.stream_.get(), i);
    } catch (const std::system_error&) {
      break;  // fewer threads (none: the caller's thread records every piece; same results)
    }
  }
  return {};
}

// The piece's steps into a side bundle, as record_steps and record_dispatches record a graph's.
Status Runtime::Graphs::Run::record_piece(rhi::Stream& stream, Piece& p, int pool) {
  VKAD_ASSIGN_OR_RETURN(rhi::CommandList list, stream.begin_side_bundle(pool));
  std::vector<rhi::Buffer*> bindings;
  std::vector<uint64_t> filled;
  VKAD_TRY(record_steps(list, p, bindings, filled));
  VKAD_ASSIGN_OR_RETURN(p.bundle, stream.end_side_bundle(list));
  return {};
}

Status Runtime::Graphs::Run::record_steps(rhi::CommandList& list, Piece& p,
                                          std::vector<rhi::Buffer*>& bindings,
                                          std::vector<uint64_t>& filled) {
  FillBarriers fills(filled);
  for (const Step& s : p.steps) {
    if (!s.kernel) {
      fills.fill(list, *s.fill, s.fill_array, s.pattern, s.wide, s.fill_bytes);
      continue;
    }
    fills.end(list);
    VKAD_TRY(dispatch_into(list, *s.kernel, p.plans[s.plan],
                           {p.arrays.data() + s.arrays, s.kernel->array_count}, p.heaps, p.args,
                           s.args_offset, s.barrier_after, bindings));
  }
  fills.end(list);
  return {};
}

void Runtime::Graphs::Run::after_step() {
  if (outstanding_ > 0) pump(/*wait_all=*/false);  // no lock per step when none is
  // The first pieces are smaller (16, 32, 64, 128, 256 steps, then kBundleLaunches): the device
  // starts after the first 16 steps are captured and recorded, not 512. (From 64 on the H200:
  // wave's first captured iteration 2.28-2.35 -> 2.02-2.32 ms, the race's 2.5 -> 2.1, one call;
  // a few more submissions, ~15 us each, where a capture is long.)
  const uint64_t first =
      std::min<uint64_t>(kBundleLaunches, 16ull << std::min<uint64_t>(next_seq_, 5));
  if (graphs_.capture_->steps.size() - next_step_ >= first) cut();
}

// The heaps steps [begin, end) need, grown where they fall short, and the span of the graph's
// args blob their launches use ([*lo, *hi)). An error goes to the run's.
Status Runtime::Graphs::Run::grow_heaps(size_t begin, size_t end, uint64_t* lo, uint64_t* hi) {
  const Graph& g = *graphs_.capture_;
  std::array<uint64_t, adstack::kHeapCount> need{};
  bool grows = false;
  *lo = UINT64_MAX;
  *hi = 0;
  for (size_t s = begin; s < end; ++s) {
    if (!g.steps[s].first) continue;
    const uint32_t i = g.steps[s].second;
    const CapturedLaunch& c = g.launches[i];
    const CommandPlan& plan = g.plans[c.plan];
    for (size_t h = 0; plan.lp.any_heap_task && h < need.size(); ++h) {
      need[h] = std::max(need[h], plan.lp.heap_need[h]);
      const rhi::Buffer& b = rt_.heaps_.heap(static_cast<uint32_t>(h));
      grows = grows || !b.valid() || b.size() < need[h];
    }
    *lo = std::min(*lo, g.args_offset[i]);
    *hi = std::max(*hi, g.args_offset[i] + c.kernel->args_bytes);
  }
  if (!grows) return {};
  // A thread may be reading the heaps the growth replaces: everything cut so far is recorded
  // and submitted first (the old heaps then retire with the list that used them last).
  pump(/*wait_all=*/true);
  VKAD_TRY(error_);
  return rt_.ensure_heaps(need);
}

// Steps [begin, end) into `p` with what their recording reads: fills' buffers, launches' plans
// (one copy per distinct plan), buffers, args offsets within the piece's.
void Runtime::Graphs::Run::steps_into(Piece& p, size_t begin, size_t end, uint64_t lo) {
  const Graph& g = *graphs_.capture_;
  std::unordered_map<uint32_t, uint32_t> plan_index;  // graph plan -> the piece's copy
  p.steps.reserve(end - begin);
  for (size_t s = begin; s < end; ++s) {
    Step step;
    if (!g.steps[s].first) {
      const CapturedFill& f = g.fills[g.steps[s].second];
      NdArray& a = rt_.arrays_.at(f.array.id);  // alive: a free cuts and submits first
      step.fill = &a.buffer;
      step.fill_array = f.array.id;
      step.fill_bytes = a.bytes;
      step.pattern = f.pattern;
      step.wide = f.wide;
      p.steps.push_back(std::move(step));
      continue;
    }
    const uint32_t i = g.steps[s].second;
    const CapturedLaunch& c = g.launches[i];
    auto [it, fresh] = plan_index.try_emplace(c.plan, static_cast<uint32_t>(p.plans.size()));
    if (fresh) p.plans.push_back(g.plans[c.plan]);
    for (const rhi::ComputePipeline* pipeline : g.plans[c.plan].pipelines) {
      p.direct = p.direct || !pipeline->push_descriptors();
    }
    step.kernel = c.kernel;
    step.plan = it->second;
    step.arrays = static_cast<uint32_t>(p.arrays.size());
    const std::span<rhi::Buffer* const> bufs = graph_arrays(g, c);
    p.arrays.insert(p.arrays.end(), bufs.begin(), bufs.end());
    step.args_offset = g.args_offset[i] - lo;
    step.barrier_after = c.barrier_after;
    step.origin = c.origin;
    p.steps.push_back(std::move(step));
  }
}

void Runtime::Graphs::Run::cut(bool split) {
  const size_t begin = next_step_, end = graphs_.capture_->steps.size();
  next_step_ = end;
  if (begin == end || !error_.ok()) return;
  // The last steps (end_capture, a free) in up to one piece per thread: nothing is cut after
  // them, so their recording is the wait before they run (~3.5 ms for 512 launches on one
  // thread in NVIDIA's driver) -- shared, a third of it.
  constexpr size_t kMinSplitSteps = 64;
  const size_t parts = split ? std::clamp<size_t>((end - begin) / kMinSplitSteps, 1,
                                                  std::max<size_t>(threads_.size(), 1))
                             : 1;
  const double t0 = trace_ ? clock_us() : 0;
  for (size_t i = 0; i < parts && error_.ok(); ++i) {
    cut_range(begin + (end - begin) * i / parts, begin + (end - begin) * (i + 1) / parts);
  }
  if (trace_) cut_us_ += clock_us() - t0;
}

void Runtime::Graphs::Run::cut_range(size_t begin, size_t end) {
  Graph& g = *graphs_.capture_;
  try {
    auto p = std::make_unique<Piece>();
    uint64_t lo = 0, hi = 0;
    if (Status grown = grow_heaps(begin, end, &lo, &hi); !grown.ok()) {
      if (error_.ok()) error_ = grown;
      return;
    }
    for (uint32_t h = 0; h < adstack::kHeapCount; ++h) p->heaps[h] = &rt_.heaps_.heap(h);
    if (hi > lo) {
      Result<rhi::Buffer> args = rt_.device_->create_buffer(
          {hi - lo, rhi::MemoryUsage::kDeviceLocal, "graph '" + g.name + "' run args"});
      if (!args.ok()) {
        error_ = args.status();
        return;
      }
      p->args = std::move(*args);
      p->args_host.assign(g.args_blob.begin() + static_cast<ptrdiff_t>(lo),
                          g.args_blob.begin() + static_cast<ptrdiff_t>(hi));
    }
    if (!threads_started_ && want_threads_ > 0 && begin >= threads_after_) {
      if (Status started = start_threads(); !started.ok()) {
        if (started.code() == ErrorCode::kDeviceLost) {
          error_ = started;
          return;
        }
      }  // otherwise no threads: the caller records the rest
    }
    steps_into(*p, begin, end, lo);
    p->direct = p->direct || threads_.empty();
    p->seq = next_seq_++;
    ++outstanding_;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (p->direct) {
        // The caller's thread records it when its turn to be submitted comes.
        const uint64_t seq = p->seq;
        done_.emplace(seq, std::move(p));
      } else {
        todo_.push_back(std::move(p));
      }
    }
    cv_.notify_all();
  } catch (const std::bad_alloc&) {
    error_ = make_error(ErrorCode::kOutOfHostMemory, "cutting a piece: out of memory");
  }
}

void Runtime::Graphs::Run::pump(bool wait_all) {
  // Every piece recorded and next in cut order goes into the list, then one submission.
  bool executed = false;
  auto submit = [&] {
    const double t0 = trace_ ? clock_us() : 0;
    Result<rhi::StreamSemaphore> sem = rt_.submit_list();
    if (!sem.ok() && error_.ok()) error_ = sem.status();
    executed = false;
    if (trace_) queue_us_ += clock_us() - t0;
  };
  for (;;) {
    std::unique_ptr<Piece> p;
    {
      std::unique_lock<std::mutex> l(mu_);
      auto ready = [&] { return !done_.empty() && done_.begin()->first == next_submit_; };
      if (wait_all && !ready() && outstanding_ > 0) {
        if (executed) {  // the device starts on what is in the list while the rest records
          l.unlock();
          submit();
          l.lock();
        }
        const double t0 = trace_ ? clock_us() : 0;
        cv_.wait(l, [&] { return ready() || outstanding_ == 0; });
        if (trace_) wait_us_ += clock_us() - t0;
      }
      if (!ready()) break;
      p = std::move(done_.begin()->second);
      done_.erase(done_.begin());
    }
    ++next_submit_;
    --outstanding_;
    if (error_.ok()) {
      const double t0 = trace_ ? clock_us() : 0;
      submit_piece(*p);
      executed = true;
      if (trace_) submit_us_ += clock_us() - t0, record_us_ += p->record_us;
    }
    // Executed or not, the piece's side bundle goes back now (freed by its thread once the
    // submission that executed it completed).
    p.reset();
  }
  if (executed) submit();
}

void Runtime::Graphs::Run::submit_piece(Piece& p) {
  if (!p.status.ok()) {
    if (p.status.code() == ErrorCode::kDeviceLost) rt_.device_->mark_lost();
    error_ = p.status;
    return;
  }
  Status s = rt_.ensure_list();
  const uint64_t bytes = p.args_host.size();
  if (s.ok() && bytes > 0) {  // the args in (a fresh buffer: nothing earlier to wait for)
    Result<HostRing::Slot> up =
        rt_.upload_ring_->allocate(*rt_.device_, bytes, &rt_.ctx_buffers_.upload_chunks);
    s = up.status();
    if (s.ok()) {
      std::memcpy(up->data, p.args_host.data(), bytes);
      rt_.list_.copy(*up->buffer, p.args, bytes, up->offset, 0);
    }
  }
  // After the copy, and what was recorded before the capture (host copies into arrays).
  if (s.ok()) rt_.list_.barrier(rhi::Barrier::kTransferToCompute);
  if (s.ok() && p.direct) {
    s = record_steps(rt_.list_, p, rt_.bindings_,
                     graphs_.filled_scratch_);  // straight into the list
  } else if (s.ok()) {
    rt_.list_.execute(p.bundle);
    ++rt_.stats_.run_pieces_recorded_aside;
  }
  // The error words out, read when this list retires.
  const std::byte* down = nullptr;
  if (s.ok() && bytes > 0) {
    Result<HostRing::Slot> slot =
        rt_.readback_ring_->allocate(*rt_.device_, bytes, &rt_.ctx_buffers_.readback_chunks);
    s = slot.status();
    if (s.ok()) {
      rt_.list_.barrier(rhi::Barrier::kComputeToTransfer);
      rt_.list_.copy(p.args, *slot->buffer, bytes, 0, slot->offset);
      rt_.list_.barrier(rhi::Barrier::kTransferToCompute);
      down = slot->data;
    }
  }
  if (!s.ok()) {
    error_ = s;
    return;
  }
  for (const Step& st : p.steps) {
    if (!st.kernel) continue;
    rt_.ctx_buffers_.flags.push_back(
        {down + st.args_offset, st.kernel, LaunchId{++rt_.next_launch_}, 0, 0, st.origin});
    rt_.count_launch(p.plans[st.plan], st.barrier_after);
  }
  ++rt_.stats_.run_pieces;
  if (p.args.valid()) {
    rt_.ctx_bytes_ += 2 * bytes;
    rt_.ctx_buffers_.buffers.push_back(std::move(p.args));  // released when this list retires
  }
}

Status Runtime::Graphs::Run::drain() {
  cut(/*split=*/true);
  pump(/*wait_all=*/true);
  return error_;
}

Status Runtime::Graphs::Run::finish() {
  Status s = drain();
  if (trace_) {
    std::fprintf(stderr,
                 "vkad graph '%s' run: %llu pieces; caller: cut %.2f ms, pieces into the list "
                 "%.2f ms, submissions %.2f ms, waited for recordings %.2f ms; recording threads "
                 "(%zu): %.2f ms\n",
                 graphs_.capture_->name.c_str(), static_cast<unsigned long long>(next_seq_),
                 cut_us_ / 1e3, submit_us_ / 1e3, queue_us_ / 1e3, wait_us_ / 1e3, threads_.size(),
                 record_us_ / 1e3);
  }
  stop();
  return s;
}

Runtime::Graphs::Run::~Run() { stop(); }

// Idempotent: finish stops, then the graph's end_capture drops the Run.
void Runtime::Graphs::Run::stop() noexcept {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  // Unsubmitted pieces (never executed) go back to the side pools, and the bundles handed to
  // the threads are freed, now that no thread records from them.
  todo_.clear();
  done_.clear();
  if (threads_started_) rt_.stream_->side_threads(false);
}

}  // namespace vkad::runtime
