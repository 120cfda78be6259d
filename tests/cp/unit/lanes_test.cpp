// Lanes: the receiver's reorder window (slots from several lanes applied in
// stream order) and the server's join tokens (single use, refused after
// the copy, hello bounds).
#include "lanes.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "protocol.hpp"
#include "records.hpp"
#include "reorder.hpp"

namespace rdmakit::cp {
namespace {

using Place = ReorderWindow::Place;
using Put = ReorderWindow::Put;

TEST(CpReorder, AppliesInSequenceOrderWhateverTheArrival) {
  // Four lanes, a window of 2 x kSlots per lane; slots arrive shuffled
  // within what a sender can have in flight (kSlots per lane).
  constexpr uint32_t kLanes = 4;
  ReorderWindow w(2 * kSlots * kLanes);
  std::mt19937 rng(7);
  const uint32_t total = 1000;
  std::vector<uint32_t> applied;
  uint32_t sent = 0;
  std::vector<uint32_t> in_flight;  // sent, not delivered yet
  while (applied.size() < total) {
    // A slot is free again once applied (acked): at most kSlots per lane
    // between the next one to apply and the last one sent.
    while (sent < total && sent - w.next() < kSlots * kLanes) in_flight.push_back(sent++);
    std::shuffle(in_flight.begin(), in_flight.end(), rng);
    // Deliver half of what is in flight, in that shuffled order.
    const size_t n = std::max<size_t>(1, in_flight.size() / 2);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t seq = in_flight.back();
      in_flight.pop_back();
      ASSERT_EQ(w.put(seq, {seq % kLanes, seq % kSlots}), Put::kOk) << seq;
    }
    Place p;
    while (w.take(&p)) {
      EXPECT_EQ(p.lane, w.next() % kLanes);
      EXPECT_EQ(p.slot, w.next() % kSlots);
      applied.push_back(w.next());
      w.advance();
    }
  }
  for (uint32_t i = 0; i < total; ++i) ASSERT_EQ(applied[i], i);
  EXPECT_EQ(w.pending(), 0u);
}

TEST(CpReorder, WaitsForTheNextOne) {
  ReorderWindow w(16);
  ASSERT_EQ(w.put(2, {1, 2}), Put::kOk);
  ASSERT_EQ(w.put(1, {0, 1}), Put::kOk);
  Place p;
  EXPECT_FALSE(w.take(&p));  // 0 has not come
  ASSERT_EQ(w.put(0, {2, 0}), Put::kOk);
  ASSERT_TRUE(w.take(&p));
  EXPECT_EQ(p.lane, 2u);
  w.advance();
  ASSERT_TRUE(w.take(&p));
  EXPECT_EQ(p.lane, 0u);
  w.advance();
  ASSERT_TRUE(w.take(&p));
  EXPECT_EQ(p.lane, 1u);
  EXPECT_EQ(p.slot, 2u);
}

TEST(CpReorder, RefusesOutsideTheWindowAndDuplicates) {
  ReorderWindow w(16);
  EXPECT_EQ(w.put(16, {0, 0}), Put::kOutside);           // one past the window
  EXPECT_EQ(w.put(0xffffffffu, {0, 0}), Put::kOutside);  // "before" next
  EXPECT_EQ(w.put(5, {0, 5}), Put::kOk);
  EXPECT_EQ(w.put(5, {1, 5}), Put::kDuplicate);
  Place p;
  EXPECT_FALSE(w.take(&p));
  ASSERT_EQ(w.put(0, {0, 0}), Put::kOk);
  ASSERT_TRUE(w.take(&p));
  w.advance();
  EXPECT_EQ(w.put(0, {0, 0}), Put::kOutside);  // applied already
  EXPECT_EQ(w.put(16, {0, 0}), Put::kOk);      // the window moved on by one
  EXPECT_EQ(w.put(17, {0, 0}), Put::kOutside);
}

TEST(CpReorder, ADamagedSlotComesBackUnderItsNumber) {
  ReorderWindow w(16);
  ASSERT_EQ(w.put(0, {1, 3}), Put::kOk);
  Place p;
  ASSERT_TRUE(w.take(&p));
  // Not advanced (the writer nacked it): the same number is welcome again,
  // on any lane's slot.
  EXPECT_FALSE(w.take(&p));
  ASSERT_EQ(w.put(0, {1, 3}), Put::kOk);
  ASSERT_TRUE(w.take(&p));
  EXPECT_EQ(p.slot, 3u);
  w.advance();
  EXPECT_EQ(w.next(), 1u);
}

TEST(CpReorder, WindowIsBounded) {
  ReorderWindow w(1u << 30);
  EXPECT_EQ(w.window(), ReorderWindow::kCapacity);
  EXPECT_EQ(w.put(ReorderWindow::kCapacity, {0, 0}), Put::kOutside);
}

TEST(CpLanes, TokenJoinsOnceAndNotAfterTheCopy) {
  LaneRegistry reg;
  std::vector<JoinToken> tokens;
  auto group = reg.open(3, &tokens);
  ASSERT_TRUE(group);
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_NE(tokens[0], tokens[1]);
  EXPECT_EQ(group->missing(), 1u);
  // Lane 1's token for lane 2: refused.
  EXPECT_NE(reg.join(2, tokens[0], nullptr), "");
  EXPECT_EQ(reg.join(1, tokens[0], nullptr), "");
  EXPECT_NE(reg.join(1, tokens[0], nullptr), "");  // replayed
  EXPECT_FALSE(group->wait_joined(std::chrono::milliseconds(1)));
  EXPECT_EQ(group->missing(), 2u);
  EXPECT_EQ(reg.join(2, tokens[1], nullptr), "");
  EXPECT_TRUE(group->wait_joined(std::chrono::milliseconds(1)));
  EXPECT_EQ(group->missing(), 0u);
  reg.close(group);
  EXPECT_EQ(reg.open_groups(), 0u);
  EXPECT_NE(reg.join(2, tokens[1], nullptr), "");
}

TEST(CpLanes, WrongTokenAndClosedGroupRefused) {
  LaneRegistry reg;
  std::vector<JoinToken> tokens;
  auto group = reg.open(2, &tokens);
  ASSERT_TRUE(group);
  JoinToken wrong = tokens[0];
  wrong[31] ^= std::byte{1};
  EXPECT_NE(reg.join(1, wrong, nullptr).find("refused"), std::string::npos);
  JoinToken zero{};
  EXPECT_NE(reg.join(1, zero, nullptr), "");
  EXPECT_NE(reg.join(0, tokens[0], nullptr), "");          // lane 0 is the control
  EXPECT_NE(reg.join(kMaxLanes, tokens[0], nullptr), "");  // past the bound
  reg.close(group);
  EXPECT_FALSE(group->wait_joined(std::chrono::milliseconds(1)));
  EXPECT_NE(reg.join(1, tokens[0], nullptr), "");  // its copy ended
  EXPECT_FALSE(reg.open(1, &tokens));              // one lane needs no group
  EXPECT_FALSE(reg.open(kMaxLanes + 1, &tokens));
}

TEST(CpLanes, HelloCarriesLanesWithinTheBound) {
  Request r;
  r.version = kProtocolVersion;
  r.op = static_cast<uint8_t>(Op::kPull);
  r.paths = {"a"};
  for (uint32_t lanes : {0u, 1u, 4u, kMaxLanes, kMaxLanes + 1}) {
    r.lanes = static_cast<uint8_t>(lanes);
    Writer w = message(Msg::kHello);
    encode_request(r, &w);
    Request back;
    const Parsed p = parse_request(w.data(), &back);
    if (lanes >= 1 && lanes <= kMaxLanes) {
      EXPECT_EQ(p, Parsed::kOk) << lanes;
      EXPECT_EQ(back.lanes, lanes);
    } else {
      EXPECT_EQ(p, Parsed::kMalformed) << lanes;
    }
  }
}

TEST(CpLanes, DefaultFollowsProviderAndCpus) {
  EXPECT_EQ(default_lanes("shm", 64), 1u);
  EXPECT_EQ(default_lanes("tcp", 1), 1u);
  EXPECT_EQ(default_lanes("tcp", 2), 1u);
  EXPECT_EQ(default_lanes("tcp", 4), 2u);
  EXPECT_EQ(default_lanes("tcp", 6), 3u);
  EXPECT_EQ(default_lanes("tcp", 8), 4u);
  EXPECT_EQ(default_lanes("verbs", 64), 4u);
}

}  // namespace
}  // namespace rdmakit::cp
