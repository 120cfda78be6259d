#pragma once
// The cross-host rendezvous records as a peer on the wire sees them
// (src/preload/rendezvous_wire.hpp), for the test programs that forge them.
#include <sys/socket.h>

#include <array>
#include <cstdint>

namespace rdmakit::preload::test {

constexpr uint32_t kMagic = 0x31504b52;
constexpr uint32_t kVersion = 3;
struct Tuple {
  uint8_t family = AF_INET;
  uint8_t pad[3] = {};
  uint8_t client_addr[16] = {};
  uint8_t server_addr[16] = {};
  uint16_t client_port = 0;
  uint16_t server_port = 0;
};
struct Offer {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  Tuple tuple;
  std::array<uint8_t, 16> nonce{};
  uint16_t stream_port = 0;
  uint8_t pad[6] = {};
};
struct Hello {
  uint32_t magic, version, status, flags;
};
static_assert(sizeof(Offer) == 72 && sizeof(Hello) == 16);

}  // namespace rdmakit::preload::test
