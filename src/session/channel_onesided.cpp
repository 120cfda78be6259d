// One-sided operations on the peer's named buffers: WRITE, READ and
// WRITE_WITH_IMM, by name or on a RemoteBuffer resolved once.
#include <rdmakit/session/channel.hpp>
#include <rdmakit/session/endpoint.hpp>

#include "channel_core.hpp"
#include "engine.hpp"
#include "fmt/format.h"
#include "wire.hpp"

namespace rdmakit::session {

using detail::ChannelCore;
using detail::core;

RemoteBuffer Channel::remote(std::string_view name) const noexcept {
  for (const auto& entry : core(*this).endpoint_->remote_buffers()) {
    if (entry.first == name) return RemoteBuffer(entry);
  }
  return {};
}

OpResult Channel::resolve(std::string_view name, RemoteBuffer* out) const {
  *out = remote(name);
  if (*out) return {};
  std::string names;
  for (const auto& [n, r] : core(*this).endpoint_->remote_buffers()) {
    names += names.empty() ? "" : ", ";
    names += fmt::format("'{}'", n);
  }
  return core(*this).fail(
      Errc::kNoSuchBuffer, "resolve",
      fmt::format("the peer exposes no buffer named '{}' (it exposes: {})", name,
                  names.empty() ? "none" : names));
}

OpResult Channel::write(std::string_view remote, uint64_t offset, Local src,
                        size_t length, OpCallback done) {
  return core(*this).one_sided(Opcode::kWrite, remote, offset, src, length, 0,
                               std::move(done));
}
OpResult Channel::read(std::string_view remote, uint64_t offset, Local dst, size_t length,
                       OpCallback done) {
  return core(*this).one_sided(Opcode::kRead, remote, offset, dst, length, 0,
                               std::move(done));
}
OpResult Channel::write_with_imm(std::string_view remote, uint64_t offset, Local src,
                                 size_t length, uint32_t imm, OpCallback done) {
  return core(*this).one_sided(Opcode::kWriteWithImm, remote, offset, src, length, imm,
                               std::move(done));
}
OpResult Channel::write(const RemoteBuffer& remote, uint64_t offset, Local src,
                        size_t length, OpCallback done) {
  return core(*this).one_sided(Opcode::kWrite, remote, offset, src, length, 0,
                               std::move(done));
}
OpResult Channel::read(const RemoteBuffer& remote, uint64_t offset, Local dst,
                       size_t length, OpCallback done) {
  return core(*this).one_sided(Opcode::kRead, remote, offset, dst, length, 0,
                               std::move(done));
}
OpResult Channel::write_with_imm(const RemoteBuffer& remote, uint64_t offset, Local src,
                                 size_t length, uint32_t imm, OpCallback done) {
  return core(*this).one_sided(Opcode::kWriteWithImm, remote, offset, src, length, imm,
                               std::move(done));
}

// Both forms of each operation end here: the range checks, a credit for
// WRITE_WITH_IMM, selective signaling when nobody waits for the completion.
OpResult ChannelCore::one_sided(Opcode opcode, std::string_view remote, uint64_t offset,
                                Local local, size_t length, uint32_t imm,
                                OpCallback done) {
  RemoteBuffer handle;
  if (OpResult r = resolve(remote, &handle); !r.ok()) {
    r.detail.replace(0, std::string_view("resolve").size(), opcode_name(opcode));
    return r;
  }
  return one_sided(opcode, handle, offset, local, length, imm, std::move(done));
}

OpResult ChannelCore::one_sided(Opcode opcode, const RemoteBuffer& remote,
                                uint64_t offset, Local local, size_t length, uint32_t imm,
                                OpCallback done) {
  const char* what = opcode_name(opcode);
  if (!remote) {
    return fail(Errc::kNoSuchBuffer, what,
                "the remote buffer handle is empty (unresolved)");
  }
  const RemoteRegion* region = &remote.region();
  if (offset > region->length || length > region->length - offset) {
    return fail(Errc::kOutOfRange, what,
                fmt::format("[{}, +{}) is outside the peer's buffer '{}' of {} bytes",
                            offset, length, remote.name(), region->length));
  }
  if (local.addr == nullptr || length > local.length || length > UINT32_MAX) {
    return fail(Errc::kOutOfRange, what,
                std::to_string(length) + " bytes do not fit the local buffer of " +
                    std::to_string(local.length) + " bytes");
  }
  std::unique_lock lock(mu_);
  if (closed_) return closed_result(what);
  if (opcode == Opcode::kWriteWithImm) {
    if (OpResult r = wait_credit(lock); !r.ok()) return r;
  }
  // Without a callback nobody waits for the completion: selectively signaled.
  const bool quiet = !done;
  SendWr wr{.opcode = opcode,
            .flags = static_cast<uint8_t>(!quiet || signal_due() ? kSignaled : 0),
            .length = static_cast<uint32_t>(length),
            .local_addr = local.addr,
            .lkey = local.lkey,
            .imm = imm,
            .remote_addr = region->addr_at(offset),
            .rkey = region->rkey};
  OpResult r = post_retrying(lock, wr,
                             static_cast<uint8_t>(quiet ? WrKind::kOpQuiet : WrKind::kOp),
                             done, nullptr);
  if (r.ok() && opcode == Opcode::kWriteWithImm) count_sent();
  return r;
}

}  // namespace rdmakit::session
