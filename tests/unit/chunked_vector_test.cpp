// base/chunked_vector.h: a captured graph's arguments and buffers, appended in groups that
// must stay contiguous and must never move (replays and recording threads hold pointers into
// them while the capture goes on appending).
#include "base/chunked_vector.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace vkad::runtime {
namespace {

TEST(ChunkedVector, GroupsStayContiguousWhereTheyWereAppendedAcrossChunks) {
  using CV = ChunkedVector<uint64_t>;
  CV v;
  struct Group {
    uint32_t index;
    const uint64_t* where;
    std::vector<uint64_t> values;
  };
  std::vector<Group> groups;
  uint64_t next = 1;
  // Groups of 1-40 elements (an empty one now and then) through the doubling chunks into the
  // 2 MiB ones (huge-page advised), one wider than the chunk it would start, and more after.
  auto add = [&](size_t n) {
    std::vector<uint64_t> values(n);
    for (uint64_t& x : values) x = next++;
    const uint32_t index = v.append(values);
    groups.push_back({index, v.at(index), values});
  };
  for (size_t i = 0; next < 3 * CV::kFirst; ++i) add(i % 17 == 0 ? 0 : 1 + i % 40);
  add(5 * CV::kFirst + 5);
  for (size_t i = 0; next < 600000; ++i) add(i % 17 == 0 ? 0 : 1 + i % 40);
  for (size_t i = 0; i < 50; ++i) add(1 + i % 7);
  EXPECT_EQ(v.count(), next - 1);
  for (size_t g = 0; g < groups.size(); ++g) {
    SCOPED_TRACE("group " + std::to_string(g));
    const Group& gr = groups[g];
    ASSERT_EQ(v.at(gr.index), gr.where);  // never moved since it was appended
    for (size_t j = 0; j < gr.values.size(); ++j) ASSERT_EQ(gr.where[j], gr.values[j]);
  }
  // Writes through at() land in the group (a replay's update of a launch's arguments).
  uint64_t* w = v.at(groups[5].index);
  w[0] = 0;
  EXPECT_EQ(v.at(groups[5].index)[0], 0u);
  ASSERT_FALSE(groups[6].values.empty());
  EXPECT_EQ(v.at(groups[6].index)[0], groups[6].values[0]);  // its neighbour untouched
  // A group past the largest chunk is refused, and what was appended stays.
  const size_t before = v.count();
  EXPECT_THROW(v.append(std::vector<uint64_t>(CV::kLargest + 1)), std::length_error);
  EXPECT_EQ(v.count(), before);
  EXPECT_EQ(v.at(groups.back().index)[0], groups.back().values[0]);
}

}  // namespace
}  // namespace vkad::runtime
