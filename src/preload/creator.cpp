#include "creator.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "adopt.hpp"
#include "interruption.hpp"
#include "relay_holders.hpp"
#include "rendezvous.hpp"
#include "state.hpp"

namespace rdmakit::preload {

namespace {

// Not the whole budget: a creator that cannot settle (it exec'd, or has no
// answerer) would cost the waiting use that much; the server's take-up of
// the offer is what the creator's answerer waits for, and a server that is
// slow to take it up is waited for by the claim anyway.
std::chrono::steady_clock::time_point creator_deadline() {
  constexpr std::chrono::milliseconds kAwaitCreator{1000};
  return std::chrono::steady_clock::now() +
         std::min<std::chrono::steady_clock::duration>(config().timeout, kAwaitCreator);
}

bool settled(const Adoption& a) {
  return a.holder == Holder::kOwned || a.holder == Holder::kKernel;
}

// stat, not access: access checks with the real uid, not the effective one.
bool exists(const std::string& path) {
  struct stat st {};
  return !path.empty() && stat(path.c_str(), &st) == 0;
}

}  // namespace

CreatorWait await_creator(const AdoptionMarker& m, pid_t creator,
                          const std::vector<int>& aliases, Adoption* other) {
  const auto deadline = creator_deadline();
  const int fd = aliases.empty() ? -1 : aliases.front();
  while (std::chrono::steady_clock::now() < deadline) {
    const Adoption a = read_adoption(m);
    if (settled(a)) {
      *other = a;
      return CreatorWait::kSettled;
    }
    if (a.holder != Holder::kClaimed) {  // a claim: the creator is settling it
      const bool gone = !alive(creator);
      const bool holds = !gone && std::any_of(aliases.begin(), aliases.end(), [&](int n) {
        return proc_fd_names_socket(creator, std::to_string(n).c_str(), m.socket,
                                    m.socket);
      });
      if (!holds) {
        log_line("connect fd=%d: pid %d, which connected it, %s: this process settles it",
                 fd, static_cast<int>(creator),
                 gone ? "has exited" : "no longer holds it");
        return CreatorWait::kLetGo;
      }
    }
    (void)poll_through_signals(nullptr, 0, 1);
  }
  log_line(
      "connect fd=%d: pid %d, which connected it and still holds it, did not settle it "
      "within the budget: kept on kernel TCP",
      fd, static_cast<int>(creator));
  return CreatorWait::kStillHeld;
}

bool offered_by_a_connect(int tcp_fd) {
  if (exists(connect_offer_path(tcp_fd))) return true;
  // Taken up since: the creator claimed the marker before it removed the offer.
  return read_adoption(adoption_marker_of(tcp_fd, true)).holder != Holder::kNone;
}

bool keep_on_kernel_at_exec(int tcp_fd) {
  const AdoptionMarker m = adoption_marker_of(tcp_fd, true);
  Adoption other;
  if (m.path.empty() || !claim_adoption(m, std::chrono::steady_clock::now(), &other))
    return false;
  mark_adoption(m, Holder::kKernel);
  const char* reason =
      "reached this program across exec before its first use (a program may use it "
      "through stdio, which rdmakit does not see)";
  log_line("connect fd=%d %s path=kernel reason=%s", tcp_fd, describe(tcp_fd).c_str(),
           reason);
  publish_fallback(tcp_fd, "connect", reason);
  return true;
}

bool await_offer_taken(const AdoptionMarker& m, int tcp_fd, Adoption* other) {
  const std::string offer = connect_offer_path(tcp_fd);
  const auto deadline = creator_deadline();
  while (std::chrono::steady_clock::now() < deadline) {
    // The offer first: its creator claims the marker before removing it, so
    // an offer gone and a marker unclaimed after it mean nobody settles it.
    const bool outstanding = exists(offer);
    const Adoption a = read_adoption(m);
    if (settled(a)) {
      *other = a;
      return true;
    }
    if (!outstanding && (a.holder == Holder::kNone || !a.alive)) return false;
    (void)poll_through_signals(nullptr, 0, 1);
  }
  log_line(
      "connect fd=%d: its offer was not taken up within the budget: this process "
      "settles it",
      tcp_fd);
  return false;
}

}  // namespace rdmakit::preload
