#pragma once
// Files that a killed process leaves behind in the directories the preload
// shares with other processes (a process that ends normally removes its
// own). Each reader already ignores such a file; the sweep keeps them from
// piling up in /dev/shm and the private rendezvous directory.
#include <sys/stat.h>

#include <functional>
#include <string>

namespace rdmakit::preload {

// Unlinks each regular file or socket of this uid in dir that stale(name,
// its lstat) calls stale. Control path only.
void remove_stale_entries(
    const std::string& dir,
    const std::function<bool(const char*, const struct stat&)>& stale);

// Removes, of this uid: listener registrations (private and host-wide)
// naming a process that is gone, half-written files of gone processes,
// adoption markers of sockets the kernel no longer has, and offer sockets
// nothing is bound to. Called when a process listens, at most once a
// minute per process: servers start often, and the sweep reads both
// directories and the kernel's socket tables.
void sweep_stale_files();

}  // namespace rdmakit::preload
