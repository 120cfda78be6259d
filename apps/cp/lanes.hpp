#pragma once
// Lanes: the extra connections one copy stripes its slots over. The server
// grants a copy its lanes in the hello reply with a random join token per
// lane (getrandom, 32 bytes) on the copy's control channel, which is already
// authenticated; each lane connection's first message is kLaneJoin with its
// lane number and token. A token is compared in constant time, joins once,
// and is refused once its copy has ended (the copy's group is closed).
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "protocol.hpp"

namespace rdmakit::session {
class Endpoint;
}

namespace rdmakit::cp {

using JoinToken = std::array<std::byte, kJoinTokenBytes>;

// One copy's extra lanes (1 .. lanes-1), as they join.
class LaneGroup {
 public:
  explicit LaneGroup(uint32_t extra) : lanes_(extra) {}
  uint32_t extra() const { return static_cast<uint32_t>(lanes_.size()); }
  // Waits until every lane joined (true) or `wait` passed / the group closed.
  bool wait_joined(std::chrono::milliseconds wait);
  // Lane i's endpoint (1-based), once joined.
  std::shared_ptr<session::Endpoint> endpoint(uint32_t lane);
  // The first lane that has not joined (0: all did).
  uint32_t missing();

 private:
  friend class LaneRegistry;
  struct Lane {
    JoinToken token{};
    bool joined = false;
    std::shared_ptr<session::Endpoint> ep;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Lane> lanes_;
  bool closed_ = false;
};

// The server's open groups: where a lane connection's token is looked up.
class LaneRegistry {
 public:
  // A group for a copy of `lanes` lanes (2 .. kMaxLanes) with a token each
  // for lanes 1 .. lanes-1 in *tokens; nullptr for another lane count.
  std::shared_ptr<LaneGroup> open(uint32_t lanes, std::vector<JoinToken>* tokens);
  // A lane connection's join: "" when the token is lane `lane`'s of an open
  // group that it did not join yet (the endpoint is the group's from now
  // on); else why it is refused.
  std::string join(uint32_t lane, const JoinToken& token,
                   std::shared_ptr<session::Endpoint> ep);
  // The copy ended: its tokens are refused from now on.
  void close(const std::shared_ptr<LaneGroup>& group);
  size_t open_groups();

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<LaneGroup>> groups_;
};

// Lanes a client asks for by default (docs/cp.md, "Lanes"): on tcp and
// verbs one per two online CPUs, 1 to 4; one on shm.
uint32_t default_lanes(const std::string& provider, unsigned cpus);

}  // namespace rdmakit::cp
