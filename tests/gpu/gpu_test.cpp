#include "gpu/gpu_test.h"

#include <cstring>

#include "abi/spirv_tools.h"

namespace vkad::testing {

std::vector<uint32_t> assemble(const std::string& text) {
  auto words = codegen::assemble_spirv(text);
  EXPECT_TRUE(words.ok()) << words.status().to_string();
  return words.ok() ? std::move(words).value() : std::vector<uint32_t>{};
}

Result<std::unique_ptr<rhi::Device>> GpuTest::make_device(rhi::DeviceOptions options) {
  options.enable_validation = true;
  return rhi::Device::create(options);
}

void GpuTest::SetUp() {
  auto d = make_device();
  if (!d.ok() && d.status().code() == ErrorCode::kNoDevice) {
    GTEST_SKIP() << "SKIPPED: no Vulkan device (" << d.status().message() << ")";
  }
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  device_ = std::move(d).value();
}

void GpuTest::TearDown() {
  if (!device_) return;
  EXPECT_EQ(device_->validation_message_count(), 0u) << [&] {
    std::string all;
    for (const auto& m : device_->validation_messages()) all += m + "\n";
    return all;
  }();
}

rhi::Buffer upload_u32(rhi::Device& device, rhi::Stream& stream, const std::vector<uint32_t>& data,
                       const std::string& name) {
  uint64_t bytes = data.size() * 4;
  auto dst = device.create_buffer({bytes, rhi::MemoryUsage::kDeviceLocal, name});
  auto staging = device.create_buffer({bytes, rhi::MemoryUsage::kUpload, name + " staging"});
  EXPECT_TRUE(dst.ok() && staging.ok());
  std::memcpy(staging->mapped(), data.data(), bytes);
  auto list = stream.begin();
  EXPECT_TRUE(list.ok());
  list->copy(*staging, *dst, bytes);
  list->barrier(rhi::Barrier::kTransferToCompute);
  auto sem = stream.submit(*list);
  EXPECT_TRUE(sem.ok());
  EXPECT_TRUE(sem->wait());
  return std::move(dst).value();
}

std::vector<uint32_t> download_u32(rhi::Device& device, rhi::Stream& stream, rhi::Buffer& buffer) {
  auto rb = device.create_buffer({buffer.size(), rhi::MemoryUsage::kReadback, "readback"});
  EXPECT_TRUE(rb.ok());
  auto list = stream.begin();
  EXPECT_TRUE(list.ok()) << list.status().to_string();
  list->barrier(rhi::Barrier::kComputeToTransfer);
  list->copy(buffer, *rb, buffer.size());
  list->barrier(rhi::Barrier::kToHost);
  auto sem = stream.submit(*list);
  EXPECT_TRUE(sem.ok());
  EXPECT_TRUE(sem->wait());
  std::vector<uint32_t> out(buffer.size() / 4);
  std::memcpy(out.data(), rb->mapped(), buffer.size());
  return out;
}

}  // namespace vkad::testing
