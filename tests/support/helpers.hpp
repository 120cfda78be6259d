#pragma once
// Building blocks for role functions: connected endpoints, a control channel
// on its own QP, bounded completion waits, byte patterns and memory buffers.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "harness.hpp"
#include "rdmakit/rdmakit.hpp"

// Readable gtest output for the API's enums (found by ADL).
namespace rdmakit {
void PrintTo(Status status, std::ostream* os);
void PrintTo(PostStatus status, std::ostream* os);
void PrintTo(Opcode opcode, std::ostream* os);
void PrintTo(QpState state, std::ostream* os);
void PrintTo(const Completion& completion, std::ostream* os);
}  // namespace rdmakit

namespace rdmakit::test {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Generous: a completion that takes longer than this is a hang (10 s, times
// RDMAKIT_TEST_TIMEOUT_SCALE).
milliseconds wait_timeout();
// Same for a control message, which may wait for a whole phase of the peer.
milliseconds control_timeout();

// A QP with its own send and receive CQs.
struct Endpoint {
  std::unique_ptr<CompletionQueue> send_cq;
  std::unique_ptr<CompletionQueue> recv_cq;
  std::unique_ptr<QueuePair> qp;
};

// Default QP options for data QPs in tests (generous RNR: the peer posts its
// RECVs right after connecting, which races with our first SEND).
QpOptions test_qp_options();

Endpoint accept_endpoint(Context& ctx, Listener& listener,
                         QpOptions options = test_qp_options(),
                         std::span<const std::byte> reply = {},
                         const CqOptions& cq_options = {});
Endpoint connect_endpoint(RoleEnv& env, Context& ctx,
                          QpOptions options = test_qp_options(),
                          std::span<const std::byte> private_data = {},
                          const CqOptions& cq_options = {});

// Small text messages on a separate QP, to sequence the roles even after the
// QP under test has gone to the error state. Works across hosts.
class Control {
 public:
  static std::unique_ptr<Control> accept(Context& ctx, Listener& listener);
  static std::unique_ptr<Control> connect(RoleEnv& env, Context& ctx);
  ~Control();

  // Sends msg (<= kSlotSize bytes) and waits for its send completion.
  ::testing::AssertionResult send(std::string_view msg);
  ::testing::AssertionResult recv(std::string* msg,
                                  milliseconds timeout = control_timeout());
  ::testing::AssertionResult expect(std::string_view msg,
                                    milliseconds timeout = control_timeout());
  // Non-blocking: true and *msg set if a message is waiting.
  bool try_recv(std::string* msg);
  // True once a control completion failed (e.g. the peer is gone).
  bool failed() const;

  static constexpr size_t kSlotSize = 256;
  static constexpr uint32_t kSlots = 16;

 private:
  explicit Control(Context& ctx);
  void start();
  ::testing::AssertionResult pump(milliseconds timeout, bool want_send);

  std::unique_ptr<CompletionQueue> cq_;  // send and receive
  std::unique_ptr<MemoryRegion> mr_;     // kSlots receive slots + 1 send slot
  std::unique_ptr<QueuePair> qp_;
  std::deque<std::string> inbox_;
  uint64_t next_send_id_ = 1u << 20;
  bool send_done_ = false;
  std::string error_;  // first failed completion, if any
};

// Waits for one completion.
::testing::AssertionResult wait_one(CompletionQueue& cq, Completion* out,
                                    milliseconds timeout = wait_timeout());
// Waits until n completions arrived (out gets all of them, even on failure).
::testing::AssertionResult wait_n(CompletionQueue& cq, size_t n,
                                  std::vector<Completion>* out,
                                  milliseconds timeout = wait_timeout());
// No completion shows up within window.
::testing::AssertionResult expect_quiet(CompletionQueue& cq, milliseconds window);

// Deterministic byte pattern; different seeds differ at (nearly) every byte.
uint8_t pattern_byte(uint64_t seed, size_t index);
void fill_pattern(void* data, size_t length, uint64_t seed);
::testing::AssertionResult check_pattern(const void* data, size_t length, uint64_t seed);
::testing::AssertionResult check_filled(const void* data, size_t length, uint8_t value);

// Page-aligned heap memory for register_memory (freed on destruction).
class HeapBuffer {
 public:
  explicit HeapBuffer(size_t length);
  std::byte* data() const { return data_.get(); }
  size_t length() const { return length_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t length_;
};

// Where a test region lives: provider-best memory or registered heap memory.
enum class MemKind { kAllocated, kHeap };
const char* mem_kind_name(MemKind kind);

// A registered region plus the heap buffer behind it (if any).
struct Buffer {
  std::unique_ptr<HeapBuffer> heap;
  std::unique_ptr<MemoryRegion> mr;
  std::byte* data() const { return mr->data(); }
  size_t length() const { return mr->length(); }
};
Buffer make_buffer(Context& ctx, MemKind kind, size_t length, uint32_t access);

// RemoteRegion lists packed for private data (32 bytes each).
std::vector<std::byte> pack_regions(const std::vector<RemoteRegion>& regions);
std::vector<RemoteRegion> unpack_regions(std::span<const std::byte> blob);

// Work request builders.
SendWr send_wr(uint64_t wr_id, const MemoryRegion& mr, size_t offset, uint32_t length,
               uint8_t flags = kSignaled);
SendWr send_imm_wr(uint64_t wr_id, const MemoryRegion& mr, size_t offset, uint32_t length,
                   uint32_t imm, uint8_t flags = kSignaled);
SendWr rdma_wr(Opcode opcode, uint64_t wr_id, const MemoryRegion& mr, size_t offset,
               uint32_t length, const RemoteRegion& remote, uint64_t remote_offset,
               uint8_t flags = kSignaled);
SendWr atomic_wr(Opcode opcode, uint64_t wr_id, const MemoryRegion& mr, size_t offset,
                 const RemoteRegion& remote, uint64_t remote_offset, uint64_t compare_add,
                 uint64_t swap = 0, uint8_t flags = kSignaled);
RecvWr recv_wr(uint64_t wr_id, const MemoryRegion& mr, size_t offset, uint32_t length);

// Posts one request and asserts PostStatus::kOk.
::testing::AssertionResult post(QueuePair& qp, const SendWr& wr);
::testing::AssertionResult post(QueuePair& qp, const RecvWr& wr);

}  // namespace rdmakit::test
