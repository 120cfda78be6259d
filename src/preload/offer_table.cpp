#include "offer_table.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "libc.hpp"
#include "state.hpp"

namespace rdmakit::preload {

using wire::Clock;

namespace {

size_t env_size(const char* name, size_t def, size_t lo, size_t hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return def;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*end != '\0' || n < lo || n > hi) {
    log_line("config: %s: '%s' is not a number in %zu..%zu (default %zu used)", name, v,
             lo, hi, def);
    return def;
  }
  return static_cast<size_t>(n);
}

std::string source_text(const SourceKey& k) {
  sockaddr_storage ss{};
  if (k[0] == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);  // NOLINT
    in6->sin6_family = AF_INET6;
    std::memcpy(&in6->sin6_addr, &k[1], 16);
  } else {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);  // NOLINT
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, &k[1], 4);
  }
  std::string e = endpoint(reinterpret_cast<sockaddr*>(&ss));  // NOLINT
  // endpoint() names a port; the source is an address only.
  if (const auto colon = e.rfind(':'); colon != std::string::npos) e.resize(colon);
  return e;
}

RateLimitedLog g_evictions("offers evicted");

}  // namespace

const OfferLimits& offer_limits() {
  static const OfferLimits limits = [] {
    OfferLimits l;
    l.per_source = env_size("RDMAKIT_PRELOAD_OFFERS_PER_SOURCE", 16, 1, 4096);
    l.total = env_size("RDMAKIT_PRELOAD_OFFERS_MAX", 256, 1, 65536);
    // Never more than a quarter of the descriptors the application may open.
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
      l.total = std::min<size_t>(l.total, std::max<size_t>(rl.rlim_cur / 4, 1));
    }
    l.per_source = std::min(l.per_source, l.total);
    return l;
  }();
  return limits;
}

void RateLimitedLog::note(const std::string& line) {
  const auto now = Clock::now();
  if (started_ && now - window_ < std::chrono::seconds(1)) {
    ++suppressed_;
    return;
  }
  if (suppressed_ > 0) {
    log_line("%s (and %zu more %s in the last %lld ms)", line.c_str(), suppressed_, kind_,
             static_cast<long long>(
                 std::chrono::duration_cast<std::chrono::milliseconds>(now - window_)
                     .count()));
  } else {
    log_line("%s", line.c_str());
  }
  started_ = true;
  window_ = now;
  suppressed_ = 0;
}

void RateLimitedLog::flush() {
  if (suppressed_ == 0) return;
  const auto now = Clock::now();
  if (now - window_ < std::chrono::seconds(1)) return;
  log_line(
      "rendezvous: %zu more %s in the last %lld ms", suppressed_, kind_,
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(now - window_).count()));
  window_ = now;
  suppressed_ = 0;
}

void OfferTable::evict_one(const SourceKey* source) {
  // Over the per-source bound: that source's oldest entry. Over the total:
  // the oldest entry of the source holding the most.
  const SourceKey* victim_source = source;
  if (victim_source == nullptr) {
    std::map<SourceKey, size_t> per;
    size_t most = 0;
    for (const auto& e : entries_) {
      const size_t n = ++per[e.source];
      if (n > most) {
        most = n;
        victim_source = &e.source;
      }
    }
  }
  if (victim_source == nullptr) return;
  const SourceKey key = *victim_source;
  // Entries are kept in arrival order: the first match is the oldest.
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->source != key) continue;
    g_evictions.note(
        "rendezvous " + it->where + ": " +
        (it->step == OfferEntry::kStored ? "stored offer" : "handshake") + " evicted (" +
        (source != nullptr ? std::to_string(limits_.per_source) + " per source from " +
                                 source_text(key) + ", RDMAKIT_PRELOAD_OFFERS_PER_SOURCE"
                           : std::to_string(limits_.total) +
                                 " in total, RDMAKIT_PRELOAD_OFFERS_MAX; the source "
                                 "holding the most loses its oldest") +
        ")");
    real().close(it->fd);  // its client sees the rendezvous close: kernel TCP
    entries_.erase(it);
    return;
  }
}

OfferEntry& OfferTable::add(int fd, const SourceKey& source, uint64_t owner,
                            std::string where, Clock::time_point expires) {
  const size_t from_source = static_cast<size_t>(
      std::count_if(entries_.begin(), entries_.end(),
                    [&](const OfferEntry& e) { return e.source == source; }));
  if (from_source >= limits_.per_source) evict_one(&source);
  while (entries_.size() >= limits_.total) evict_one(nullptr);
  OfferEntry e;
  e.id = next_id_++;
  e.fd = fd;
  e.owner = owner;
  e.source = source;
  e.where = std::move(where);
  e.expires = expires;
  entries_.push_back(std::move(e));
  return entries_.back();
}

OfferEntry* OfferTable::find(uint64_t id) {
  for (auto& e : entries_) {
    if (e.id == id) return &e;
  }
  return nullptr;
}

void OfferTable::drop(uint64_t id) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->id == id) {
      real().close(it->fd);
      entries_.erase(it);
      return;
    }
  }
}

bool OfferTable::take(const wire::Tuple& tuple, OfferEntry* out) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->step == OfferEntry::kStored &&
        std::memcmp(&it->tuple, &tuple, sizeof tuple) == 0) {
      *out = std::move(*it);
      entries_.erase(it);
      return true;
    }
  }
  return false;
}

size_t OfferTable::purge_expired(Clock::time_point now) {
  g_evictions.flush();
  return std::erase_if(entries_, [&](const OfferEntry& e) {
    if (e.expires > now) return false;
    real().close(e.fd);  // the client sees EOF and stays on TCP
    return true;
  });
}

void OfferTable::drop_handshakes_of(uint64_t owner) {
  std::erase_if(entries_, [&](const OfferEntry& e) {
    if (e.owner != owner || e.step == OfferEntry::kStored) return false;
    real().close(e.fd);
    return true;
  });
}

}  // namespace rdmakit::preload
