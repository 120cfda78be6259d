#pragma once
// One RAII owner per verbs / rdma_cm object. Each release logs (never throws)
// when the library refuses, because destructors cannot report otherwise.
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <memory>

namespace rdmakit::verbs {

void log_release_failure(const char* verb, int err) noexcept;

template <typename T, int (*Release)(T*), const char* const* kVerb>
struct Releaser {
  void operator()(T* object) const noexcept {
    if (object == nullptr) return;
    if (int rc = Release(object); rc != 0) {
      log_release_failure(*kVerb, rc > 0 ? rc : errno);
    }
  }
};

inline constexpr const char* kDeallocPd = "ibv_dealloc_pd";
inline constexpr const char* kDeregMr = "ibv_dereg_mr";
inline constexpr const char* kDestroyCompChannel = "ibv_destroy_comp_channel";
inline constexpr const char* kDestroyCq = "ibv_destroy_cq";
inline constexpr const char* kDestroyQp = "ibv_destroy_qp";
inline constexpr const char* kDestroySrq = "ibv_destroy_srq";
inline constexpr const char* kDestroyId = "rdma_destroy_id";

inline int destroy_event_channel(rdma_event_channel* channel) {
  rdma_destroy_event_channel(channel);  // returns void
  return 0;
}
inline constexpr const char* kDestroyEventChannel = "rdma_destroy_event_channel";

using PdHandle = std::unique_ptr<ibv_pd, Releaser<ibv_pd, ibv_dealloc_pd, &kDeallocPd>>;
using MrHandle = std::unique_ptr<ibv_mr, Releaser<ibv_mr, ibv_dereg_mr, &kDeregMr>>;
using CompChannelHandle =
    std::unique_ptr<ibv_comp_channel, Releaser<ibv_comp_channel, ibv_destroy_comp_channel,
                                               &kDestroyCompChannel>>;
using CqHandle = std::unique_ptr<ibv_cq, Releaser<ibv_cq, ibv_destroy_cq, &kDestroyCq>>;
using QpHandle = std::unique_ptr<ibv_qp, Releaser<ibv_qp, ibv_destroy_qp, &kDestroyQp>>;
using SrqHandle =
    std::unique_ptr<ibv_srq, Releaser<ibv_srq, ibv_destroy_srq, &kDestroySrq>>;
using CmIdHandle =
    std::unique_ptr<rdma_cm_id, Releaser<rdma_cm_id, rdma_destroy_id, &kDestroyId>>;
using EventChannelHandle = std::unique_ptr<
    rdma_event_channel,
    Releaser<rdma_event_channel, destroy_event_channel, &kDestroyEventChannel>>;

// The device contexts librdmacm opened (rdma_get_devices). cm_id->verbs
// points into this list, so the protection domain must come from it too.
struct CmDeviceListReleaser {
  void operator()(ibv_context** list) const noexcept { rdma_free_devices(list); }
};
using CmDeviceList = std::unique_ptr<ibv_context*, CmDeviceListReleaser>;

}  // namespace rdmakit::verbs
