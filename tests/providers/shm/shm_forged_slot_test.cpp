// A receive ring lives in shared memory the peer can write. Whatever the
// peer forges there, the receiver copies inline data only into the RECV it
// posted, never past that RECV's length, and reports a forged slot as an
// error completion.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "providers/shm/shm_layout.hpp"
#include "rdmakit/rdmakit.hpp"
#include "shm_in_process.hpp"

namespace rdmakit::shm {
namespace {

using namespace std::chrono_literals;

// The receive-ring block (as mapped in this process: the QP's own mapping or
// its in-process peer's, the same memory) whose first slot holds a RECV for
// `buffer`: what a peer sees of it. The QPs close their descriptors once
// mapped, so the mappings are what is left to find.
InboundBlock* find_block_with_recv(const void* buffer) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("memfd:rdmakit-shm-qp") == std::string::npos) continue;
    unsigned long start = 0;
    unsigned long end = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &start, &end, perms) != 3) continue;
    if (perms[0] != 'r' || perms[1] != 'w' || end - start < sizeof(InboundBlock))
      continue;
    auto* block = reinterpret_cast<InboundBlock*>(start);  // NOLINT
    if (block->slots()[0].addr == reinterpret_cast<uint64_t>(buffer)) return block;
  }
  return nullptr;
}

// Completes slot 0 as a sender would, with the given inline length.
void forge_inline_send(RecvSlot& slot, uint32_t byte_len) {
  slot.byte_len = byte_len;
  slot.opcode = static_cast<uint8_t>(Opcode::kRecv);
  slot.status = static_cast<uint8_t>(Status::kSuccess);
  slot.data_inline = 1;
  std::memset(slot.data, 0xAB, sizeof slot.data);
  slot.done_seq.store(1, std::memory_order_release);
}

// Marks 256 bytes at offset 4096 with 0x11, posts a RECV of `length` bytes
// there on b and returns the slot a peer would complete it through.
RecvSlot* post_marked_recv(Connected& c, uint64_t wr_id, uint32_t length) {
  std::byte* buffer = c.mem->data() + 4096;
  std::memset(buffer, 0x11, 256);
  if (!c.b->post_recv(
              {.wr_id = wr_id, .addr = buffer, .length = length, .lkey = c.mem->lkey()})
           .ok()) {
    return nullptr;
  }
  InboundBlock* block = find_block_with_recv(buffer);
  return block != nullptr ? &block->slots()[0] : nullptr;
}

void expect_untouched(const std::byte* buffer, int length) {
  for (int i = 0; i < length; ++i) ASSERT_EQ(buffer[i], std::byte{0x11}) << "byte " << i;
}

Completion poll_one(CompletionQueue& cq) {
  Completion c;
  EXPECT_EQ(cq.wait({&c, 1}, 2s), 1);
  return c;
}

TEST(ShmForgedSlotTest, InlineLengthPastThePostedRecvIsAnErrorAndCopiesNothing) {
  Connected c = connect_in_process();
  RecvSlot* slot = post_marked_recv(c, 5, 8);
  ASSERT_NE(slot, nullptr);
  forge_inline_send(*slot, 16);  // fits the slot, not the 8-byte RECV
  const Completion got = poll_one(*c.cq);
  EXPECT_EQ(got.wr_id, 5u);
  EXPECT_EQ(got.status, Status::kLocalQpOperationError) << status_name(got.status);
  expect_untouched(c.mem->data() + 4096, 256);
  EXPECT_EQ(c.b->state(), QpState::kError);
}

TEST(ShmForgedSlotTest, InlineLengthPastTheSlotIsAnError) {
  Connected c = connect_in_process();
  RecvSlot* slot = post_marked_recv(c, 6, 256);
  ASSERT_NE(slot, nullptr);
  forge_inline_send(*slot, kSlotInline + 100);
  const Completion got = poll_one(*c.cq);
  EXPECT_EQ(got.status, Status::kLocalQpOperationError) << status_name(got.status);
  expect_untouched(c.mem->data() + 4096, 256);
}

TEST(ShmForgedSlotTest, ARedirectedBufferAddressIsIgnored) {
  Connected c = connect_in_process();
  std::byte* elsewhere = c.mem->data() + 8192;
  std::memset(elsewhere, 0x11, 64);
  RecvSlot* slot = post_marked_recv(c, 7, 64);
  ASSERT_NE(slot, nullptr);
  slot->addr = reinterpret_cast<uint64_t>(elsewhere);
  forge_inline_send(*slot, 8);
  const Completion got = poll_one(*c.cq);
  EXPECT_EQ(got.status, Status::kSuccess) << status_name(got.status);
  EXPECT_EQ(got.byte_len, 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c.mem->data()[4096 + i], std::byte{0xAB});
  expect_untouched(elsewhere, 64);
}

}  // namespace
}  // namespace rdmakit::shm
