#include "rules.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "process.hpp"

namespace rdmakit::preload {

namespace {

struct PortRange {
  uint16_t lo, hi;
};
struct Net {  // IPv6 (IPv4 as v4-mapped) prefix
  in6_addr addr{};
  int bits = 0;
};

struct Rules {
  std::string process_denied;
  std::vector<PortRange> allow_ports, deny_ports;
  std::vector<Net> allow_addrs, deny_addrs;
  std::string errors;
};

std::vector<std::string> split(const char* v) {
  std::vector<std::string> out;
  if (v == nullptr) return out;
  std::string cur;
  for (const char* p = v;; ++p) {
    if (*p == ',' || *p == ' ' || *p == '\0') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur += *p;
    }
  }
  return out;
}

void note(Rules* r, const std::string& e) {
  if (!r->errors.empty()) r->errors += "; ";
  r->errors += e;
}

std::vector<PortRange> ports(const char* var, Rules* r) {
  std::vector<PortRange> out;
  for (const auto& item : split(std::getenv(var))) {
    char* end = nullptr;
    const long lo = std::strtol(item.c_str(), &end, 10);
    long hi = lo;
    if (*end == '-') hi = std::strtol(end + 1, &end, 10);
    if (*end != '\0' || lo < 1 || hi > 65535 || hi < lo) {
      note(r,
           std::string(var) + ": '" + item + "' is not a port or port range (ignored)");
      continue;
    }
    out.push_back({static_cast<uint16_t>(lo), static_cast<uint16_t>(hi)});
  }
  return out;
}

in6_addr mapped(const in_addr& a) {
  in6_addr m{};
  m.s6_addr[10] = 0xff;
  m.s6_addr[11] = 0xff;
  std::memcpy(&m.s6_addr[12], &a, 4);
  return m;
}

std::vector<Net> nets(const char* var, Rules* r) {
  std::vector<Net> out;
  for (const auto& item : split(std::getenv(var))) {
    const auto slash = item.find('/');
    const std::string host = item.substr(0, slash);
    Net n;
    in_addr a4{};
    int max_bits = 128;
    if (inet_pton(AF_INET, host.c_str(), &a4) == 1) {
      n.addr = mapped(a4);
      max_bits = 32;
    } else if (inet_pton(AF_INET6, host.c_str(), &n.addr) != 1) {
      note(r, std::string(var) + ": '" + item + "' is not an address (ignored)");
      continue;
    }
    int bits = max_bits;
    if (slash != std::string::npos) {
      char* end = nullptr;
      bits = static_cast<int>(std::strtol(item.c_str() + slash + 1, &end, 10));
      if (*end != '\0' || bits < 0 || bits > max_bits) {
        note(r, std::string(var) + ": '" + item + "' has a bad prefix length (ignored)");
        continue;
      }
    }
    n.bits = bits + (max_bits == 32 ? 96 : 0);
    out.push_back(n);
  }
  return out;
}

bool listed(const char* var, const char* name) {
  for (const auto& p : split(std::getenv(var))) {
    if (p == name) return true;
  }
  return false;
}

Rules load() {
  Rules r;
  const char* on = std::getenv("RDMAKIT_PRELOAD");
  const char* prog = launch_name();
  if (on != nullptr && std::strcmp(on, "0") == 0) {
    r.process_denied = "preload switched off (RDMAKIT_PRELOAD=0)";
  } else if (listed("RDMAKIT_PRELOAD_DENY_PROGRAMS", prog)) {
    r.process_denied =
        std::string("program ") + prog + " is in RDMAKIT_PRELOAD_DENY_PROGRAMS";
  } else if (const char* allow = std::getenv("RDMAKIT_PRELOAD_ALLOW_PROGRAMS");
             allow != nullptr && *allow != '\0' &&
             !listed("RDMAKIT_PRELOAD_ALLOW_PROGRAMS", prog)) {
    r.process_denied =
        std::string("program ") + prog + " is not in RDMAKIT_PRELOAD_ALLOW_PROGRAMS";
  }
  r.allow_ports = ports("RDMAKIT_PRELOAD_ALLOW_PORTS", &r);
  r.deny_ports = ports("RDMAKIT_PRELOAD_DENY_PORTS", &r);
  r.allow_addrs = nets("RDMAKIT_PRELOAD_ALLOW_ADDRS", &r);
  r.deny_addrs = nets("RDMAKIT_PRELOAD_DENY_ADDRS", &r);
  return r;
}

const Rules& rules() {
  static const Rules* r = new Rules(load());
  return *r;
}

bool in(const std::vector<PortRange>& v, uint16_t port) {
  for (const auto& p : v) {
    if (port >= p.lo && port <= p.hi) return true;
  }
  return false;
}

bool in(const std::vector<Net>& v, const in6_addr& a) {
  for (const auto& n : v) {
    int bits = n.bits;
    int i = 0;
    for (; bits >= 8; bits -= 8, ++i) {
      if (a.s6_addr[i] != n.addr.s6_addr[i]) break;
    }
    if (bits >= 8) continue;
    const auto mask = static_cast<uint8_t>(0xff << (8 - bits));
    if (bits == 0 || ((a.s6_addr[i] ^ n.addr.s6_addr[i]) & mask) == 0) return true;
  }
  return false;
}

}  // namespace

const std::string& process_denied() { return rules().process_denied; }
const std::string& rule_errors() { return rules().errors; }

std::string connection_denied(uint16_t port, const sockaddr* peer) {
  const Rules& r = rules();
  const std::string p = std::to_string(port);
  if (in(r.deny_ports, port)) return "port " + p + " is in RDMAKIT_PRELOAD_DENY_PORTS";
  if (!r.allow_ports.empty() && !in(r.allow_ports, port))
    return "port " + p + " is not in RDMAKIT_PRELOAD_ALLOW_PORTS";
  if (peer == nullptr || (r.deny_addrs.empty() && r.allow_addrs.empty())) return {};
  in6_addr a{};
  char text[INET6_ADDRSTRLEN] = "?";
  if (peer->sa_family == AF_INET) {
    const auto* in4 = reinterpret_cast<const sockaddr_in*>(peer);  // NOLINT
    a = mapped(in4->sin_addr);
    inet_ntop(AF_INET, &in4->sin_addr, text, sizeof text);
  } else {
    a = reinterpret_cast<const sockaddr_in6*>(peer)->sin6_addr;  // NOLINT
    inet_ntop(AF_INET6, &a, text, sizeof text);
  }
  if (in(r.deny_addrs, a))
    return std::string("address ") + text + " is in RDMAKIT_PRELOAD_DENY_ADDRS";
  if (!r.allow_addrs.empty() && !in(r.allow_addrs, a))
    return std::string("address ") + text + " is not in RDMAKIT_PRELOAD_ALLOW_ADDRS";
  return {};
}

}  // namespace rdmakit::preload
