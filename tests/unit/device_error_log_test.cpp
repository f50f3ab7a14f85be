// runtime/device_error_log.h on the host: error words in synthetic args buffers, merged per
// (kernel, task, error), reported once with their launches.
#include "runtime/device_error_log.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace vkad::runtime {
namespace {

abi::CompiledKernel two_tasks() {
  abi::CompiledKernel k;
  k.name = "k";
  k.params = {{"x", abi::ParamKind::kNdArray, abi::DType::kF32, 1, true}};
  k.tasks.resize(2);
  k.tasks[0].name = "a";
  k.tasks[1].name = "b";
  return k;
}

std::vector<std::byte> args_with(const abi::CompiledKernel& k, uint32_t word_a, uint32_t word_b) {
  std::vector<std::byte> buf(k.args_bytes());
  std::memcpy(buf.data() + k.error_flag_offset(0), &word_a, 4);
  std::memcpy(buf.data() + k.error_flag_offset(1), &word_b, 4);
  return buf;
}

TEST(DeviceErrorLog, MergesPerTaskAndErrorAndReportsOnce) {
  abi::CompiledKernel k = two_tasks();
  DeviceErrorLog log;
  EXPECT_TRUE(log.take().ok());  // nothing recorded
  auto clean = args_with(k, 0, 0);
  auto oob_a = args_with(k, abi::kErrorOutOfBounds, 0);
  log.record(k, clean.data(), LaunchId{1});
  EXPECT_TRUE(log.empty());
  log.record(k, oob_a.data(), LaunchId{2});
  log.record(k, clean.data(), LaunchId{3});
  log.record(k, oob_a.data(), LaunchId{5});
  auto oob_b = args_with(k, 0, abi::kErrorOutOfBounds);
  log.record(k, oob_b.data(), LaunchId{6});
  Status s = log.take();
  ASSERT_EQ(s.code(), ErrorCode::kDeviceError);
  EXPECT_NE(s.message().find("kernel 'k', task 'a': out-of-bounds"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("(in launches #2, #5; 2 launches)"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("task 'b'"), std::string::npos);
  EXPECT_NE(s.message().find("(in launch #6)"), std::string::npos);
  ASSERT_EQ(log.reported().size(), 2u);
  EXPECT_EQ(log.reported()[0].count, 2u);
  EXPECT_EQ(log.reported()[0].code, abi::kErrorOutOfBounds);
  EXPECT_EQ(log.reported()[0].launches, (std::vector<LaunchId>{{2}, {5}}));
  EXPECT_TRUE(log.take().ok());          // reported once
  EXPECT_EQ(log.reported().size(), 2u);  // still what the last error reported
}

// A replayed launch says which launch of which graph it was; `where` is asked only of a launch
// that flagged an error.
TEST(DeviceErrorLog, AReplayedLaunchNamesItsGraphAndIndex) {
  abi::CompiledKernel k = two_tasks();
  DeviceErrorLog log;
  int asked = 0;
  auto clean = args_with(k, 0, 0);
  auto oob = args_with(k, abi::kErrorOutOfBounds, 0);
  log.record(k, clean.data(), LaunchId{1}, [&] {
    ++asked;
    return std::string("launch 0 of graph 'g'");
  });
  EXPECT_EQ(asked, 0);
  log.record(k, oob.data(), LaunchId{2}, [&] {
    ++asked;
    return std::string("launch 3 of graph 'step'");
  });
  log.record(k, oob.data(), LaunchId{4});
  EXPECT_EQ(asked, 1);
  Status s = log.take();
  EXPECT_NE(s.message().find("(in launches #2 (launch 3 of graph 'step'), #4; 2 launches)"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(log.reported()[0].wheres, (std::vector<std::string>{"launch 3 of graph 'step'", ""}));
}

TEST(DeviceErrorLog, AdstackOverflowNamesTheStackAndItsCapacity) {
  abi::CompiledKernel k = two_tasks();
  k.tasks[1].adstacks = {
      {"s0", adstack::Heap::kF32, adstack::SizeExpr::constant(4), true},
      {"%7 (carried f32 local %3)", adstack::Heap::kF32, adstack::SizeExpr::constant(9), true}};
  std::vector<std::byte> buf = args_with(k, 0, abi::adstack_overflow_word(1));
  const uint32_t cap = 9;
  std::memcpy(buf.data() + k.adstack_args_offset(1) + 4 * size_t{adstack::capacity_word(1)}, &cap,
              4);
  DeviceErrorLog log;
  log.record(k, buf.data(), LaunchId{4});
  Status s = log.take();
  EXPECT_NE(s.message().find("adstack %7 (carried f32 local %3) overflowed its capacity of 9"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(log.reported()[0].code, abi::kErrorAdstackOverflow);
}

TEST(DeviceErrorLog, KeepsAtMostKMaxErrorsDistinctErrors) {
  DeviceErrorLog log;
  for (uint32_t i = 0; i < DeviceErrorLog::kMaxErrors + 5; ++i) {
    abi::CompiledKernel k = two_tasks();
    k.name = "k" + std::to_string(i);
    auto buf = args_with(k, abi::kErrorOutOfBounds, 0);
    log.record(k, buf.data(), LaunchId{i + 1});
  }
  EXPECT_EQ(log.take().code(), ErrorCode::kDeviceError);
  EXPECT_EQ(log.reported().size(), DeviceErrorLog::kMaxErrors);
}

}  // namespace
}  // namespace vkad::runtime
