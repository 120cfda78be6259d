// rdmakit::list_devices: the verbs provider's discovery, in public types.
#include "core/provider_factories.hpp"
#include "rdmakit/provider.hpp"

namespace rdmakit {

RdmaDeviceList list_devices() {
  RdmaDeviceList list;
#ifdef RDMAKIT_HAVE_VERBS
  list.verbs_built = true;
  core::list_verbs_devices(&list);
#else
  list.auto_choice = ProviderKind::kShm;
  list.auto_reason = "built without the verbs provider";
#endif
  return list;
}

}  // namespace rdmakit
