#pragma once
// The server's side of the table: the only writer. Lookups, PUT, DELETE and
// growth into a new region (a new epoch) when a neighborhood or the block
// area is full. Single-threaded: the server's loop owns it.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rdmakit/rdmakit.hpp"
#include "table_layout.hpp"

namespace rdmakit::kv {

struct TableOptions {
  uint64_t capacity = 32768;  // keys the first table is sized for
  uint64_t blocks = 64;       // long-entry blocks (kBlockSize each) in the first table
  bool grow = true;           // false: a full table refuses the PUT
  uint64_t max_buckets = uint64_t{1} << 21;  // growth stops here (256 MiB of slots)
  uint64_t max_blocks = 4096;                // and here (256 MiB of blocks)
};

enum class PutOutcome { kOk, kFullNeighborhood, kFullBlocks };

class Table {
 public:
  Table(Context& ctx, const TableOptions& options);
  ~Table();
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  // Keys and values must already be within kMaxKey / kMaxValue.
  PutOutcome put(std::string_view key, std::string_view value);
  bool get(std::string_view key, std::string* value) const;
  bool erase(std::string_view key);

  const TableInfo& info() const noexcept { return current_.info; }
  uint64_t size() const noexcept { return size_; }
  uint32_t epoch() const noexcept { return current_.info.epoch; }
  // Why the last put failed, for the client's error message.
  std::string full_reason(PutOutcome outcome) const;

 private:
  struct Generation {
    std::unique_ptr<MemoryRegion> mr;
    TableInfo info;
    std::vector<uint32_t> free_blocks;
  };
  Generation make_generation(uint64_t buckets, uint64_t blocks, uint32_t epoch);
  Slot* slot(const Generation& g, uint64_t index) const noexcept;
  std::byte* block(const Generation& g, uint32_t index) const noexcept;
  // Copies slot `index` of g to *out; false unless it holds an entry whose
  // lengths and block index are within bounds (table.cpp, entry_in_bounds).
  bool load_entry(const Generation& g, uint64_t index, Slot* out) const noexcept;
  // Where an indirect entry's key (then value) lies; s from load_entry.
  const std::byte* entry_key(const Generation& g, const Slot& s) const noexcept;
  // The block an indirect slot names, or kNoBlock (also when out of range).
  uint32_t indirect_block(const Generation& g, const Slot& shared) const noexcept;
  // Index of the slot holding key in g, or -1.
  int64_t find(const Generation& g, std::string_view key, uint64_t hash) const;
  PutOutcome put_into(Generation& g, std::string_view key, std::string_view value,
                      uint64_t seq);
  // False at the limits (the current table stays as it is).
  bool grow(bool more_slots, bool more_blocks);
  void retire(Generation& g);

  Context& ctx_;
  TableOptions options_;
  Generation current_;
  // Retired tables stay registered: a client that has not learnt the new
  // epoch READs their kMoved slots, never an unregistered rkey (which would
  // put its QP in error). Doubling keeps them below the current size in sum.
  std::vector<std::unique_ptr<MemoryRegion>> retired_;
  uint64_t seq_ = 0;
  uint64_t size_ = 0;
};

}  // namespace rdmakit::kv
