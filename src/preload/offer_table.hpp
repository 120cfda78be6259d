#pragma once
// The cross-host rendezvous connections a server holds (docs/preload.md,
// "Bounds"): each one in its handshake (hello, shared-secret proof, offer)
// or holding a stored offer until accept() takes it up. Every entry holds a
// descriptor, so the table is bounded per source address and in total; an
// entry over a bound evicts the oldest entry of the source that holds the
// most (the newest offers are the ones an accept() is about to take up, and
// a flood from a few addresses evicts itself first). Not thread-safe: the
// caller holds the rendezvous lock.
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "rendezvous_wire.hpp"

namespace rdmakit::preload {

struct OfferLimits {
  size_t per_source = 16;  // RDMAKIT_PRELOAD_OFFERS_PER_SOURCE
  size_t total = 256;      // RDMAKIT_PRELOAD_OFFERS_MAX (at most RLIMIT_NOFILE / 4)
};
// Read once from the environment.
const OfferLimits& offer_limits();

// The peer's address: family, then the address (IPv4 in the first 4 bytes).
using SourceKey = std::array<uint8_t, 17>;

struct OfferEntry {
  uint64_t id = 0;
  int fd = -1;
  uint64_t owner = 0;  // the listener whose thread runs the handshake
  SourceKey source{};
  std::string where;  // "local=... peer=..." for the log
  wire::Clock::time_point expires;
  // Handshake: bytes of the current step gathered so far.
  enum Step : uint8_t { kAuthNonce, kOffer, kStored } step = kOffer;
  size_t have = 0;
  std::array<uint8_t, sizeof(wire::AuthClient) + sizeof(wire::Offer)> buf{};
  wire::AuthNonce client_nonce;
  auth::Nonce server_nonce{};
  // Set once stored.
  wire::Tuple tuple;
  wire::Offer offer;
};

class OfferTable {
 public:
  explicit OfferTable(OfferLimits limits) : limits_(limits) {}
  // A new entry for fd (the table closes it from now on), after making room
  // within the bounds; evictions are logged, rate-limited.
  OfferEntry& add(int fd, const SourceKey& source, uint64_t owner, std::string where,
                  wire::Clock::time_point expires);
  OfferEntry* find(uint64_t id);
  // Closes the entry's descriptor and forgets it.
  void drop(uint64_t id);
  // The entry stored for this connection, removed from the table: its
  // descriptor is the caller's. False when there is none.
  bool take(const wire::Tuple& tuple, OfferEntry* out);
  // Drops every entry past its deadline (offers not taken up in time,
  // handshakes that stalled); returns how many. Also flushes the eviction
  // log's held-back count.
  size_t purge_expired(wire::Clock::time_point now);
  // Drops the entries of a listener still in their handshake.
  void drop_handshakes_of(uint64_t owner);
  const std::vector<OfferEntry>& entries() const { return entries_; }

 private:
  void evict_one(const SourceKey* source);
  OfferLimits limits_;
  uint64_t next_id_ = 1;
  std::vector<OfferEntry> entries_;
};

// A log line of a kind that a peer can make happen at will (evictions,
// refused proofs, malformed offers): the first is written at once, the
// rest at most once a second as a count.
class RateLimitedLog {
 public:
  explicit RateLimitedLog(const char* kind) : kind_(kind) {}
  void note(const std::string& line);
  // The count of lines held back, once their second is over (so the end of
  // a burst is reported too).
  void flush();

 private:
  const char* kind_;
  wire::Clock::time_point window_{};
  size_t suppressed_ = 0;
  bool started_ = false;
};

}  // namespace rdmakit::preload
