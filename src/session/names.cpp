#include <cerrno>
#include <rdmakit/session/options.hpp>

namespace rdmakit::session {

const char* thread_mode_name(ThreadMode mode) noexcept {
  switch (mode) {
    case ThreadMode::kPollerPerEndpoint: return "poller";
    case ThreadMode::kSharedWorkers: return "workers";
    case ThreadMode::kApplication: return "app";
  }
  return "?";
}

const char* event_mode_name(EventMode mode) noexcept {
  switch (mode) {
    case EventMode::kBusyPoll: return "busy";
    case EventMode::kBlocking: return "blocking";
    case EventMode::kEpollFd: return "epoll";
  }
  return "?";
}

ThreadMode parse_thread_mode(const std::string& name) {
  if (name == "poller") return ThreadMode::kPollerPerEndpoint;
  if (name == "workers") return ThreadMode::kSharedWorkers;
  if (name == "app") return ThreadMode::kApplication;
  throw Error("parse thread mode", "", "", EINVAL,
              "'" + name + "': expected poller, workers or app");
}

EventMode parse_event_mode(const std::string& name) {
  if (name == "busy") return EventMode::kBusyPoll;
  if (name == "blocking") return EventMode::kBlocking;
  if (name == "epoll") return EventMode::kEpollFd;
  throw Error("parse event mode", "", "", EINVAL,
              "'" + name + "': expected busy, blocking or epoll");
}

const char* disconnect_reason_name(DisconnectReason reason) noexcept {
  switch (reason) {
    case DisconnectReason::kLocalClose: return "LOCAL_CLOSE";
    case DisconnectReason::kPeerClosed: return "PEER_CLOSED";
    case DisconnectReason::kTransportError: return "TRANSPORT_ERROR";
    case DisconnectReason::kPeerSilent: return "PEER_SILENT";
  }
  return "?";
}

const char* errc_name(Errc code) noexcept {
  switch (code) {
    case Errc::kOk: return "OK";
    case Errc::kTransport: return "TRANSPORT";
    case Errc::kNoSuchBuffer: return "NO_SUCH_BUFFER";
    case Errc::kOutOfRange: return "OUT_OF_RANGE";
    case Errc::kTooLarge: return "TOO_LARGE";
    case Errc::kNoCredit: return "NO_CREDIT";
    case Errc::kClosed: return "CLOSED";
    case Errc::kQueueFull: return "QUEUE_FULL";
    case Errc::kTimeout: return "TIMEOUT";
    case Errc::kInvalid: return "INVALID";
  }
  return "?";
}

}  // namespace rdmakit::session
