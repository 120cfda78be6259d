#include "entry_queue.hpp"

namespace rdmakit::cp {

bool EntryQueue::push(Entry e) {
  std::lock_guard lock(mu_);
  if (cancelled_) return false;
  files_ += e.kind == Kind::kFile;
  bytes_ += e.size;
  const bool was_empty = pending_.empty();
  pending_.push_back(std::move(e));
  if (was_empty) cv_.notify_all();
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
