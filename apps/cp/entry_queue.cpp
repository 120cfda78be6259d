#include "entry_queue.hpp"

namespace rdmakit::cp {

bool EntryQueue::push(Entry e) {
  std::lock_guard lock(mu_);
  if (cancelled_) return false;
  files_ += e.kind == Kind::kFile;
  bytes_ += e.size;
  pending_.push_back(std::move(e));
  // The consumer waits for a batch (take_batch): a wake-up per entry would
  // cost two futex calls per entry when it keeps up with the walk.
  if (pending_.size() == kBatch) cv_.notify_all();
  return true;
}

void EntryQueue::finish() {
  std::lock_guard lock(mu_);
  done_ = true;
  cv_.notify_all();
}

void EntryQueue::cancel() {
  std::lock_guard lock(mu_);
  cancelled_ = true;
}

bool EntryQueue::take(std::vector<Entry>* out, bool wait) {
  std::unique_lock lock(mu_);
  if (wait) cv_.wait(lock, [&] { return done_ || !pending_.empty(); });
  if (pending_.empty()) return !done_;
  if (out->empty()) {
    out->swap(pending_);
  } else {
    for (Entry& e : pending_) out->push_back(std::move(e));
    pending_.clear();
  }
  return true;
}

bool EntryQueue::take_batch(std::vector<Entry>* out, std::chrono::milliseconds max_wait) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, max_wait, [&] { return done_ || pending_.size() >= kBatch; });
  if (pending_.empty()) return !done_;
  for (Entry& e : pending_) out->push_back(std::move(e));
  pending_.clear();
  return true;
}

bool EntryQueue::finished() const {
  std::lock_guard lock(mu_);
  return done_ && pending_.empty();
}

bool EntryQueue::walk_done() const {
  std::lock_guard lock(mu_);
  return done_;
}

uint64_t EntryQueue::files() const {
  std::lock_guard lock(mu_);
  return files_;
}

uint64_t EntryQueue::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

}  // namespace rdmakit::cp
