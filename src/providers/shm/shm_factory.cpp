#include <cerrno>

#include "core/provider_factories.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::core {
std::unique_ptr<Context> make_shm_context(const ContextOptions&) {
  throw Error("Context::open", "shm", "", ENOSYS, "shm provider not built yet");
}
}  // namespace rdmakit::core
