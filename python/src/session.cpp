// Binds vkad.Session: its creation, synchronisation, statistics, device queries and close.
#include <optional>
#include <string>
#include <vector>

#include "binding.h"
#include "rhi/device.h"

using namespace nb::literals;

namespace vkad_py {

Session::Session(nb::handle device, bool validation, size_t retirement_depth,
                 uint32_t spare_memory_blocks, std::optional<std::string> cache_dir,
                 bool specialize_shapes, bool check_finite) {
  vkad::SessionOptions o;
  o.compile.specialize_shapes = specialize_shapes;
  o.compile.check_finite = check_finite;
  if (!device.is_none()) o.device = nb::str(device).c_str();
  o.validation = validation;
  o.retirement_depth = retirement_depth;
  o.spare_memory_blocks = spare_memory_blocks;
  o.cache_dir = std::move(cache_dir);
  Result<std::unique_ptr<vkad::Session>> r = [&] {
    nb::gil_scoped_release release;
    return vkad::Session::create(o);
  }();
  st->session = take(std::move(r));
}

void Session::flush() {
  check(blocking(*st, [](vkad::Session& s) { return s.flush(); }));
}

void Session::synchronize() {
  check(blocking(*st, [](vkad::Session& s) { return s.synchronize(); }));
}

void Session::release_idle_memory() {
  check(blocking(*st, [](vkad::Session& s) { return s.release_idle_memory(); }));
}

void Session::reset_memory_peaks() {
  check(blocking(*st, [](vkad::Session& s) { return s.reset_memory_peaks(); }));
}

void Session::close() {
  nb::gil_scoped_release release;  // destruction waits for this session's work
  std::lock_guard<std::mutex> l(st->mu);
  st->drain_pending();
  {
    // The tapes' gradients and copies are the session's: freed now, while it lives.
    std::lock_guard<std::mutex> p(st->pending_mu);
    for (Tape* t : st->tapes) t->tape.reset();
  }
  if (st->session) st->session->set_print_sink(nullptr);  // stdout from here: no GIL held
  // DLPack consumers still hold its memory: the last one's deleter destroys it.
  if (st->exports > 0 && st->session) {
    st->closing = std::move(st->session);
    return;
  }
  st->session.reset();
  st->cuda.reset();
}

nb::dict Session::stats() {
  Locked l(*st);
  vkad::SessionStats s = take(st->get().stats());
  nb::dict d;
  d["launches"] = s.launches;
  d["dispatches"] = s.dispatches;
  d["barriers"] = s.barriers;
  d["flushes"] = s.flushes;
  d["forced_waits"] = s.forced_waits;
  d["forced_wait_us"] = static_cast<uint64_t>(s.forced_wait_ms * 1e3);
  d["ndarrays"] = s.ndarrays;
  d["kernels_cached"] = s.kernels_cached;
  d["kernels_compiled"] = s.kernels_compiled;
  d["compile_cache_hits"] = s.compile_cache_hits;
  d["rolled_launches"] = s.rolled_launches;
  d["blocked_launches"] = s.blocked_launches;
  d["rolled_loops"] = s.rolled_loops;
  d["reworked_loops"] = s.reworked_loops;
  d["recomputed_launches"] = s.recomputed_launches;
  d["memory_block_bytes"] = s.memory_block_bytes;
  d["memory_used_bytes"] = s.memory_used_bytes;
  d["memory_peak_block_bytes"] = s.memory_peak_block_bytes;
  d["memory_peak_used_bytes"] = s.memory_peak_used_bytes;
  d["adstack_heap_bytes"] = s.adstack_heap_bytes;
  d["vulkan_objects_created"] = s.vulkan_objects_created;
  d["disk_cache_hits"] = s.disk_cache_hits;
  d["disk_cache_misses"] = s.disk_cache_misses;
  d["disk_cache_rebuilt"] = s.disk_cache_rebuilt;
  d["pipeline_cache_loaded"] = s.pipeline_cache_loaded ? 1 : 0;
  d["pipelines_created"] = s.pipelines_created;
  d["pipeline_create_us"] = static_cast<uint64_t>(s.pipeline_create_ms * 1e3);
  d["user_bytes"] = s.user_bytes;
  d["runtime_bytes"] = s.runtime_bytes;
  d["args_ring_bytes"] = s.args_ring_bytes;
  d["readback_ring_bytes"] = s.readback_ring_bytes;
  d["spare_block_bytes"] = s.spare_block_bytes;
  d["ndarray_pool_bytes"] = s.ndarray_pool_bytes;
  d["live_buffers"] = s.live_buffers;
  return d;
}

std::vector<std::string> Session::validation_messages() {
  Locked l(*st);
  return st->get().runtime().device().validation_messages();
}

std::string Session::device_name() { return st->get().device_name(); }

std::string Session::device_uuid() { return st->get().device_uuid(); }

nb::dict Session::capabilities() {
  const vkad::rhi::Capabilities& c = st->get().runtime().caps();
  nb::dict d;
  d["float64"] = c.shader_float64;
  d["int64"] = c.shader_int64;
  d["atomic_float32_add"] = c.atomic_float32_add;
  d["atomic_float64_add"] = c.atomic_float64_add && c.shader_float64;
  d["subgroup_size"] = c.subgroup_size;
  d["subgroup_arithmetic"] = c.subgroup_arithmetic;
  d["subgroup_shuffle"] = c.subgroup_shuffle;
  d["max_workgroup_invocations"] = c.max_workgroup_invocations;
  return d;
}

nb::class_<Session> bind_session(nb::module_& m) {
  static_assert(vkad::runtime::kDefaultRetirementDepth == 3, "the signature below says 3");
  nb::class_<Session> session(m, "Session", "A device, its kernels and ndarrays (vkad::Session).");
  session
      .def(nb::init<nb::handle, bool, size_t, uint32_t, std::optional<std::string>, bool, bool>(),
           "device"_a = nb::none(), "validation"_a = false,
           "retirement_depth"_a = vkad::runtime::kDefaultRetirementDepth,
           "spare_memory_blocks"_a = 1, "cache_dir"_a = nb::none(), "specialize_shapes"_a = true,
           "check_finite"_a = false,
           nb::sig("def __init__(self, device: int | str | None = None, validation: bool = False, "
                   "retirement_depth: int = 3, spare_memory_blocks: int = 1, "
                   "cache_dir: str | None = None, specialize_shapes: bool = True, "
                   "check_finite: bool = False) -> None"),
           "cache_dir: the on-disk kernel and pipeline caches' directory; None = automatic "
           "(VKAD_CACHE=0 turns them off, else VKAD_CACHE_DIR, else $XDG_CACHE_HOME/vkad, else "
           "~/.cache/vkad), \"\" = off. specialize_shapes: besides its generic pipeline, each "
           "kernel gets one per set of array shapes it is launched with (made on a thread while "
           "the first launch runs the generic one; up to 8 per task), its extents constants "
           "(docs/caches.md, 'Kernels specialized to their shapes'); VKAD_SPECIALIZE_SHAPES=0 "
           "turns it off for every session. check_finite: every float value a kernel (forward "
           "or adjoint) stores into an array is checked; the first NaN or infinity is a "
           "vkad.DeviceError naming the kernel and the statement (docs/debugging.md; also "
           "VKAD_CHECK_FINITE=1).")
      .def_prop_ro("device_name", &Session::device_name)
      .def_prop_ro("device_uuid", &Session::device_uuid,
                   "The device's UUID, as vkad.devices() lists it (on NVIDIA the CUDA UUID).")
      .def_prop_ro("capabilities", &Session::capabilities,
                   nb::sig("def capabilities(self) -> dict[str, bool | int]"),
                   "What the device offers kernels: float64, int64, atomic_float32_add / "
                   "atomic_float64_add (hardware float atomic adds: without them vkad adds by "
                   "compare-and-swap), subgroup_size, "
                   "subgroup_arithmetic, subgroup_shuffle (ballot and relative shuffles), "
                   "max_workgroup_invocations.")
      .def("flush", &Session::flush)
      .def("synchronize", &Session::synchronize,
           "Waits for everything submitted (GIL released); raises device errors.")
      .def("close", &Session::close, "Waits for this session's work and frees the device.")
      .def("stats", &Session::stats, nb::sig("def stats(self) -> dict[str, int]"))
      .def("release_idle_memory", &Session::release_idle_memory,
           "Waits like synchronize(), then returns the runtime's idle memory (rings, adstack "
           "heaps, spare memory blocks) to the driver; arrays, kernels and graphs are kept. "
           "stats() tells the user's memory (user_bytes) from the runtime's (runtime_bytes).")
      .def("reset_memory_peaks", &Session::reset_memory_peaks,
           "Starts stats()' memory_peak_block_bytes and memory_peak_used_bytes again from what "
           "is held now (the most held at once since: to measure one phase of a program).")
      .def("validation_messages", &Session::validation_messages);
  return session;
}

}  // namespace vkad_py
