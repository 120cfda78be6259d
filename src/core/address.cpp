#include "core/address.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <charconv>

#include "rdmakit/error.hpp"

namespace rdmakit::core {

std::string HostPort::to_string() const {
  if (host.find(':') != std::string::npos)
    return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

HostPort parse_host_port(const std::string& address, const char* operation,
                         const char* provider) {
  auto fail = [&](const char* why) {
    return Error(operation, provider, address, EINVAL, why);
  };
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) throw fail("address must be host:port");
  HostPort out;
  out.host = address.substr(0, colon);
  if (out.host.size() >= 2 && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  if (out.host.empty()) throw fail("empty host");
  const std::string port_text = address.substr(colon + 1);
  unsigned port = 0;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port > 65535) {
    throw fail("port must be a number 0..65535");
  }
  out.port = static_cast<uint16_t>(port);
  return out;
}

std::string sockaddr_string(const sockaddr* sa) {
  if (sa == nullptr) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    return HostPort{host, ntohs(in->sin_port)}.to_string();
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    return HostPort{host, ntohs(in6->sin6_port)}.to_string();
  }
  return "?";
}

}  // namespace rdmakit::core
