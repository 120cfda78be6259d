#pragma once
// Entries handed from the walk to the sender as they are found, so that a
// large tree starts moving while it is still being listed (the walk of
// 10,000 files takes about as long as the session setup).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "tree.hpp"

namespace rdmakit::cp {

class EntryQueue {
 public:
  // Walker side. push() returns false once the consumer has cancelled.
  bool push(Entry e);
  void finish();
  // Consumer side. take() moves every entry available into *out; with
  // wait, it blocks until there is one or the walk is finished. Returns
  // false once the walk is finished and everything was taken.
  bool take(std::vector<Entry>* out, bool wait);
  // Waits until kBatch entries are pending, the walk is done or max_wait
  // passed, then moves what is pending into *out. False once the walk is
  // finished and everything was taken.
  bool take_batch(std::vector<Entry>* out, std::chrono::milliseconds max_wait);
  static constexpr size_t kBatch = 256;
  bool finished() const;   // walk done and everything taken
  bool walk_done() const;  // walk done (totals final)
  void cancel();
  // Totals of what was pushed (sizes as the walk saw them).
  uint64_t files() const;
  uint64_t bytes() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> pending_;
  bool done_ = false;
  bool cancelled_ = false;
  uint64_t files_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace rdmakit::cp
