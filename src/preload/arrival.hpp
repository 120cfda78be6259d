#pragma once
// Descriptors that reach this process or leave it other than by accept()
// and connect() (docs/preload.md, "Process shapes"): inherited across exec,
// received or sent over a unix socket (SCM_RIGHTS), or a forked child's
// copies of its parent's connections. Each one is recognised here and left
// for its first use to settle (handoff.hpp).
#include <sys/socket.h>

namespace rdmakit::preload {

// Load time: the descriptors inherited across exec.
void scan_inherited() noexcept;
// The application received descriptors (SCM_RIGHTS).
void note_received(const msghdr* msg) noexcept;
// The application sends descriptors (SCM_RIGHTS): a pending or upgraded
// connection among them may now be used by another process.
void note_sent(const msghdr* msg) noexcept;
// In a forked child (after the table is disowned): dormant relays for the
// parent's connections, when they are few.
void relay_foreign_in_child() noexcept;

}  // namespace rdmakit::preload
