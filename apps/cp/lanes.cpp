#include "lanes.hpp"

#include <sodium.h>

#include <algorithm>
#include <cerrno>
#include <rdmakit/auth.hpp>

namespace rdmakit::cp {

static_assert(kJoinTokenBytes == auth::kNonceBytes, "a token is one fresh nonce");

bool LaneGroup::wait_joined(std::chrono::milliseconds wait) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, wait, [&] {
    return closed_ || std::all_of(lanes_.begin(), lanes_.end(),
                                  [](const Lane& l) { return l.joined; });
  }) && !closed_;
}

std::shared_ptr<session::Endpoint> LaneGroup::endpoint(uint32_t lane) {
  std::lock_guard lock(mu_);
  if (lane == 0 || lane > lanes_.size()) return nullptr;
  return lanes_[lane - 1].ep;
}

uint32_t LaneGroup::missing() {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < lanes_.size(); ++i)
    if (!lanes_[i].joined) return static_cast<uint32_t>(i + 1);
  return 0;
}

std::shared_ptr<LaneGroup> LaneRegistry::open(uint32_t lanes,
                                              std::vector<JoinToken>* tokens) {
  if (lanes < 2 || lanes > kMaxLanes) return nullptr;
  auto group = std::make_shared<LaneGroup>(lanes - 1);
  tokens->clear();
  for (LaneGroup::Lane& l : group->lanes_) {
    l.token = auth::fresh_nonce();
    tokens->push_back(l.token);
  }
  std::lock_guard lock(mu_);
  groups_.push_back(group);
  return group;
}

std::string LaneRegistry::join(uint32_t lane, const JoinToken& token,
                               std::shared_ptr<session::Endpoint> ep) {
  if (lane == 0 || lane >= kMaxLanes) return "no such lane " + std::to_string(lane);
  std::lock_guard lock(mu_);
  for (const std::shared_ptr<LaneGroup>& g : groups_) {
    std::lock_guard glock(g->mu_);
    if (g->closed_ || lane > g->lanes_.size()) continue;
    LaneGroup::Lane& l = g->lanes_[lane - 1];
    if (l.joined) continue;  // single use: its token is gone
    // Constant time: how much of a token matched does not show.
    if (::sodium_memcmp(l.token.data(), token.data(), token.size()) != 0) continue;
    l.joined = true;
    l.ep = std::move(ep);
    ::sodium_memzero(l.token.data(), l.token.size());
    g->cv_.notify_all();
    return "";
  }
  return "join token for lane " + std::to_string(lane) +
         " refused: unknown, already used, or its copy has ended";
}

void LaneRegistry::close(const std::shared_ptr<LaneGroup>& group) {
  if (!group) return;
  {
    std::lock_guard glock(group->mu_);
    group->closed_ = true;
    for (LaneGroup::Lane& l : group->lanes_)
      ::sodium_memzero(l.token.data(), l.token.size());
    group->cv_.notify_all();
  }
  std::lock_guard lock(mu_);
  std::erase(groups_, group);
}

size_t LaneRegistry::open_groups() {
  std::lock_guard lock(mu_);
  return groups_.size();
}

uint32_t default_lanes(const std::string& provider, unsigned cpus) {
  // shm copies memory on this host's CPUs: more lanes add threads, not
  // bandwidth. A connection is one progress thread's work (tcp) or one QP
  // (verbs), and the receiver needs a CPU of its own besides: a lane per
  // two CPUs (on two, one lane copied a tree fastest; docs/cp.md, "Lanes").
  if (provider == "shm") return 1;
  return std::clamp<uint32_t>(cpus / 2, 1, 4);
}

}  // namespace rdmakit::cp
