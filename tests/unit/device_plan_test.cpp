#include "rhi/device_plan.h"

#include <gtest/gtest.h>
#include <vulkan/vulkan.h>

#include "rhi/device.h"

namespace vkad::rhi {
namespace {

constexpr uint32_t k12 = VK_API_VERSION_1_2;
constexpr uint32_t k11 = VK_API_VERSION_1_1;

std::vector<PhysicalDeviceInfo> sample() {
  return {{"llvmpipe (LLVM 15)", DeviceKind::kCpu, k12, true},
          {"Intel UHD", DeviceKind::kIntegratedGpu, k12, true},
          {"NVIDIA H100", DeviceKind::kDiscreteGpu, k12, true}};
}

TEST(ChooseDevice, PrefersDiscreteThenIntegratedThenCpu) {
  DeviceSelection sel{"", k12};
  EXPECT_EQ(*choose_device(sample(), sel), 2u);
  auto no_discrete = sample();
  no_discrete.pop_back();
  EXPECT_EQ(*choose_device(no_discrete, sel), 1u);
  no_discrete.pop_back();
  EXPECT_EQ(*choose_device(no_discrete, sel), 0u) << "lavapipe is the fallback";
}

TEST(ChooseDevice, SkipsDevicesBelowMinimumVersionOrWithoutCompute) {
  auto d = sample();
  d[2].api_version = k11;
  d[1].has_compute_queue = false;
  EXPECT_EQ(*choose_device(d, {"", k12}), 0u);
}

TEST(ChooseDevice, ForcedByIndexOrNameSubstring) {
  EXPECT_EQ(*choose_device(sample(), {"0", k12}), 0u);
  EXPECT_EQ(*choose_device(sample(), {"llvm", k12}), 0u);
  EXPECT_EQ(*choose_device(sample(), {"h100", k12}), 2u) << "case-insensitive";
}

TEST(ChooseDevice, ForcedErrorsNameTheProblem) {
  auto r = choose_device(sample(), {"7", k12});
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.status().message().find("3 device(s)"), std::string::npos);
  // Past unsigned long (std::stoul threw out_of_range through every caller, C ABI included):
  // the same answer as any index past the end.
  for (const char* huge : {"99999999999999999999999", "18446744073709551616",
                           "000000000000000000000000000000000003"}) {
    r = choose_device(sample(), {huge, k12});
    EXPECT_EQ(r.status().code(), ErrorCode::kNotFound) << huge;
    EXPECT_NE(r.status().message().find(std::string("device index ") + huge + " out of range"),
              std::string::npos)
        << r.status().message();
  }
  r = choose_device(sample(), {"radeon", k12});
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.status().message().find("NVIDIA H100"), std::string::npos) << "lists what exists";
  auto old = sample();
  old[2].api_version = k11;
  r = choose_device(old, {"H100", k12});
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(r.status().message().find("1.1"), std::string::npos);
}

TEST(DeviceUuid, FormatsAndParsesTheFormsToolsPrint) {
  DeviceUuid u{};
  for (size_t i = 0; i < u.size(); ++i) u[i] = static_cast<uint8_t>(0x10 * i + 0xa);
  const std::string text = format_uuid(u);
  EXPECT_EQ(text, "0a1a2a3a-4a5a-6a7a-8a9a-aabacadaeafa");
  EXPECT_EQ(parse_uuid(text), u);
  EXPECT_EQ(parse_uuid("GPU-" + text), u) << "nvidia-smi -L";
  EXPECT_EQ(parse_uuid("gpu-0A1A2A3A4A5A6A7A8A9AAABACADAEAFA"), u) << "no dashes, upper case";
  EXPECT_FALSE(parse_uuid("0a1a2a3a-4a5a-6a7a-8a9a-aabacadaeaf").has_value()) << "31 digits";
  EXPECT_FALSE(parse_uuid(text + "0").has_value()) << "33 digits";
  EXPECT_FALSE(parse_uuid("0g1a2a3a-4a5a-6a7a-8a9a-aabacadaeafa").has_value()) << "not hex";
  EXPECT_FALSE(parse_uuid("H100").has_value());
  EXPECT_FALSE(parse_uuid("0").has_value()) << "an index stays an index";
}

TEST(ChooseDevice, ForcedByUuid) {
  auto d = sample();
  for (size_t i = 0; i < d.size(); ++i) d[i].uuid.fill(static_cast<uint8_t>(i + 1));
  d.push_back(d[2]);  // a second H100, told apart only by its UUID
  d[3].uuid.fill(0xee);
  EXPECT_EQ(*choose_device(d, {format_uuid(d[3].uuid), k12}), 3u);
  EXPECT_EQ(*choose_device(d, {"GPU-" + format_uuid(d[2].uuid), k12}), 2u);
  DeviceUuid absent;
  absent.fill(0x77);
  auto r = choose_device(d, {format_uuid(absent), k12});
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.status().message().find("no device has UUID 77777777-"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("eeeeeeee-eeee-eeee-eeee-eeeeeeeeeeee ('NVIDIA H100')"),
            std::string::npos)
      << "lists what exists: " << r.status().message();
}

TEST(ChooseDevice, NoDevicesIsNoDevice) {
  EXPECT_EQ(choose_device({}, {}).status().code(), ErrorCode::kNoDevice);
}

TEST(ChooseMemoryType, PicksRequiredAndPreferredFlags) {
  constexpr uint32_t DL = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
  constexpr uint32_t HV = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
  constexpr uint32_t HC = VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  constexpr uint32_t CA = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
  std::vector<MemoryTypeInfo> types = {{DL | HV | HC, 0}, {DL, 0}, {HV | HC, 1}, {HV | HC | CA, 1}};
  EXPECT_EQ(choose_memory_type(types, 0xF, 0, DL), 1) << "plain device-local over BAR memory";
  EXPECT_EQ(choose_memory_type(types, 0xF, HV | HC, CA), 3) << "cached for readback";
  EXPECT_EQ(choose_memory_type(types, 0xF, HV | HC, 0), 2) << "upload: fewest extra flags";
  EXPECT_EQ(choose_memory_type(types, 0x2, HV, 0), -1) << "type bits exclude host-visible";
  EXPECT_EQ(choose_memory_type(types, 0x1, HV | HC, CA), 0) << "required beats preferred";
}

TEST(SharedBlockBytes, HostOnlyMemoryStartsSmallAndDoublesDeviceLocalGetsTheConfiguredSize) {
  constexpr uint32_t DL = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
  constexpr uint32_t HV = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
  constexpr uint32_t HC = VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  constexpr uint64_t MiB = 1ull << 20, cfg = 64 * MiB;
  EXPECT_EQ(shared_block_bytes(DL, cfg, 0, 256 << 10), cfg) << "a GPU's own memory";
  EXPECT_EQ(shared_block_bytes(DL | HV | HC, cfg, 0, 256 << 10), cfg) << "lavapipe, BAR memory";
  // A discrete GPU's staging memory: the first block small, then doubling per live block.
  EXPECT_EQ(shared_block_bytes(HV | HC, cfg, 0, 256 << 10), kFirstHostBlockBytes);
  EXPECT_EQ(shared_block_bytes(HV | HC, cfg, 1, 256 << 10), 2 * kFirstHostBlockBytes);
  EXPECT_EQ(shared_block_bytes(HV | HC, cfg, 3, 256 << 10), 8 * kFirstHostBlockBytes);
  EXPECT_EQ(shared_block_bytes(HV | HC, cfg, 40, 256 << 10), cfg) << "capped at the configured";
  // Never below the request (a shared request is at most half the configured size).
  EXPECT_EQ(shared_block_bytes(HV | HC, cfg, 0, 10 * MiB), 16 * MiB);
  EXPECT_EQ(shared_block_bytes(HV | HC, cfg, 0, 32 * MiB + 1), cfg);
  // A configured size at or below the first block's is kept as it is.
  EXPECT_EQ(shared_block_bytes(HV | HC, 2 * MiB, 0, 1024), 2 * MiB);
}

TEST(CheckRequiredFeatures, NamesTheMissingFeatureAndRejectsUnknownNames) {
  Capabilities caps;
  caps.device_name = "testdev";
  caps.shader_float64 = true;
  EXPECT_TRUE(check_required_features(caps, {"float64"}).ok());
  Status s = check_required_features(caps, {"float64", "atomic_float32_add"});
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_NE(s.message().find("atomic_float32_add"), std::string::npos);
  EXPECT_NE(s.message().find("testdev"), std::string::npos);
  EXPECT_EQ(check_required_features(caps, {"warp_drive"}).code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace vkad::rhi
