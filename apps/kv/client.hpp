#pragma once
// rdmakit-kv client: PUT/DEL/GET as messages, and GET as one-sided READs of
// the server's table (one READ of the key's neighborhood; a second for a long
// entry). One client per thread.
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "auth.hpp"
#include "protocol.hpp"
#include "rdmakit/auth.hpp"
#include "rdmakit/rdmakit.hpp"
#include "table_layout.hpp"

namespace rdmakit::kv {

// The connection failed (server gone, no reply in time): every later call
// throws it too. Its message names the request, the status, provider and peer.
class ClientError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ClientOptions {
  std::string address = "127.0.0.1:7471";
  ProviderKind provider = ProviderKind::kAuto;
  bool inline_sends = false;                // -i: requests that fit go INLINE
  std::chrono::milliseconds timeout{5000};  // per request, and connect
  // Proves this secret to the server and requires the server to prove it
  // back (auth.hpp). A client with a secret refuses a server without one.
  std::shared_ptr<const auth::Secret> secret;
};

enum class GetMode { kRpc, kRead };

struct ReadStats {
  uint64_t reads = 0;        // READ work requests posted
  uint64_t bytes = 0;        // bytes they copied
  uint64_t wide = 0;         // GETs whose home slot's reach took a second READ
  uint64_t retries = 0;      // snapshots rejected (being written, torn, stale block)
  uint64_t table_moves = 0;  // new tables learnt
};

class Client {
 public:
  explicit Client(const ClientOptions& options);  // connects; throws Error
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The server's answer; *why gets its reason text for an error.
  KvStatus put(std::string_view key, std::string_view value, std::string* why = nullptr);
  KvStatus get(std::string_view key, std::string* value, GetMode mode,
               std::string* why = nullptr);
  KvStatus del(std::string_view key, std::string* why = nullptr);
  // Fetches the server's current table (a new epoch after growth).
  void refresh_table();
  // The bench's baseline: the first READ a READ-GET of key posts (the same
  // bytes, QP and wait), with no checks of the copy and no copy out.
  void read_raw(std::string_view key);
  // What the last READ of a home bucket copied (kFirstReadSlots slots, or the
  // bucket's reach as last seen).
  std::span<const std::byte> read_buffer() const noexcept;

  const TableInfo& table() const noexcept { return table_; }
  const ReadStats& read_stats() const noexcept { return stats_; }
  const char* provider_name() const noexcept { return ctx_->provider_name(); }
  const std::string& address() const noexcept { return options_.address; }

 private:
  KvStatus rpc(Op op, std::string_view key, std::string_view value, std::string* payload);
  KvStatus get_by_read(std::string_view key, std::string* value);
  // Runs one READ of len bytes at offset of the table into read_buf_ + at.
  void read(uint64_t offset, uint32_t len, size_t at);
  // READs up to `slots` slots from `slot` to the start of the read buffer;
  // returns the bytes copied.
  uint32_t read_home(uint64_t slot, uint32_t slots);
  // The slots the first READ of home bucket `home` copies.
  uint32_t first_read(uint64_t home) const noexcept {
    const uint8_t hint = first_read_slots_[home];
    return hint == 0 ? kFirstReadSlots : hint;
  }
  void adopt_table(const TableInfo& info);
  // The handshake after connect: proof, the server's proof, the table.
  void authenticate(const auth::Nonce& client_nonce);
  // Waits for the completion with wr_id; throws ClientError on error/timeout.
  void await(uint64_t wr_id, const char* what);
  // Posts the one receive buffer replies land in; fail(failure) if refused.
  void post_reply_buffer(const char* failure);
  [[noreturn]] void fail(const std::string& what);
  KvStatus check_local(std::string_view key, std::string_view value,
                       std::string* why) const;

  ClientOptions options_;
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<MemoryRegion> mr_;
  std::unique_ptr<QueuePair> qp_;  // destroyed before mr_ and cq_
  TableInfo table_;
  bool table_stale_ = false;
  std::string broken_;  // set once the connection failed
  uint64_t next_id_ = 1;
  bool send_done_ = false;
  bool recv_done_ = false;
  bool read_done_ = false;
  uint32_t recv_len_ = 0;
  std::array<Completion, 4> batch_{};  // await()'s poll buffer
  ReadStats stats_;
  // Per home bucket of table_: how many slots the first READ of a READ-GET
  // copies (0: not seen yet, copy kFirstReadSlots). The home slot's reach as
  // last seen, at least 1 (the home slot itself): a READ of just the slots
  // that can hold the bucket's keys. Only a hint: a reach grown since then
  // shows in the copied home slot and takes a second READ (kMore), and the
  // hint follows it.
  std::vector<uint8_t> first_read_slots_;
};

}  // namespace rdmakit::kv
