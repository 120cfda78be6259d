// core::HandshakeBacklog, the listeners' bounded set of pending handshakes:
// arrival order, the oldest dropped when full, any entry taken out.
#include "core/handshake_backlog.hpp"

#include <gtest/gtest.h>

#include <memory>

namespace rdmakit::core {
namespace {

TEST(HandshakeBacklogTest, DropsTheOldestWhenFull) {
  HandshakeBacklog<int, 3> backlog;
  EXPECT_TRUE(backlog.empty());
  for (int i = 1; i <= 3; ++i) backlog.emplace(i);
  EXPECT_TRUE(backlog.full());
  EXPECT_EQ(backlog.front(), 1);
  EXPECT_EQ(backlog.emplace(4), 4);
  ASSERT_EQ(backlog.size(), 3u);
  EXPECT_EQ(backlog[0], 2);
  EXPECT_EQ(backlog[2], 4);
}

TEST(HandshakeBacklogTest, TakesAndErasesInPlace) {
  HandshakeBacklog<std::unique_ptr<int>> backlog;
  EXPECT_EQ(decltype(backlog)::kCapacity, kMaxPendingHandshakes);
  for (int i = 0; i < 4; ++i) backlog.emplace(std::make_unique<int>(i));
  const std::unique_ptr<int> taken = backlog.take(1);
  EXPECT_EQ(*taken, 1);
  backlog.erase(0);
  ASSERT_EQ(backlog.size(), 2u);
  int sum = 0;
  for (const auto& p : backlog) sum += *p;
  EXPECT_EQ(sum, 2 + 3);
}

}  // namespace
}  // namespace rdmakit::core
