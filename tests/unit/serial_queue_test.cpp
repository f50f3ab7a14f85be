#include "rhi/serial_queue.h"

#include <gtest/gtest.h>

#include <vector>

#include "base/status.h"
#include "rhi/deferred_deleter.h"

namespace vkad::rhi {
namespace {

TEST(SerialQueue, RetiresInOrderUpToCompleted) {
  SerialQueue<int> q;
  q.push(Serial(1), 10);
  q.push(Serial(2), 20);
  q.push(Serial(2), 21);
  q.push(Serial(5), 50);
  std::vector<int> out;
  EXPECT_EQ(q.retire_up_to(Serial(0), [&](int v) { out.push_back(v); }), 0u);
  EXPECT_EQ(q.retire_up_to(Serial(2), [&](int v) { out.push_back(v); }), 3u);
  EXPECT_EQ(out, (std::vector<int>{10, 20, 21}));
  EXPECT_EQ(q.front_serial(), Serial(5));
  EXPECT_EQ(q.retire_up_to(Serial(4), [&](int v) { out.push_back(v); }), 0u);
  EXPECT_EQ(q.retire_all([&](int v) { out.push_back(v); }), 1u);
  EXPECT_TRUE(q.empty());
}

// A stream whose progress the test controls.
class FakeTracker : public SerialTracker {
 public:
  Serial completed_cached() const override { return cached_; }
  Serial refresh_completed() override {
    ++queries;
    cached_ = device_;
    return cached_;
  }
  bool wait_for(Serial s, uint64_t) override {
    ++waits;
    if (s > device_) device_ = s;  // the "GPU" finishes what we wait for
    cached_ = device_;
    return true;
  }
  void advance_device(Serial s) { device_ = s; }
  int queries = 0;
  int waits = 0;

 private:
  Serial cached_{0};
  Serial device_{0};
};

TEST(StreamSemaphore, SignalledOnlyOnceTheTrackerReachesItsSerial) {
  FakeTracker t;
  StreamSemaphore s3(&t, Serial(3));
  EXPECT_FALSE(s3.is_signaled());
  t.advance_device(Serial(2));
  EXPECT_FALSE(s3.is_signaled());
  t.advance_device(Serial(3));
  EXPECT_TRUE(s3.is_signaled());
  int queries = t.queries;
  EXPECT_TRUE(s3.is_signaled());  // cached: no new device query
  EXPECT_EQ(t.queries, queries);
  EXPECT_TRUE(StreamSemaphore().is_signaled());  // default: nothing to wait for
}

TEST(StreamSemaphore, WaitWaitsForThatSerialOnly) {
  FakeTracker t;
  StreamSemaphore s2(&t, Serial(2));
  EXPECT_TRUE(s2.wait());
  EXPECT_EQ(t.waits, 1);
  EXPECT_EQ(t.completed_cached(), Serial(2));  // not further: serial 3+ untouched
}

TEST(DeferredDeleter, DestroysImmediatelyWhenUnusedOrComplete) {
  FakeTracker t;
  DeferredDeleter<int> d;
  d.set_tracker(0, &t);
  std::vector<int> destroyed;
  d.release(ResourceUse{}, 1, [&](int v) { destroyed.push_back(v); });
  EXPECT_EQ(destroyed, std::vector<int>{1});
  t.advance_device(Serial(4));
  t.refresh_completed();
  ResourceUse used;
  used.mark(0, Serial(4));
  d.release(used, 2, [&](int v) { destroyed.push_back(v); });
  EXPECT_EQ(destroyed, (std::vector<int>{1, 2}));
  EXPECT_EQ(d.pending(), 0u);
}

TEST(DeferredDeleter, NeverEarlyNeverSkipped) {
  FakeTracker t;
  DeferredDeleter<int> d;
  d.set_tracker(0, &t);
  std::vector<int> destroyed;
  auto sink = [&](int v) { destroyed.push_back(v); };
  for (int i = 1; i <= 5; ++i) {
    ResourceUse u;
    u.mark(0, Serial(i));
    d.release(u, i, sink);
  }
  EXPECT_EQ(d.pending(), 5u);
  for (int done = 0; done <= 5; ++done) {
    t.advance_device(Serial(done));
    t.refresh_completed();
    d.collect(sink);
    ASSERT_EQ(destroyed.size(), static_cast<size_t>(done));  // exactly those with serial <= done
  }
  EXPECT_EQ(d.pending(), 0u);
}

TEST(DeferredDeleter, WaitsForEveryStreamThatUsedTheObject) {
  FakeTracker a, b;
  DeferredDeleter<int> d;
  d.set_tracker(0, &a);
  d.set_tracker(1, &b);
  ResourceUse u;
  u.mark(0, Serial(2));
  u.mark(1, Serial(7));
  std::vector<int> destroyed;
  auto sink = [&](int v) { destroyed.push_back(v); };
  d.release(u, 42, sink);
  a.advance_device(Serial(2));
  a.refresh_completed();
  d.collect(sink);
  EXPECT_TRUE(destroyed.empty()) << "stream 1 has not reached serial 7";
  b.advance_device(Serial(7));
  b.refresh_completed();
  d.collect(sink);
  EXPECT_EQ(destroyed, std::vector<int>{42});
}

TEST(DeferredDeleter, OutOfOrderLastUseIsClampedNotAdvanced) {
  FakeTracker t;
  DeferredDeleter<int> d;
  d.set_tracker(0, &t);
  std::vector<int> destroyed;
  auto sink = [&](int v) { destroyed.push_back(v); };
  ResourceUse late, early;
  late.mark(0, Serial(7));
  early.mark(0, Serial(3));
  d.release(late, 7, sink);
  d.release(early, 3, sink);  // released after a later-serial object
  t.advance_device(Serial(3));
  t.refresh_completed();
  d.collect(sink);
  // Clamping may delay the early object (never destroy anything before its serial).
  for (int v : destroyed) EXPECT_LE(v, 3);
  t.advance_device(Serial(7));
  t.refresh_completed();
  d.collect(sink);
  EXPECT_EQ(destroyed.size(), 2u);
}

TEST(Status, CarriesCodeAndMessage) {
  Status s = make_error(ErrorCode::kDeviceLost, "vkQueueSubmit failed");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.to_string(), "device lost: vkQueueSubmit failed");
  Result<int> r(s);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kDeviceLost);
  Result<int> v(3);
  EXPECT_TRUE(v.ok());
  EXPECT_EQ(*v, 3);
}

}  // namespace
}  // namespace vkad::rhi
