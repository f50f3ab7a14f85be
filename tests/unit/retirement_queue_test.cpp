#include "runtime/retirement_queue.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "unit/fake_tracker.h"

namespace vkad::runtime {
namespace {

using rhi::Serial;
using rhi::StreamSemaphore;
using testing::FakeTracker;

// Payload that records when it is destroyed (i.e. retired).
struct Tracked {
  std::shared_ptr<std::vector<int>> log;
  int id = -1;
  Tracked(std::shared_ptr<std::vector<int>> l, int i) : log(std::move(l)), id(i) {}
  Tracked(Tracked&& o) noexcept : log(std::move(o.log)), id(o.id) { o.id = -1; }
  Tracked& operator=(Tracked&& o) noexcept {
    log = std::move(o.log);
    id = o.id;
    o.id = -1;
    return *this;
  }
  ~Tracked() {
    if (id >= 0 && log) log->push_back(id);
  }
};

class RetirementQueueTest : public ::testing::Test {
 protected:
  Status push(RetirementQueue<Tracked>& q, uint64_t serial, uint64_t bytes = 100) {
    return q.push(StreamSemaphore(&tracker, Serial(serial)), Tracked(log, static_cast<int>(serial)),
                  bytes);
  }
  // The ids of every payload the queue has retired so far, in order (taking them, as the
  // runtime does after each call).
  std::vector<int> retired_ids(RetirementQueue<Tracked>& q) {
    for (Tracked& t : q.take_retired()) taken_.push_back(t.id);
    return taken_;
  }
  FakeTracker tracker;
  std::shared_ptr<std::vector<int>> log = std::make_shared<std::vector<int>>();
  std::vector<int> taken_;
};

TEST_F(RetirementQueueTest, EntriesRetireInOrderAsTheSemaphoreAdvances) {
  RetirementQueue<Tracked> q(8);
  for (uint64_t s = 1; s <= 5; ++s) ASSERT_TRUE(push(q, s).ok());
  EXPECT_EQ(q.size(), 5u);
  tracker.advance_device(Serial(2));
  EXPECT_EQ(q.poll(), 2u);
  EXPECT_EQ(retired_ids(q), (std::vector<int>{1, 2}));
  tracker.advance_device(Serial(4));
  EXPECT_EQ(q.poll(), 2u);
  EXPECT_EQ(retired_ids(q), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(q.counters().retired_by_polling, 4u);
  EXPECT_EQ(q.counters().forced_waits, 0u);
  EXPECT_EQ(tracker.waits, 0) << "polling never blocks";
}

TEST_F(RetirementQueueTest, PushPollsTheFrontWithoutBlocking) {
  RetirementQueue<Tracked> q(3);
  ASSERT_TRUE(push(q, 1).ok());
  ASSERT_TRUE(push(q, 2).ok());
  tracker.advance_device(Serial(1));
  ASSERT_TRUE(push(q, 3).ok());
  EXPECT_EQ(retired_ids(q), std::vector<int>{1});
  EXPECT_EQ(q.size(), 2u);
  EXPECT_EQ(tracker.waits, 0);
}

TEST_F(RetirementQueueTest, FullQueueWaitsForOldestOnly) {
  RetirementQueue<Tracked> q(3);
  for (uint64_t s = 1; s <= 3; ++s) ASSERT_TRUE(push(q, s).ok());
  EXPECT_EQ(tracker.waits, 0);
  ASSERT_TRUE(push(q, 4).ok());  // 4 entries > depth 3
  EXPECT_EQ(tracker.waits, 1);
  EXPECT_EQ(tracker.last_wait, Serial(1)) << "waited for the oldest, not the newest";
  EXPECT_EQ(tracker.completed_cached(), Serial(1)) << "serials 2..4 untouched";
  EXPECT_EQ(retired_ids(q), std::vector<int>{1});
  EXPECT_EQ(q.size(), 3u);
  EXPECT_EQ(q.counters().forced_waits, 1u);
  EXPECT_EQ(q.counters().retired_by_forced_wait, 1u);
}

TEST_F(RetirementQueueTest, BytesAndHighWaterAreTracked) {
  RetirementQueue<Tracked> q(2);
  ASSERT_TRUE(push(q, 1, 10).ok());
  ASSERT_TRUE(push(q, 2, 20).ok());
  EXPECT_EQ(q.counters().bytes, 30u);
  ASSERT_TRUE(push(q, 3, 40).ok());  // forced wait retires 1
  EXPECT_EQ(q.counters().bytes, 60u);
  EXPECT_EQ(q.counters().high_water_bytes, 70u) << "all three were held for a moment";
  EXPECT_EQ(q.counters().high_water_entries, 3u);
}

TEST_F(RetirementQueueTest, LoweringDepthRetiresDownToIt) {
  RetirementQueue<Tracked> q(8);
  for (uint64_t s = 1; s <= 6; ++s) ASSERT_TRUE(push(q, s).ok());
  ASSERT_TRUE(q.set_depth(2).ok());
  EXPECT_EQ(q.size(), 2u);
  EXPECT_EQ(retired_ids(q), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(tracker.last_wait, Serial(4));
  ASSERT_TRUE(q.set_depth(10).ok());  // raising never waits
  EXPECT_EQ(q.size(), 2u);
}

TEST_F(RetirementQueueTest, DrainAllWaitsForNewestAndEmpties) {
  RetirementQueue<Tracked> q(8);
  for (uint64_t s = 1; s <= 4; ++s) ASSERT_TRUE(push(q, s).ok());
  ASSERT_TRUE(q.drain_all().ok());
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(q.counters().bytes, 0u);
  EXPECT_EQ(retired_ids(q), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(tracker.waits, 1);
  EXPECT_EQ(tracker.last_wait, Serial(4));
  EXPECT_EQ(q.counters().retired_by_drain, 4u);
}

TEST_F(RetirementQueueTest, FailedWaitKeepsEntriesAndReportsDeviceLost) {
  RetirementQueue<Tracked> q(1);
  ASSERT_TRUE(push(q, 1).ok());
  tracker.fail_waits = true;
  Status s = push(q, 2);
  EXPECT_EQ(s.code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(q.size(), 2u) << "nothing released on a failed wait";
  EXPECT_TRUE(retired_ids(q).empty());
}

TEST_F(RetirementQueueTest, TakeRetiredReturnsEachPayloadOnceInOrder) {
  RetirementQueue<Tracked> q(8);
  std::vector<int> seen;
  for (uint64_t s = 1; s <= 3; ++s) ASSERT_TRUE(push(q, s).ok());
  EXPECT_TRUE(q.take_retired().empty());  // nothing complete yet
  tracker.advance_device(Serial(1));
  q.poll();
  for (Tracked& t : q.take_retired()) seen.push_back(t.id);
  EXPECT_EQ(seen, (std::vector<int>{1}));
  ASSERT_TRUE(q.drain_all().ok());
  for (Tracked& t : q.take_retired()) seen.push_back(t.id);
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(q.take_retired().empty());
}

TEST_F(RetirementQueueTest, BaselinePoliciesBehaveAsNamed) {
  RetirementQueue<Tracked> hold(2, RetirementPolicy::kHoldUntilSync);
  for (uint64_t s = 1; s <= 5; ++s) {
    ASSERT_TRUE(hold.push(StreamSemaphore(&tracker, Serial(s)), Tracked(log, 0), 1).ok());
  }
  tracker.advance_device(Serial(5));
  EXPECT_EQ(hold.poll(), 0u);
  EXPECT_EQ(hold.size(), 5u) << "held until drain";
  EXPECT_EQ(tracker.waits, 0);
  ASSERT_TRUE(hold.drain_all().ok());
  EXPECT_EQ(hold.size(), 0u);

  FakeTracker t2;
  RetirementQueue<Tracked> full(2, RetirementPolicy::kFullDrainWhenFull);
  for (uint64_t s = 1; s <= 3; ++s) {
    ASSERT_TRUE(full.push(StreamSemaphore(&t2, Serial(s)), Tracked(log, 0), 1).ok());
  }
  EXPECT_EQ(full.size(), 0u) << "third push drained everything";
  EXPECT_EQ(t2.last_wait, Serial(3)) << "waited for the newest";
  EXPECT_EQ(full.counters().forced_waits, 1u);
}

}  // namespace
}  // namespace vkad::runtime
