#include "providers/verbs/verbs_cm.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/address.hpp"
#include "core/deadline.hpp"
#include "core/little_endian.hpp"
#include "core/log.hpp"
#include "core/provider_factories.hpp"
#include "providers/verbs/verbs_device.hpp"
#include "providers/verbs/verbs_srq.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::verbs {

using core::Clock;

// ---------------------------------------------------------------- addresses

SockAddr resolve(const core::HostPort& hp, bool passive, const char* operation,
                 const std::string& peer) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* result = nullptr;
  const std::string port = std::to_string(hp.port);
  if (int rc = getaddrinfo(hp.host.c_str(), port.c_str(), &hints, &result); rc != 0) {
    throw Error(operation, kProvider, peer, rc == EAI_SYSTEM ? errno : EHOSTUNREACH,
                fmt::format("getaddrinfo({}): {}", hp.host, gai_strerror(rc)));
  }
  SockAddr out;
  std::memcpy(&out.storage, result->ai_addr, result->ai_addrlen);
  out.length = result->ai_addrlen;
  freeaddrinfo(result);
  return out;
}

// ---------------------------------------------------------------- rdma_cm events

// Waits for the next event, copies what we need and acknowledges it at once
// (an unacknowledged event blocks rdma_destroy_id and rdma_migrate_id).
CmEvent next_event(rdma_event_channel* channel, Clock::time_point deadline,
                   const char* operation, const char* waiting_for,
                   const std::string& peer) {
  pollfd pfd{channel->fd, POLLIN, 0};
  rdma_cm_event* event = nullptr;
  for (;;) {
    const int rc = ::poll(&pfd, 1, core::ms_left(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0)
      throw Error(operation, kProvider, peer, errno, "poll on the rdma_cm channel");
    if (rc == 0) {
      throw Error(operation, kProvider, peer, ETIMEDOUT,
                  fmt::format("no {} before the deadline", waiting_for));
    }
    // The channel is non-blocking: an announced event may have been dropped
    // with its id (EAGAIN), so go back to waiting.
    if (rdma_get_cm_event(channel, &event) == 0) break;
    if (errno != EAGAIN && errno != EINTR) {
      throw Error(operation, kProvider, peer, errno, "rdma_get_cm_event");
    }
  }
  CmEvent out;
  out.type = event->event;
  out.status = event->status;
  out.id = event->id;
  if (event->event == RDMA_CM_EVENT_CONNECT_REQUEST ||
      event->event == RDMA_CM_EVENT_CONNECT_RESPONSE ||
      event->event == RDMA_CM_EVENT_ESTABLISHED ||
      event->event == RDMA_CM_EVENT_REJECTED) {
    const auto& conn = event->param.conn;
    const auto* bytes = static_cast<const std::byte*>(conn.private_data);
    if (bytes != nullptr) out.private_data.assign(bytes, bytes + conn.private_data_len);
    out.initiator_depth = conn.initiator_depth;
    out.responder_resources = conn.responder_resources;
  }
  rdma_ack_cm_event(event);
  return out;
}

// Turns an unexpected rdma_cm event into an Error naming the verb, the
// event, its status and the peer.
[[noreturn]] void throw_cm_failure(const CmEvent& event, const char* operation,
                                   const char* verb, const std::string& peer) {
  int err = EPROTO;
  std::string why;
  switch (event.type) {
    case RDMA_CM_EVENT_REJECTED:
      err = ECONNREFUSED;
      // IB CM reject reasons: 8 = invalid service ID (nobody listens on that
      // port), 28 = consumer defined (the peer's application said no).
      why = event.status == 8    ? ": no listener on that port"
            : event.status == 28 ? ": refused by the peer"
                                 : "";
      break;
    case RDMA_CM_EVENT_UNREACHABLE:
      err = ECONNREFUSED;
      why = ": the peer's connection manager did not answer";
      break;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
      err = EHOSTUNREACH;
      why = ": no RDMA route to that address";
      break;
    case RDMA_CM_EVENT_CONNECT_ERROR: err = ECONNABORTED; break;
    case RDMA_CM_EVENT_DISCONNECTED: err = ECONNRESET; break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL: err = ENODEV; break;
    default: break;
  }
  throw Error(operation, kProvider, peer, err,
              fmt::format("{}: {} (status {}){}", verb, rdma_event_str(event.type),
                          event.status, why));
}

std::optional<CmEvent> queued_event(rdma_event_channel* channel, const char* operation,
                                    const std::string& peer) {
  pollfd pfd{channel->fd, POLLIN, 0};
  if (::poll(&pfd, 1, 0) <= 0) return std::nullopt;
  try {
    return next_event(channel, Clock::now(), operation, "a queued event", peer);
  } catch (const Error&) {
    return std::nullopt;  // announced but gone (EAGAIN until the deadline)
  }
}

CmEvent expect_event(rdma_event_channel* channel, Clock::time_point deadline,
                     rdma_cm_event_type want, const char* operation, const char* verb,
                     const std::string& peer) {
  CmEvent event = next_event(channel, deadline, operation, rdma_event_str(want), peer);
  if (event.type != want) throw_cm_failure(event, operation, verb, peer);
  return event;
}

EventChannelHandle make_channel(const char* operation, const std::string& peer) {
  EventChannelHandle channel(rdma_create_event_channel());
  if (!channel)
    throw Error(operation, kProvider, peer, errno, "rdma_create_event_channel");
  const int flags = fcntl(channel->fd, F_GETFL);
  if (flags < 0 || fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw Error(operation, kProvider, peer, errno,
                "fcntl(O_NONBLOCK) on the rdma_cm channel");
  }
  return channel;
}

}  // namespace rdmakit::verbs
