// The client's hello, field by field: both ends run the same binary, but the
// server checks what it is told before sizing anything by it.
#include "perf_wire.hpp"

#include <cstring>

#include "perf_check.hpp"

namespace rdmakit::perf {

Hello encode_hello(const Settings& s, const RemoteRegion& region) {
  WireSettings w{};
  w.magic = kMagic;
  w.version = kWireVersion;
  w.test = static_cast<uint8_t>(s.test);
  w.atomic_op = static_cast<uint8_t>(s.atomic_op);
  w.bidirectional = s.bidirectional;
  w.event = s.event;
  w.busy_target = s.busy_target;
  w.num_qps = s.num_qps;
  w.tx_depth = s.tx_depth;
  w.rx_depth = s.rx_depth;
  w.inline_size = s.inline_size;
  w.post_list = s.post_list;
  w.cq_mod = s.cq_mod;
  w.max_size = s.max_size;
  w.warmup = s.warmup;
  Hello pd;
  std::memcpy(pd.data(), &w, sizeof w);
  region.serialize(std::span<std::byte, RemoteRegion::kSerializedSize>(
      pd.data() + sizeof w, RemoteRegion::kSerializedSize));
  return pd;
}

ClientHello decode_hello(std::span<const std::byte> pd) {
  WireSettings w{};
  if (pd.size() < sizeof w + RemoteRegion::kSerializedSize)
    fail("client hello too short");
  std::memcpy(&w, pd.data(), sizeof w);
  if (w.magic != kMagic || w.version != kWireVersion) {
    fail("client hello: not rdmakit-perf or a different version");
  }
  ClientHello hello;
  Settings& s = hello.settings;
  s.test = static_cast<Test>(w.test);
  s.atomic_op = static_cast<AtomicOp>(w.atomic_op);
  s.bidirectional = w.bidirectional != 0;
  s.event = w.event != 0;
  s.busy_target = w.busy_target != 0;
  s.num_qps = w.num_qps;
  s.tx_depth = w.tx_depth;
  s.rx_depth = w.rx_depth;
  s.inline_size = w.inline_size;
  s.post_list = w.post_list;
  s.cq_mod = w.cq_mod;
  s.max_size = w.max_size;
  s.warmup = w.warmup;
  if (s.num_qps == 0 || s.num_qps > 1024 || s.max_size > (uint64_t{1} << 32)) {
    fail("client hello: settings out of range");
  }
  auto region = RemoteRegion::deserialize(pd.subspan(sizeof w));
  if (!region) fail("client hello: bad region descriptor");
  hello.region = *region;
  return hello;
}

}  // namespace rdmakit::perf
