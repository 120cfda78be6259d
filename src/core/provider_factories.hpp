#pragma once
// One factory per provider; Context::open picks among the ones built.
#include <memory>
#include <string>

#include "rdmakit/context.hpp"

namespace rdmakit::core {

std::unique_ptr<Context> make_shm_context(const ContextOptions& options);
#ifdef RDMAKIT_HAVE_TCP
std::unique_ptr<Context> make_tcp_context(const ContextOptions& options);
#endif
#ifdef RDMAKIT_HAVE_VERBS
std::unique_ptr<Context> make_verbs_context(const ContextOptions& options);
// True if a device with an active port exists; otherwise *reason says why not.
bool verbs_device_usable(std::string* reason);
#endif

}  // namespace rdmakit::core
