// Shared fixture for GPU tests: a validated device (skips visibly when there is none), a
// SPIR-V assembler (kernels are built in-process from text, never checked-in binaries), and a
// teardown that fails the test on any validation message.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "rhi/buffer.h"
#include "rhi/command_list.h"
#include "rhi/device.h"
#include "rhi/pipeline.h"
#include "rhi/stream.h"
#include "support/sample_kernels.h"

namespace vkad::testing {

// Assembles SPIR-V text for Vulkan 1.2 (SPIR-V 1.5); fails the test on a syntax error.
std::vector<uint32_t> assemble(const std::string& text);

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  // Creates a device with validation on; skips the test when no Vulkan device exists.
  Result<std::unique_ptr<rhi::Device>> make_device(rhi::DeviceOptions options = {});

  std::unique_ptr<rhi::Device> device_;
};

// Uploads `data` to a new device-local buffer through a staging buffer (waits).
rhi::Buffer upload_u32(rhi::Device& device, rhi::Stream& stream, const std::vector<uint32_t>& data,
                       const std::string& name);
// Reads a buffer back through a readback buffer (waits).
std::vector<uint32_t> download_u32(rhi::Device& device, rhi::Stream& stream, rhi::Buffer& buffer);

}  // namespace vkad::testing
