#pragma once
// Whether a process other than this one still holds a connection this one
// carries (relay_server.cpp keeps such a connection open when its last
// local copy closes).
namespace rdmakit::preload {

struct Conn;
// Reads /proc: only when a shared connection's last local copy closes.
bool held_elsewhere(Conn& c);

}  // namespace rdmakit::preload
