#pragma once
// Connections a process uses where the library cannot see it
// (docs/preload.md, "Process shapes"). An inetd-style program that got its
// connection across exec and reads it through stdio (glibc's fread reaches
// read() inside libc, which no preload can interpose) never makes a first
// use through a hook, and its client would wait out the rendezvous budget.
// While inherited connections are pending, a thread looks at where this
// process's threads are blocked (/proc/self/task/*/syscall); one blocked
// reading a pending connection settles it on kernel TCP, and its client is
// told at once.
namespace rdmakit::preload {

// After the inherited descriptors are classified (library load): starts
// the watch if any is pending.
void watch_inherited_use() noexcept;

}  // namespace rdmakit::preload
