#pragma once
// Whether a process other than this one still holds a connection this one
// carries (relay_server.cpp keeps such a connection open when its last
// local copy closes).
#include <sys/types.h>

namespace rdmakit::preload {

struct Conn;
// /proc/PID/fd/FD names the socket of inode a or of inode b.
bool proc_fd_names_socket(long pid, const char* fd, ino_t a, ino_t b);
// Reads /proc: only when a shared connection's last local copy closes.
bool held_elsewhere(Conn& c);

}  // namespace rdmakit::preload
