#pragma once
// Which connections may be upgraded (docs/preload.md, "Configuration"):
// the on/off switch and allow/deny lists by program, port and address, read
// from the environment once. A connection the rules keep on kernel TCP is
// logged with the rule that decided it.
#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace rdmakit::preload {

// "" when the process may upgrade at all, else why not (switch, program).
const std::string& process_denied();
// "" when a connection to server port `port` with peer address `peer` may
// be upgraded, else the rule that denies it (peer null: port rules only).
std::string connection_denied(uint16_t port, const sockaddr* peer);
// Parse errors of the rule variables ("" if none), logged once.
const std::string& rule_errors();

}  // namespace rdmakit::preload
