#pragma once
// One factory per provider; Context::open picks among the ones built.
#include <memory>
#include <string>

#include "rdmakit/context.hpp"
#include "rdmakit/provider.hpp"

namespace rdmakit::core {

std::unique_ptr<Context> make_shm_context(const ContextOptions& options);
#ifdef RDMAKIT_HAVE_TCP
std::unique_ptr<Context> make_tcp_context(const ContextOptions& options);
#endif
#ifdef RDMAKIT_HAVE_VERBS
std::unique_ptr<Context> make_verbs_context(const ContextOptions& options);
// True if a device with an active port exists; otherwise *reason says why not.
bool verbs_device_usable(std::string* reason);
// Fills everything in *list but verbs_built (rdmakit::list_devices).
void list_verbs_devices(RdmaDeviceList* list);
#endif

}  // namespace rdmakit::core
