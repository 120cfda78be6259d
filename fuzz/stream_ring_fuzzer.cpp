// Fuzz target: the stream protocol's receive-side accounting (src/stream/
// wire.hpp) fed arbitrary ring records, interleaved with the application's
// reads and sends, plus the connection hello. Messages are ring writes or
// records (DATA carried in a SEND, placed into the ring by the receiver).
// Whatever a peer sends, every
// accepted record keeps the ring invariants, and the bytes the reader copies
// out lie inside the ring (ASan checks the copies).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "stream/wire.hpp"

namespace {

using rdmakit::stream::wire::Flow;
using rdmakit::stream::wire::Hello;

struct Input {
  const uint8_t* p;
  size_t n;
  bool take(void* out, size_t len) {
    if (n < len) return false;
    std::memcpy(out, p, len);
    p += len;
    n -= len;
    return true;
  }
};

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) { return 0; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The hello parser sees the whole input first.
  (void)Hello::parse(std::span(reinterpret_cast<const std::byte*>(data), size));

  Input in{data, size};
  uint16_t ring_kib = 0;
  uint8_t credits = 0;
  if (!in.take(&ring_kib, 2) || !in.take(&credits, 1)) return 0;
  Flow f;
  f.rx_size = 4096u + (ring_kib % 64u) * 1024u;
  f.peer_ring = 4096u * (1u + ring_kib / 4096u % 8u);
  f.peer_credits = rdmakit::stream::wire::kMinCredits + credits % 200u;
  f.msg_credits = f.peer_credits;
  f.peer_rewinds = (credits & 0x80) != 0;
  std::vector<uint8_t> ring(f.rx_size);
  std::vector<uint8_t> sink(f.rx_size);

  uint8_t action = 0;
  while (in.take(&action, 1)) {
    uint32_t a = 0;
    uint32_t b = 0;
    switch (action % 4) {
      case 0: {  // a message from the peer: a ring write, or (high bit) a record
        if (!in.take(&a, 4) || !in.take(&b, 4)) return 0;
        const bool record = (action & 0x80) != 0;
        const Flow before = f;
        if (f.on_message(a, b, record) != Flow::Result::kOk) {
          // Rejected: nothing changed (the stream fails as a whole).
          check(f.rx_written == before.rx_written &&
                f.peer_consumed == before.peer_consumed &&
                f.msg_credits == before.msg_credits);
          return 0;
        }
        if (record) {
          // Accepted: its bytes are in a receive buffer of kRecordStride
          // bytes and go into the ring as the engine places them (ASan
          // checks both sides of the copy: buffers sized exactly).
          check(b <= rdmakit::stream::wire::kRecordData);
          std::vector<std::byte> buf(rdmakit::stream::wire::kRecordStride);
          rdmakit::stream::wire::place_record(reinterpret_cast<std::byte*>(ring.data()),
                                              f.rx_size, f.rx_written - b, buf.data(), b);
        }
        // An accepted rewind starts its bytes at the ring's start, on an
        // empty, fully credited ring.
        if ((a >> rdmakit::stream::wire::kOpShift) == 0 &&
            (a & rdmakit::stream::wire::kRewind) != 0) {
          check(before.rx_read == before.rx_written && before.rx_acked == before.rx_read);
          check((f.rx_written - b) % f.rx_size == 0 && f.rx_read == f.rx_written - b);
        }
        break;
      }
      case 1: {  // the application reads: copy out as the stream does
        if (!in.take(&a, 4)) return 0;
        uint64_t n = std::min<uint64_t>(a, f.available());
        uint64_t pos = f.rx_read;
        size_t at_sink = 0;
        while (n > 0) {
          const uint64_t off = pos % f.rx_size;
          const uint64_t len = std::min<uint64_t>(n, f.rx_size - off);
          std::memcpy(sink.data() + at_sink, ring.data() + off, len);
          at_sink += len;
          pos += len;
          n -= len;
        }
        f.rx_read = pos;
        break;
      }
      case 2: {  // we send: bounded by the peer's room and our credits
        if (!in.take(&a, 4)) return 0;
        if (f.msg_credits == 0) break;
        if (f.rewind_due() != 0) {
          f.rewind();
          check(f.tx_sent % f.peer_ring == 0 && f.peer_room() == f.peer_ring);
        }
        const uint64_t n = std::min<uint64_t>(a, f.peer_room());
        f.tx_sent += n;
        --f.msg_credits;
        break;
      }
      default:  // we report what was consumed
        f.rx_acked = f.rx_read;
        f.take_unreported();
        break;
    }
    check(f.rx_read <= f.rx_written && f.rx_written - f.rx_read <= f.rx_size);
    check(f.peer_consumed <= f.tx_sent && f.msg_credits <= f.peer_credits);
    check(f.peer_room() <= f.peer_ring);
  }
  return 0;
}
