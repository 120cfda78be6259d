// Provider selection: explicit option, then RDMAKIT_PROVIDER, then auto
// (verbs when a usable device exists, otherwise shm). Always logged.
#include <atomic>
#include <cerrno>
#include <cstdlib>

#include "core/log.hpp"
#include "core/provider_factories.hpp"
#include "rdmakit/context.hpp"
#include "rdmakit/error.hpp"
#include "rdmakit/testing.hpp"

namespace rdmakit {

namespace {
std::atomic<testing::ContextFactory> g_test_factory{nullptr};
}  // namespace

testing::ContextFactory testing::set_context_factory(ContextFactory factory) noexcept {
  return g_test_factory.exchange(factory, std::memory_order_acq_rel);
}

ProviderKind parse_provider(const std::string& name) {
  if (name == "auto") return ProviderKind::kAuto;
  if (name == "shm") return ProviderKind::kShm;
  if (name == "tcp") return ProviderKind::kTcp;
  if (name == "verbs") return ProviderKind::kVerbs;
  throw Error("parse_provider", name, "", EINVAL,
              "unknown provider (expected auto, shm, tcp or verbs)");
}

std::unique_ptr<Context> Context::open(const ContextOptions& requested) {
  if (auto factory = g_test_factory.load(std::memory_order_acquire))
    return factory(requested);
  ContextOptions options = requested;
  std::string why = "requested by the caller";
  if (options.provider == ProviderKind::kAuto) {
    if (const char* env = std::getenv("RDMAKIT_PROVIDER"); env != nullptr && *env) {
      options.provider = parse_provider(env);
      why = "RDMAKIT_PROVIDER";
    }
  }
  if (options.provider == ProviderKind::kAuto) {
#ifdef RDMAKIT_HAVE_VERBS
    std::string reason;
    if (core::verbs_device_usable(&reason)) {
      options.provider = ProviderKind::kVerbs;
      why = "auto: a usable RDMA device exists";
    } else {
      options.provider = ProviderKind::kShm;
      why = "auto: no usable RDMA device (" + reason + ")";
    }
#else
    options.provider = ProviderKind::kShm;
    why = "auto: built without the verbs provider";
#endif
  }
  core::log().info("provider {} ({})", rdmakit::provider_name(options.provider), why);
  switch (options.provider) {
    case ProviderKind::kShm: return core::make_shm_context(options);
    case ProviderKind::kTcp:
#ifdef RDMAKIT_HAVE_TCP
      return core::make_tcp_context(options);
#else
      break;
#endif
    case ProviderKind::kVerbs:
#ifdef RDMAKIT_HAVE_VERBS
      return core::make_verbs_context(options);
#else
      break;
#endif
    case ProviderKind::kAuto: break;
  }
  throw Error("Context::open", rdmakit::provider_name(options.provider), "", ENOTSUP,
              "this build of rdmakit does not include that provider");
}

}  // namespace rdmakit
