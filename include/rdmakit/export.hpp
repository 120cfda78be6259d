#pragma once
// The shared libraries (librdmakit, librdmakit-session, librdmakit-stream)
// are built with hidden symbol visibility: only what carries RDMAKIT_API
// (the public classes and functions of include/rdmakit/) is exported, each
// library's version script keeping it to the library's own namespace.
#if defined(__GNUC__) || defined(__clang__)
#define RDMAKIT_API __attribute__((visibility("default")))
#else
#define RDMAKIT_API
#endif
