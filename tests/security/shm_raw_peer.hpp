#pragma once
// An shm peer that speaks the handshake by hand and then does what a hostile
// process can do with what it received: map, reopen and rewrite memory,
// forge ring slots and its own region table.
#include <cstdint>
#include <string>

#include "providers/shm/shm_layout.hpp"
#include "providers/shm/shm_unix_socket.hpp"

namespace rdmakit::shm::attack {

struct RawPeer {
  // Connects to port and exchanges Hellos; false with `error` set on refusal.
  bool connect(uint16_t port, bool offer_payload_socket);
  std::string error;

  // Ours: the table and receive ring the target reads as our side.
  Fd own_table_fd;
  RegionTable* own_table = nullptr;
  Fd own_block_fd;
  InboundBlock* own_block = nullptr;
  uint32_t own_ring = 8;
  Fd own_event;        // our wake socket's receiving end
  Fd own_event_send;   // what the target gets to wake us
  Fd own_request_end;  // the target asks us here; we never answer
  Fd own_payload_rx;   // the target's SEND payloads to us (when we offer it)

  // Theirs.
  Hello hello{};
  Fd table_fd, block_fd, cq_event, request_socket, payload_socket;
  const RegionTable* table = nullptr;
  InboundBlock* block = nullptr;
  size_t block_bytes = 0;
  Fd sock;

  // Asks the target's service thread for a region's memfd; returns it
  // (empty when refused) and whether it came writable.
  Fd get_region(uint32_t rkey, bool* writable);
  // Asks the target's service thread to perform an atomic; returns its status.
  uint32_t atomic(RequestOp op, uint32_t rkey, uint64_t addr, uint64_t add);
  // Publishes our message n into the target's receive ring.
  void publish(uint64_t n, uint32_t byte_len, uint8_t where, uint8_t opcode,
               uint8_t status);
  void wake_target();
};

}  // namespace rdmakit::shm::attack
