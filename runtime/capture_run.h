// A capture that runs what it captures (Runtime::Graphs::begin_capture's `run`, graphs.h; how
// and why: runtime/capture_run.cpp). Internal to the runtime: graph.cpp and runtime.cpp hold one
// while such a capture is open.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/graphs.h"

namespace vkad::runtime {

class Runtime::Graphs::Run {
 public:
  // begin_capture's: side pools made, recording threads started. `graphs` has its capture open.
  static Result<std::unique_ptr<Run>> start(Runtime& rt, Graphs& graphs);
  ~Run();  // stops the threads, drops the pieces not submitted
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  void after_step();             // a step was captured: submit, cut
  void cut(bool split = false);  // the steps not in a piece yet (split: one per thread)
  Status drain();                // cut, then submit everything (before a free)
  Status finish();               // end_capture's: the rest, the threads stopped

 private:
  // A piece is a run of captured steps with everything its recording reads resolved when it is
  // cut (buffers, plans, heaps, args): the recording thread touches nothing else of the runtime.
  struct Step {
    std::shared_ptr<const Kernel> kernel;  // null: a fill
    uint32_t plan = 0;                     // Piece::plans
    uint32_t arrays = 0;                   // Piece::arrays[arrays, + kernel->array_count)
    uint64_t args_offset = 0;              // in Piece::args
    bool barrier_after = true;
    rhi::Buffer* fill = nullptr;  // a fill's buffer, its array, bytes and pattern
    uint64_t fill_array = 0;
    uint64_t fill_bytes = 0;
    uint64_t pattern = 0;
    bool wide = false;    // CapturedFill::wide
    LaunchOrigin origin;  // a launch's CapturedLaunch::origin
  };
  struct Piece {
    std::vector<Step> steps;
    std::vector<CommandPlan> plans;
    std::vector<rhi::Buffer*> arrays;
    std::array<rhi::Buffer*, adstack::kHeapCount> heaps{};
    // The launches' encoded args: copied at submission into `args`, a device buffer of the
    // piece's (read by every workgroup: host memory would put a PCIe read on each dependent
    // launch), and back out for the error words, as a graph's replay does.
    std::vector<std::byte> args_host;
    rhi::Buffer args;
    uint64_t seq = 0;      // cut order: submitted in it
    bool direct = false;   // recorded into the runtime's list (a pipeline without push descriptors)
    rhi::Bundle bundle;    // the recording's result
    double record_us = 0;  // the recording thread's time on it (VKAD_GRAPH_TRACE)
    Status status;
  };

  Run(Runtime& rt, Graphs& graphs) : rt_(rt), graphs_(graphs) {}
  // Recording thread `index` (side pool `index`).
  static void thread_main(Run* run, rhi::Stream* stream, int index);
  static Status record_piece(rhi::Stream& stream, Piece& piece, int pool);
  // A piece's steps into `list` (a side bundle, or the runtime's list for a direct piece).
  static Status record_steps(rhi::CommandList& list, Piece& piece,
                             std::vector<rhi::Buffer*>& bindings, std::vector<uint64_t>& filled);
  void cut_range(size_t begin, size_t end);  // steps [begin, end) as one piece
  Status grow_heaps(size_t begin, size_t end, uint64_t* lo, uint64_t* hi);  // cut_range's
  void steps_into(Piece& piece, size_t begin, size_t end, uint64_t lo);
  // The recording threads and their side pools, made when the capture has cut threads_after_
  // steps (start: at once where that is 0). Where they cannot be made every piece is recorded
  // on the caller's thread (same results); a device loss goes to error_.
  Status start_threads();
  void pump(bool wait_all);         // submits recorded pieces (all outstanding: wait_all)
  void submit_piece(Piece& piece);  // executes it into the list (submitted by pump)
  void stop() noexcept;             // stops the threads, drops what is not submitted

  Runtime& rt_;
  Graphs& graphs_;  // its capture_ is the one this runs
  // Shared with the recording threads, under mu:
  std::mutex mu_;
  std::condition_variable cv_;  // a piece queued (todo), recorded (done), or stop
  std::deque<std::unique_ptr<Piece>> todo_;
  std::map<uint64_t, std::unique_ptr<Piece>> done_;  // by seq: recorded in any order
  bool stop_ = false;
  // The caller's thread only:
  std::vector<std::thread> threads_;  // none: the caller's thread records every piece
  int want_threads_ = 0;              // how many start_threads makes (0: none ever)
  uint64_t threads_after_ = 0;        // steps cut before start_threads runs
  bool threads_started_ = false;      // start_threads ran (threads_ may still be empty)
  uint64_t next_seq_ = 0, next_submit_ = 0;
  size_t outstanding_ = 0;  // pieces cut, not submitted yet
  size_t next_step_ = 0;    // the first captured step not in a piece
  Status error_;            // the first piece that failed: nothing after it runs
  // VKAD_GRAPH_TRACE: where the caller's time went (us), printed by finish.
  bool trace_ = false;
  double cut_us_ = 0, submit_us_ = 0, queue_us_ = 0, wait_us_ = 0, record_us_ = 0;
};

}  // namespace vkad::runtime
