// Runtime's calls for sharing an ndarray's memory (Runtime::Interop, runtime/interop.h;
// the Python package's DLPack exchange): where the bytes are, the serial of their last use,
// waiting for it, host views, and the exports a device without exportable memory refuses.
#include <cstring>
#include <vector>

#include "gpu/gpu_test.h"
#include "runtime/interop.h"
#include "runtime/runtime.h"

namespace vkad::testing {
namespace {

using runtime::DType;
using runtime::Runtime;

std::unique_ptr<Runtime> make_runtime() {
  runtime::RuntimeOptions o;
  o.device.enable_validation = true;
  o.max_list_age_us = 1e12;
  auto r = Runtime::create(o);
  if (!r.ok()) return nullptr;
  return std::move(r).value();
}

TEST(NdArrayExport, MemoryNamesTheBlockAndTheLastUseAndTheWaitMakesWritesVisible) {
  auto rt = make_runtime();
  if (!rt) GTEST_SKIP() << "no Vulkan device";
  auto a = rt->create_ndarray(DType::kF32, {1000}, "a");
  auto b = rt->create_ndarray(DType::kF32, {10}, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  auto fresh = rt->interop().ndarray_memory(*a);
  ASSERT_TRUE(fresh.ok()) << fresh.status().to_string();
  EXPECT_EQ(fresh->last_use, rhi::kNoSerial);  // nothing used it yet
  EXPECT_EQ(fresh->bytes, 4000u);
  EXPECT_GT(fresh->block_id, 0u);
  EXPECT_LE(fresh->offset + fresh->bytes, fresh->block_bytes);
  auto mb = rt->interop().ndarray_memory(*b);
  ASSERT_TRUE(mb.ok());
  EXPECT_EQ(mb->block_id, fresh->block_id);  // both carved from one 64 MiB block
  EXPECT_NE(mb->offset, fresh->offset);

  ASSERT_TRUE(rt->fill(*a, 2.5).ok());           // recorded, not submitted
  auto used = rt->interop().ndarray_memory(*a);  // submits it
  ASSERT_TRUE(used.ok());
  EXPECT_NE(used->last_use, rhi::kNoSerial);
  auto other = rt->interop().ndarray_memory(*b);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->last_use, rhi::kNoSerial);  // the fill did not touch b
  if (used->host == nullptr) GTEST_SKIP() << "device memory is not host-visible here";
  ASSERT_TRUE(rt->interop().wait_ndarray(*a).ok());
  std::vector<float> seen(1000);
  std::memcpy(seen.data(), used->host, 4000);
  EXPECT_EQ(seen, std::vector<float>(1000, 2.5f));
  // A host write through the held view is what the next submission reads.
  ASSERT_TRUE(rt->interop().hold_host_view(*a).ok());
  const float v = 7.0f;
  std::memcpy(used->host + size_t{4} * 999, &v, 4);
  auto c = rt->create_ndarray(DType::kF32, {1000}, "c");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(rt->copy(*a, *c).ok());
  std::vector<float> out(1000);
  ASSERT_TRUE(rt->download(*c, out.data(), 4000).ok());
  EXPECT_EQ(out[999], 7.0f);
  EXPECT_EQ(out[0], 2.5f);
  rt->interop().release_host_view(*a);
  rt->interop().release_host_view(*a);  // an extra release is ignored
  EXPECT_EQ(rt->device().validation_message_count(), 0u);
}

TEST(NdArrayExport, FdsAreRefusedWhereMemoryIsNotExportable) {
  auto rt = make_runtime();
  if (!rt) GTEST_SKIP() << "no Vulkan device";
  auto a = rt->create_ndarray(DType::kF32, {4}, "a");
  ASSERT_TRUE(a.ok());
  auto m = rt->interop().ndarray_memory(*a);
  ASSERT_TRUE(m.ok());
  if (rt->caps().export_memory_fd) GTEST_SKIP() << "this device exports its memory";
  EXPECT_FALSE(m->exportable);
  auto fd = rt->interop().export_ndarray_fd(*a);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(fd.status().message().find("not exportable"), std::string::npos)
      << fd.status().message();
  auto sem = rt->interop().export_timeline_fd();
  ASSERT_FALSE(sem.ok());
  EXPECT_EQ(sem.status().code(), ErrorCode::kUnsupported);
  // Dead handles are named, as everywhere.
  ASSERT_TRUE(rt->free_ndarray(*a).ok());
  auto dead = rt->interop().ndarray_memory(*a);
  ASSERT_FALSE(dead.ok());
  EXPECT_EQ(dead.status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(rt->interop().hold_host_view(*a).code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace vkad::testing
