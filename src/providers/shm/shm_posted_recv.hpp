#pragma once
// A receiver's own record of a RECV it posted (its own queue or its SRQ).
// The rings the peer writes carry the same fields, but where inline data is
// copied and how much is taken from this process-private copy only.
#include <cstddef>
#include <cstdint>

namespace rdmakit::shm {

struct PostedRecv {
  uint64_t wr_id;
  std::byte* addr;
  uint32_t length;
};

}  // namespace rdmakit::shm
