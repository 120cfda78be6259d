#pragma once
// "host:port" parsing and formatting shared by every provider ("[::1]:7471"
// for IPv6).
#include <cstdint>
#include <string>

struct sockaddr;

namespace rdmakit::core {

struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string to_string() const;
};

// Throws rdmakit::Error(EINVAL) naming the operation and provider.
HostPort parse_host_port(const std::string& address, const char* operation,
                         const char* provider);

// "host:port" of an IPv4/IPv6 socket address; "?" for null or another family.
std::string sockaddr_string(const sockaddr* sa);

}  // namespace rdmakit::core
