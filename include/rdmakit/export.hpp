#pragma once
// The library is built with hidden symbol visibility: only what carries
// RDMAKIT_API (the public classes and functions of namespace rdmakit) is
// exported from the shared library.
#if defined(__GNUC__) || defined(__clang__)
#define RDMAKIT_API __attribute__((visibility("default")))
#else
#define RDMAKIT_API
#endif
