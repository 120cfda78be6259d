#include "helpers.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace rdmakit {

void PrintTo(Status status, std::ostream* os) { *os << status_name(status); }
void PrintTo(PostStatus status, std::ostream* os) { *os << post_status_name(status); }
void PrintTo(Opcode opcode, std::ostream* os) { *os << opcode_name(opcode); }
void PrintTo(QpState state, std::ostream* os) { *os << qp_state_name(state); }
void PrintTo(const Completion& c, std::ostream* os) {
  *os << "{wr_id=" << c.wr_id << " " << opcode_name(c.opcode) << " "
      << status_name(c.status) << " byte_len=" << c.byte_len << " qp_num=" << c.qp_num;
  if (c.has_imm()) *os << " imm=" << c.imm;
  *os << "}";
}

}  // namespace rdmakit

namespace rdmakit::test {
namespace {

using Clock = std::chrono::steady_clock;

std::string describe(const Completion& c) {
  std::ostringstream os;
  PrintTo(c, &os);
  return os.str();
}

}  // namespace

milliseconds wait_timeout() { return scaled(milliseconds(10000)); }
milliseconds control_timeout() { return scaled(milliseconds(30000)); }

QpOptions test_qp_options() {
  QpOptions options;
  options.max_send_wr = 64;
  options.max_recv_wr = 64;
  options.rnr_timeout = milliseconds(3000);
  // Here peer_timeout only bounds transport retries of cases that do not
  // test it (those set their own), so it is a hang guard and scales: under
  // emulation two busy VMs can go unanswered for more than 3 s (AtomicTest
  // across two VMs ended in RETRY_EXCEEDED at 30k FETCH_ADDs).
  options.peer_timeout = scaled(milliseconds(3000));
  return options;
}

Endpoint accept_endpoint(Context& ctx, Listener& listener, QpOptions options,
                         std::span<const std::byte> reply, const CqOptions& cq_options) {
  Endpoint ep;
  ep.send_cq = ctx.create_cq(cq_options);
  ep.recv_cq = ctx.create_cq(cq_options);
  options.send_cq = ep.send_cq.get();
  options.recv_cq = ep.recv_cq.get();
  ep.qp = listener.accept(options, control_timeout(), reply);
  return ep;
}

Endpoint connect_endpoint(RoleEnv& env, Context& ctx, QpOptions options,
                          std::span<const std::byte> private_data,
                          const CqOptions& cq_options) {
  Endpoint ep;
  ep.send_cq = ctx.create_cq(cq_options);
  ep.recv_cq = ctx.create_cq(cq_options);
  options.send_cq = ep.send_cq.get();
  options.recv_cq = ep.recv_cq.get();
  ep.qp = env.connect(ctx, options, private_data);
  return ep;
}

// ---------------------------------------------------------------- Control

namespace {
QpOptions control_qp_options(CompletionQueue* cq) {
  QpOptions options;
  options.send_cq = cq;
  options.recv_cq = cq;
  options.max_send_wr = 4;
  options.max_recv_wr = Control::kSlots;
  options.rnr_timeout = milliseconds(5000);
  options.peer_timeout = milliseconds(5000);
  return options;
}
}  // namespace

Control::Control(Context& ctx)
    : cq_(ctx.create_cq()),
      mr_(ctx.allocate(kSlotSize * (kSlots + 1), kAccessLocalWrite)) {}

Control::~Control() = default;

std::unique_ptr<Control> Control::accept(Context& ctx, Listener& listener) {
  std::unique_ptr<Control> c(new Control(ctx));
  c->qp_ = listener.accept(control_qp_options(c->cq_.get()), control_timeout());
  c->start();
  return c;
}

std::unique_ptr<Control> Control::connect(RoleEnv& env, Context& ctx) {
  std::unique_ptr<Control> c(new Control(ctx));
  c->qp_ = env.connect(ctx, control_qp_options(c->cq_.get()));
  c->start();
  return c;
}

void Control::start() {
  for (uint32_t i = 0; i < kSlots; ++i) {
    const RecvWr wr = recv_wr(i, *mr_, i * kSlotSize, kSlotSize);
    const PostResult r = qp_->post_recv(wr);
    if (!r.ok()) {
      throw std::runtime_error(std::string("control post_recv: ") +
                               post_status_name(r.status));
    }
  }
}

::testing::AssertionResult Control::pump(milliseconds timeout, bool want_send) {
  const auto deadline = Clock::now() + timeout;
  bool polled = false;
  for (;;) {
    if (want_send ? send_done_ : !inbox_.empty()) {
      return ::testing::AssertionSuccess();
    }
    // A peer that sent its last message and exited flushes our remaining
    // RECVs; that only matters when we still wait for something.
    if (!error_.empty()) {
      return ::testing::AssertionFailure()
             << "control channel failed while waiting for "
             << (want_send ? "a send completion" : "a message") << ": " << error_;
    }
    auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      // A zero timeout still polls once (try_recv).
      if (polled) {
        return ::testing::AssertionFailure()
               << "control channel: timed out waiting for "
               << (want_send ? "a send completion" : "a message");
      }
      left = Clock::duration::zero();
    }
    polled = true;
    std::array<Completion, 8> out;
    const int n = cq_->wait(out, left);
    for (int i = 0; i < n; ++i) {
      const Completion& c = out[static_cast<size_t>(i)];
      if (!c.ok()) {
        if (error_.empty()) error_ = describe(c);
        continue;
      }
      if (c.opcode == Opcode::kRecv) {
        const auto* slot = mr_->data() + c.wr_id * kSlotSize;
        inbox_.emplace_back(reinterpret_cast<const char*>(slot), c.byte_len);
        const RecvWr wr = recv_wr(c.wr_id, *mr_, c.wr_id * kSlotSize, kSlotSize);
        const PostResult r = qp_->post_recv(wr);
        if (!r.ok() && error_.empty()) {
          error_ = std::string("repost: ") + post_status_name(r.status);
        }
      } else {
        send_done_ = true;
      }
    }
  }
}

::testing::AssertionResult Control::send(std::string_view msg) {
  if (msg.size() > kSlotSize) {
    return ::testing::AssertionFailure() << "control message too long";
  }
  std::byte* slot = mr_->data() + kSlots * kSlotSize;
  std::memcpy(slot, msg.data(), msg.size());
  const SendWr wr = send_wr(next_send_id_++, *mr_, kSlots * kSlotSize,
                            static_cast<uint32_t>(msg.size()));
  const PostResult r = qp_->post_send(wr);
  if (!r.ok()) {
    return ::testing::AssertionFailure()
           << "control post_send: " << post_status_name(r.status);
  }
  send_done_ = false;
  return pump(wait_timeout(), true);
}

::testing::AssertionResult Control::recv(std::string* msg, milliseconds timeout) {
  auto result = pump(timeout, false);
  if (!result) return result;
  *msg = std::move(inbox_.front());
  inbox_.pop_front();
  return ::testing::AssertionSuccess();
}

bool Control::try_recv(std::string* msg) {
  return static_cast<bool>(recv(msg, milliseconds(0)));
}

bool Control::failed() const { return !error_.empty(); }

::testing::AssertionResult Control::expect(std::string_view msg, milliseconds timeout) {
  std::string got;
  auto result = recv(&got, timeout);
  if (!result) return result << " (expected '" << msg << "')";
  if (got != msg) {
    return ::testing::AssertionFailure()
           << "control channel: expected '" << msg << "', got '" << got << "'";
  }
  return ::testing::AssertionSuccess();
}

// ------------------------------------------------------------ completions

::testing::AssertionResult wait_one(CompletionQueue& cq, Completion* out,
                                    milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) break;
    if (cq.wait({out, 1}, left) == 1) return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "no completion within " << timeout.count() << " ms";
}

::testing::AssertionResult wait_n(CompletionQueue& cq, size_t n,
                                  std::vector<Completion>* out, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::array<Completion, 64> batch;
  while (out->size() < n) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      return ::testing::AssertionFailure()
             << "only " << out->size() << " of " << n << " completions within "
             << timeout.count() << " ms";
    }
    const size_t want = std::min(batch.size(), n - out->size());
    const int got = cq.wait({batch.data(), want}, left);
    out->insert(out->end(), batch.begin(), batch.begin() + got);
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult expect_quiet(CompletionQueue& cq, milliseconds window) {
  Completion c;
  const auto deadline = Clock::now() + window;
  while (Clock::now() < deadline) {
    if (cq.poll({&c, 1}) == 1) {
      return ::testing::AssertionFailure() << "unexpected completion " << describe(c);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return ::testing::AssertionSuccess();
}

// --------------------------------------------------------------- patterns

uint8_t pattern_byte(uint64_t seed, size_t index) {
  // A cheap mix of seed and position; odd multipliers keep it a bijection
  // in the index for a fixed seed's low bits.
  uint64_t v = (index + 1) * 0x9E3779B97F4A7C15ull + seed * 0xC2B2AE3D27D4EB4Full;
  v ^= v >> 29;
  v *= 0xBF58476D1CE4E5B9ull;
  v ^= v >> 32;
  return static_cast<uint8_t>(v);
}

void fill_pattern(void* data, size_t length, uint64_t seed) {
  auto* p = static_cast<uint8_t*>(data);
  for (size_t i = 0; i < length; ++i) p[i] = pattern_byte(seed, i);
}

::testing::AssertionResult check_pattern(const void* data, size_t length, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t bad = 0;
  size_t first = 0;
  for (size_t i = 0; i < length; ++i) {
    if (p[i] != pattern_byte(seed, i)) {
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << length << " bytes differ from pattern " << seed
         << "; first at offset " << first << ": expected "
         << int{pattern_byte(seed, first)} << ", got " << int{p[first]};
}

::testing::AssertionResult check_filled(const void* data, size_t length, uint8_t value) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < length; ++i) {
    if (p[i] != value) {
      return ::testing::AssertionFailure()
             << "byte " << i << " is " << int{p[i]} << ", expected " << int{value};
    }
  }
  return ::testing::AssertionSuccess();
}

// ----------------------------------------------------------------- memory

HeapBuffer::HeapBuffer(size_t length) : length_(length) {
  const size_t rounded = std::max<size_t>(4096, (length + 4095) / 4096 * 4096);
  void* p = std::aligned_alloc(4096, rounded);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  data_.reset(static_cast<std::byte*>(p));
}

const char* mem_kind_name(MemKind kind) {
  return kind == MemKind::kAllocated ? "allocate()" : "register_memory(heap)";
}

Buffer make_buffer(Context& ctx, MemKind kind, size_t length, uint32_t access) {
  Buffer b;
  if (kind == MemKind::kAllocated) {
    b.mr = ctx.allocate(length, access);
  } else {
    b.heap = std::make_unique<HeapBuffer>(length);
    b.mr = ctx.register_memory(b.heap->data(), length, access);
  }
  return b;
}

std::vector<std::byte> pack_regions(const std::vector<RemoteRegion>& regions) {
  std::vector<std::byte> blob(regions.size() * RemoteRegion::kSerializedSize);
  for (size_t i = 0; i < regions.size(); ++i) {
    regions[i].serialize(std::span<std::byte, RemoteRegion::kSerializedSize>(
        blob.data() + i * RemoteRegion::kSerializedSize, RemoteRegion::kSerializedSize));
  }
  return blob;
}

std::vector<RemoteRegion> unpack_regions(std::span<const std::byte> blob) {
  std::vector<RemoteRegion> out;
  for (size_t at = 0; at + RemoteRegion::kSerializedSize <= blob.size();
       at += RemoteRegion::kSerializedSize) {
    auto region =
        RemoteRegion::deserialize(blob.subspan(at, RemoteRegion::kSerializedSize));
    if (!region) throw std::runtime_error("peer sent a bad RemoteRegion blob");
    out.push_back(*region);
  }
  return out;
}

// ----------------------------------------------------------- work requests

SendWr send_wr(uint64_t wr_id, const MemoryRegion& mr, size_t offset, uint32_t length,
               uint8_t flags) {
  SendWr wr;
  wr.wr_id = wr_id;
  wr.opcode = Opcode::kSend;
  wr.flags = flags;
  wr.length = length;
  wr.local_addr = mr.data() + offset;
  wr.lkey = mr.lkey();
  return wr;
}

SendWr send_imm_wr(uint64_t wr_id, const MemoryRegion& mr, size_t offset, uint32_t length,
                   uint32_t imm, uint8_t flags) {
  SendWr wr = send_wr(wr_id, mr, offset, length, flags);
  wr.opcode = Opcode::kSendWithImm;
  wr.imm = imm;
  return wr;
}

SendWr rdma_wr(Opcode opcode, uint64_t wr_id, const MemoryRegion& mr, size_t offset,
               uint32_t length, const RemoteRegion& remote, uint64_t remote_offset,
               uint8_t flags) {
  SendWr wr = send_wr(wr_id, mr, offset, length, flags);
  wr.opcode = opcode;
  wr.remote_addr = remote.addr_at(remote_offset);
  wr.rkey = remote.rkey;
  return wr;
}

SendWr atomic_wr(Opcode opcode, uint64_t wr_id, const MemoryRegion& mr, size_t offset,
                 const RemoteRegion& remote, uint64_t remote_offset, uint64_t compare_add,
                 uint64_t swap, uint8_t flags) {
  SendWr wr = rdma_wr(opcode, wr_id, mr, offset, 8, remote, remote_offset, flags);
  wr.compare_add = compare_add;
  wr.swap = swap;
  return wr;
}

RecvWr recv_wr(uint64_t wr_id, const MemoryRegion& mr, size_t offset, uint32_t length) {
  RecvWr wr;
  wr.wr_id = wr_id;
  wr.addr = mr.data() + offset;
  wr.length = length;
  wr.lkey = mr.lkey();
  return wr;
}

::testing::AssertionResult post(QueuePair& qp, const SendWr& wr) {
  const PostResult r = qp.post_send(wr);
  if (r.ok() && r.posted == 1) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "post_send(" << opcode_name(wr.opcode) << ", wr_id " << wr.wr_id
         << ") returned " << post_status_name(r.status) << ", posted " << r.posted;
}

::testing::AssertionResult post(QueuePair& qp, const RecvWr& wr) {
  const PostResult r = qp.post_recv(wr);
  if (r.ok() && r.posted == 1) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "post_recv(wr_id " << wr.wr_id << ") returned " << post_status_name(r.status)
         << ", posted " << r.posted;
}

}  // namespace rdmakit::test
