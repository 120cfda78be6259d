// rdmakit-stream-bench: streams measured the way rdmakit-perf measures the
// core, two pinned processes on one host (fork), one JSON object per line.
//   lat   ping-pong of --size bytes (blocking read/write with busy-poll):
//         half round trip: median of batches of 100 exchanges (half_rtt_us)
//         and median of per-exchange rdtsc stamps as rdmakit-perf's
//         t_typical (t_typical_us)
//   bw    one direction, --size byte writes for --seconds: MB/s (10^6) at
//         the reader, every byte checked against a pattern on the first pass
//   idle  --streams idle streams: resident KiB and fds per stream (client)
//   floor the least any cross-core byte stream costs: two pinned threads, a
//         bare SPSC byte ring of --rx-ring bytes (default 2 MiB) with one
//         atomic index per side, --size byte copies in and out, consumed
//         bytes returned per half ring as the stream does (MB/s)
//   rdmakit-stream-bench lat|bw|idle [--provider shm|tcp|verbs] [--size N]
//       [--seconds S] [--cpus A,B] [--streams N] [--rx-ring N] [--tx-buffer N]
//       [--inline N] [--busy-poll-us N] [--bind ADDR]
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rdmakit/stream/stream.hpp"
#include "tsc_stamp.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using rdmakit::bench::Stamp;
using rdmakit::stream::Engine;
using rdmakit::stream::EngineOptions;
using rdmakit::stream::Stream;
using rdmakit::stream::StreamOptions;

struct Args {
  std::string test;
  std::string provider = "shm";
  size_t size = 16;
  double seconds = 2.0;
  std::vector<int> cpus{0, 1};
  int streams = 1000;
  uint32_t rx_ring = 0;  // 0: per-test default
  uint32_t tx_buffer = 0;
  uint32_t max_inline = 0;
  int64_t busy_poll_us = -1;  // -1: per-test default
  std::string bind = "127.0.0.1";
  bool poll_readiness = false;  // lat: readers spin on Stream::poll_readiness()
  bool poll_fd = false;         // lat: readers spin in poll(fd(), timeout 0)
  size_t credit_every = 0;      // floor: bytes read per index publication (0: half ring)
};

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)sched_setaffinity(0, sizeof set, &set);
}

StreamOptions options_for(const Args& a) {
  StreamOptions so;
  if (a.test == "lat") {
    so.busy_poll = 1s;
  } else if (a.test == "bw") {
    so.busy_poll = 1s;
    so.rx_ring = 2u << 20;
    so.tx_buffer = 4u << 20;
    so.recv_credits = 128;
    // shm: writes of up to 64 KiB go straight from the caller's buffer.
    so.max_inline =
        a.provider == "shm" ? static_cast<uint32_t>(std::min<size_t>(a.size, 65536)) : 64;
  }
  if (a.rx_ring != 0) so.rx_ring = a.rx_ring;
  if (a.tx_buffer != 0) so.tx_buffer = a.tx_buffer;
  if (a.max_inline != 0) so.max_inline = a.max_inline;
  if (a.busy_poll_us >= 0) so.busy_poll = std::chrono::microseconds(a.busy_poll_us);
  return so;
}

std::shared_ptr<Engine> make_engine(const Args& a, const StreamOptions& so) {
  EngineOptions eo;
  eo.provider = rdmakit::parse_provider(a.provider);
  eo.stream = so;
  eo.max_streams = static_cast<uint32_t>(std::max(a.streams, 1) + 8);
  return Engine::create(eo);
}

bool read_full(Stream& s, void* p, size_t n) {
  return s.read(p, n, Stream::kWaitAll) == static_cast<ssize_t>(n);
}
// As an event loop spinning in poll/epoll_wait would: poll_readiness() until
// readable, then non-blocking reads (gives up after 5 s of nothing).
// With poll_fd: the same through the readiness fd (what an event loop
// without poll_readiness() sees: the progress thread's updates).
bool read_full_polling(Stream& s, void* p, size_t n, bool poll_fd) {
  size_t got = 0;
  auto give_up = Clock::now() + 5s;
  for (uint32_t spins = 1; got < n; ++spins) {
    short ev = 0;
    if (poll_fd) {
      pollfd pfd{s.fd(), POLLIN, 0};
      if (::poll(&pfd, 1, 0) == 1) ev = pfd.revents;
    } else {
      ev = s.poll_readiness();
    }
    if ((ev & (POLLIN | POLLERR | POLLHUP)) != 0) {
      const ssize_t rc = s.read(static_cast<char*>(p) + got, n - got, Stream::kDontWait);
      if (rc == 0 || (rc < 0 && rc != -EAGAIN)) return false;
      if (rc > 0) {
        got += static_cast<size_t>(rc);
        give_up = Clock::now() + 5s;
      }
    }
    if (spins % 64 == 0) {
      if (Clock::now() > give_up) return false;
      ::sched_yield();  // as the stream's own busy-poll
    }
  }
  return true;
}
bool read_msg(const Args& a, Stream& s, void* p, size_t n) {
  if (a.poll_readiness || a.poll_fd) return read_full_polling(s, p, n, a.poll_fd);
  return read_full(s, p, n);
}
bool write_full(Stream& s, const void* p, size_t n) {
  return s.write(p, n) == static_cast<ssize_t>(n);
}

uint8_t pattern(size_t i) { return static_cast<uint8_t>((i * 131u + (i >> 12)) & 0xFF); }

size_t open_fds() {
  size_t n = 0;
  for (int fd = 0; fd < 65536; ++fd)
    if (::fcntl(fd, F_GETFD) >= 0) ++n;
  return n;
}
size_t rss_bytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<size_t>(resident) * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

// Resident KiB by mapping name (memfds by their names, "anon" for heap and
// anonymous memory), from /proc/self/smaps: where an idle stream's memory is.
std::map<std::string, double> rss_by_mapping() {
  std::map<std::string, double> out;
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return out;
  char line[512];
  std::string name = "anon";
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long kb = 0;
    if (std::sscanf(line, "Rss: %lu kB", &kb) == 1) {
      out[name] += static_cast<double>(kb);
    } else if (const char* sp = std::strchr(line, ' ');
               sp != nullptr && sp > line && sp[-1] != ':') {
      // A mapping header: "start-end perms offset dev inode [path]".
      const char* path = std::strchr(line, '/');
      if (path == nullptr) path = std::strchr(line, '[');
      name = path == nullptr ? "anon" : std::string(path, std::strcspn(path, " \n"));
      if (name == "[heap]") name = "anon";
      if (name.rfind("/memfd:", 0) == 0) name = name.substr(7);
    }
  }
  std::fclose(f);
  return out;
}

// ------------------------------------------------------------------ roles

int server(const Args& a, int port_fd) {
  pin(a.cpus[1]);
  const StreamOptions so = options_for(a);
  auto engine = make_engine(a, so);
  auto listener = engine->listen(a.bind + ":0");
  const uint16_t port = listener->port();
  if (::write(port_fd, &port, sizeof port) != sizeof port) return 1;
  const int n = a.test == "idle" ? a.streams : 1;
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < n; ++i) streams.push_back(listener->accept(30s));
  Stream& s = *streams[0];
  std::vector<uint8_t> buf(std::max<size_t>(a.size, 64));
  if (a.test == "lat") {
    for (;;) {
      if (!read_msg(a, s, buf.data(), a.size)) return 0;  // client done: EOF
      if (!write_full(s, buf.data(), a.size)) return 1;
    }
  }
  if (a.test == "bw") {
    size_t total = 0;
    bool checked = true;
    uint64_t expect_total = 0;
    for (;;) {
      const ssize_t rc = s.read(buf.data(), buf.size());
      if (rc <= 0) break;
      for (ssize_t i = 0; i < rc && total + static_cast<size_t>(i) < a.size; ++i)
        checked = checked &&
                  buf[static_cast<size_t>(i)] == pattern(total + static_cast<size_t>(i));
      total += static_cast<size_t>(rc);
    }
    expect_total = total;
    // Report the count back so the client can print the reader's figure.
    (void)write_full(s, &expect_total, sizeof expect_total);
    (void)write_full(s, &checked, sizeof checked);
    s.shutdown(SHUT_WR);
    return 0;
  }
  // idle: wait for the client to finish measuring.
  char c;
  (void)s.read(&c, 1);
  return 0;
}

int client(const Args& a, uint16_t port) {
  pin(a.cpus[0]);
  const StreamOptions so = options_for(a);
  auto engine = make_engine(a, so);
  const std::string address = a.bind + ":" + std::to_string(port);
  const char* prov = a.provider.c_str();
  if (a.test == "idle") {
    const size_t fds0 = open_fds();
    const size_t rss0 = rss_bytes();
    const auto map0 = rss_by_mapping();
    std::vector<std::unique_ptr<Stream>> streams;
    for (int i = 0; i < a.streams; ++i) streams.push_back(engine->connect(address, so));
    std::this_thread::sleep_for(200ms);
    const size_t fds1 = open_fds();
    const size_t rss1 = rss_bytes();
    std::string by;
    for (const auto& [name, kb] : rss_by_mapping()) {
      const double before = map0.count(name) != 0 ? map0.at(name) : 0.0;
      const double per = (kb - before) / a.streams;
      if (per < 0.05) continue;
      char item[160];
      std::snprintf(item, sizeof item, "%s\"%s\":%.1f", by.empty() ? "" : ",",
                    name.c_str(), per);
      by += item;
    }
    std::printf(
        "{\"test\":\"stream_idle\",\"provider\":\"%s\",\"streams\":%d,\"rx_ring\":%u,"
        "\"tx_buffer\":%u,\"configured_KiB_per_stream\":%.1f,\"resident_KiB_per_stream\":"
        "%.1f,"
        "\"fds_per_stream\":%.2f,\"resident_KiB_per_stream_by_mapping\":{%s}}\n",
        prov, a.streams, so.rx_ring, so.tx_buffer,
        static_cast<double>(streams[0]->memory_bytes()) / 1024.0,
        static_cast<double>(rss1 - rss0) / a.streams / 1024.0,
        static_cast<double>(fds1 - fds0) / a.streams, by.c_str());
    (void)streams[0]->write("x", 1);
    return 0;
  }
  auto s = engine->connect(address, so);
  std::vector<uint8_t> buf(a.size);
  if (a.test == "lat") {
    const auto end = Clock::now() + std::chrono::duration<double>(a.seconds);
    // Two statistics of the same exchanges: the median of per-exchange half
    // round trips, stamped as rdmakit-perf stamps send_lat (one rdtsc per
    // iteration, t_typical: the like-for-like comparison with the core), and
    // the median of batch means over 100 exchanges (steady_clock; a batch
    // mean also carries the batch's slow exchanges).
    const Stamp stamp;
    std::vector<double> batches;
    std::vector<double> exchanges;
    exchanges.reserve(1 << 22);
    for (int w = 0; w < 1000; ++w) {  // warm-up
      if (!write_full(*s, buf.data(), a.size) || !read_msg(a, *s, buf.data(), a.size))
        return 1;
    }
    while (Clock::now() < end) {
      const auto t0 = Clock::now();
      uint64_t prev = stamp.now();
      for (int i = 0; i < 100; ++i) {
        if (!write_full(*s, buf.data(), a.size) || !read_msg(a, *s, buf.data(), a.size))
          return 1;
        const uint64_t t = stamp.now();
        if (exchanges.size() < exchanges.capacity())
          exchanges.push_back(stamp.us(t - prev) / 2);
        prev = t;
      }
      batches.push_back(
          std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / 200.0);
    }
    std::sort(batches.begin(), batches.end());
    std::sort(exchanges.begin(), exchanges.end());
    const auto pct = [&exchanges](double p) {
      return exchanges[std::min(
          exchanges.size() - 1,
          static_cast<size_t>(p * static_cast<double>(exchanges.size())))];
    };
    std::printf(
        "{\"test\":\"stream_lat\",\"provider\":\"%s\",\"size\":%zu,\"read\":\"%s\","
        "\"exchanges\":%zu,\"half_rtt_us\":%.3f,\"best_half_rtt_us\":%.3f,"
        "\"t_typical_us\":%.4f,\"t_p99_us\":%.4f}\n",
        prov, a.size,
        a.poll_fd          ? "poll_fd"
        : a.poll_readiness ? "poll_readiness"
                           : "blocking",
        batches.size() * 100, batches[batches.size() / 2] / 1000.0,
        batches.front() / 1000.0, pct(0.5), pct(0.99));
    return 0;
  }
  // bw
  for (size_t i = 0; i < a.size; ++i) buf[i] = pattern(i);
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(a.seconds);
  uint64_t sent = 0;
  while (Clock::now() < end) {
    if (!write_full(*s, buf.data(), a.size)) return 1;
    sent += a.size;
    if (sent == a.size) {
      for (size_t i = 0; i < a.size; ++i) buf[i] = 0;  // later writes: only counted
    }
  }
  s->shutdown(SHUT_WR);
  uint64_t received = 0;
  bool checked = false;
  if (!read_full(*s, &received, sizeof received) ||
      !read_full(*s, &checked, sizeof checked))
    return 1;
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "{\"test\":\"stream_bw\",\"provider\":\"%s\",\"size\":%zu,\"bytes\":%llu,"
      "\"seconds\":%.3f,\"bw_MBps\":%.1f,\"verified\":%s}\n",
      prov, a.size, static_cast<unsigned long long>(received), secs,
      static_cast<double>(received) / secs / 1e6,
      checked && received == sent ? "true" : "false");
  return checked && received == sent ? 0 : 1;
}

// Two copies through a shared ring, nothing else: no protocol, no locks, no
// completions. A stream cannot beat it; memcpy of a hot buffer (one core,
// one copy) is not a floor a stream can reach. Same shape as the shm stream
// of `bw`: the ring is a shared, populated mapping of the stream's ring size,
// the writer copies --size bytes per write (split at the ring's end, as a
// DATA write is), the reader copies out up to --size bytes per read (the bw
// reader's buffer), consumed bytes are returned per half ring (the stream's
// CREDIT). Each index sits alone on its cache line, and each side re-reads
// the other's only when its cached copy says it must wait.
// How a waiting side of the floor spins: as the stream's busy-poll (a pause
// per poll, sched_yield once a wait has lasted 5 us, then every 5 us).
// Yielding every few polls, as an earlier floor did, gives the core away to
// any other runnable thread many times per copy.
class SpinWait {
 public:
  void operator()() noexcept {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    if (++spins_ % 64 != 0) return;
    const auto now = Clock::now();
    if (spins_ == 64) {
      since_ = now;
    } else if (now - since_ >= std::chrono::microseconds(5)) {
      // At most one yield per 5 us, about the stream's rate (its polls are
      // slower than these): on a busy core each yield may hand the core to
      // another thread for a whole time slice.
      ::sched_yield();
      since_ = Clock::now();
    }
  }
  void reset() noexcept { spins_ = 0; }

 private:
  uint32_t spins_ = 0;
  Clock::time_point since_{};
};

struct alignas(64) SpscIndex {
  std::atomic<uint64_t> value{0};
};
static_assert(sizeof(SpscIndex) == 64, "one index per cache line");

int spsc_floor(const Args& a) {
  const size_t ring = a.rx_ring != 0 ? a.rx_ring : (2u << 20);
  const size_t chunk = std::min(a.size, ring);
  const size_t credit_every = a.credit_every != 0 ? a.credit_every : ring / 2;
  void* map = ::mmap(nullptr, ring, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (map == MAP_FAILED) {
    std::perror("rdmakit-stream-bench floor: mmap");
    return 1;
  }
  auto* mem = static_cast<uint8_t*>(map);
  auto head = std::make_unique<SpscIndex>();  // bytes written
  auto tail = std::make_unique<SpscIndex>();  // bytes read
  auto stop = std::make_unique<SpscIndex>();  // the writer's total, + 1, at the end
  uint64_t total = 0;
  std::thread reader([&] {
    pin(a.cpus[1]);
    std::vector<uint8_t> out(chunk, 0);
    uint64_t t = 0;
    uint64_t h = 0;  // cached head
    uint64_t published = 0;
    SpinWait spin;
    for (;;) {
      if (h == t) {
        h = head->value.load(std::memory_order_acquire);
        if (h == t) {
          const uint64_t end = stop->value.load(std::memory_order_acquire);
          if (end != 0 && end - 1 == t) break;
          spin();
          continue;
        }
        spin.reset();
      }
      const size_t at = t % ring;
      const size_t n = std::min<uint64_t>(std::min<uint64_t>(h - t, ring - at), chunk);
      std::memcpy(out.data(), mem + at, n);
      t += n;
      // Consumed bytes go back once half the ring is read, as the stream's
      // CREDIT does: the writer then fills lines the reader left long ago
      // instead of taking each line from the reader's cache right after it.
      if (t - published >= credit_every) {
        tail->value.store(t, std::memory_order_release);
        published = t;
      }
    }
    total = t;
  });
  pin(a.cpus[0]);
  std::vector<uint8_t> in(chunk, 0x5a);
  uint64_t h = 0;
  uint64_t t = 0;  // cached tail
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(a.seconds);
  for (uint32_t i = 0;; ++i) {
    if (i % 16 == 0 && Clock::now() >= end) break;
    SpinWait spin;
    while (h + chunk - t > ring) {
      t = tail->value.load(std::memory_order_acquire);
      if (h + chunk - t > ring) spin();
    }
    size_t done = 0;
    while (done < chunk) {
      const size_t at = (h + done) % ring;
      const size_t n = std::min(chunk - done, ring - at);
      std::memcpy(mem + at, &in[done], n);
      done += n;
    }
    h += chunk;
    head->value.store(h, std::memory_order_release);
  }
  stop->value.store(h + 1, std::memory_order_release);
  reader.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ::munmap(map, ring);
  std::printf(
      "{\"test\":\"spsc_floor\",\"size\":%zu,\"ring\":%zu,\"bytes\":%llu,"
      "\"seconds\":%.3f,\"bw_MBps\":%.1f}\n",
      chunk, ring, static_cast<unsigned long long>(total), secs,
      static_cast<double>(total) / secs / 1e6);
  return total == h ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  Args a;
  CLI::App app{"rdmakit-stream-bench: stream latency, bandwidth and idle cost"};
  app.add_option("test", a.test, "lat, bw, idle or floor")
      ->required()
      ->check(CLI::IsMember({"lat", "bw", "idle", "floor"}));
  app.add_option("--provider", a.provider, "shm, tcp or verbs");
  app.add_option("-s,--size", a.size, "Message (lat) or write (bw) size");
  app.add_option("-D,--seconds", a.seconds, "Duration");
  app.add_option("--cpus", a.cpus, "Client and server CPU")->delimiter(',')->expected(2);
  app.add_option("--streams", a.streams, "idle: number of streams");
  app.add_option("--rx-ring", a.rx_ring, "Receive ring bytes");
  app.add_option("--tx-buffer", a.tx_buffer, "Send buffer bytes");
  app.add_option("--inline", a.max_inline, "max_inline");
  app.add_option(
      "--credit-every", a.credit_every,
      "floor: bytes read between publications of the read index (default: half "
      "the ring, as the stream's CREDIT)");
  app.add_option("--busy-poll-us", a.busy_poll_us,
                 "StreamOptions::busy_poll in us (default: 1 s for lat and bw)");
  app.add_option("--bind", a.bind, "Address (verbs: the RDMA interface's)");
  app.add_flag("--poll-readiness", a.poll_readiness,
               "lat: readers spin on Stream::poll_readiness(), then read non-blocking");
  app.add_flag("--poll-fd", a.poll_fd,
               "lat: readers spin in poll() on Stream::fd(), then read non-blocking");
  CLI11_PARSE(app, argc, argv);
  if (a.size == 0) a.size = 1;
  if (a.test == "floor") return spsc_floor(a);
  if (a.test == "idle") {
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  int fds[2];
  if (::pipe(fds) != 0) return 1;
  const pid_t child = ::fork();
  if (child == 0) {
    int rc = 1;
    try {
      rc = server(a, fds[1]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rdmakit-stream-bench server: %s\n", e.what());
    }
    std::fflush(nullptr);
    _exit(rc);
  }
  // Only the server writes the port: a server that fails first is then an
  // end of file here, not a wait forever.
  ::close(fds[1]);
  uint16_t port = 0;
  if (::read(fds[0], &port, sizeof port) != sizeof port) {
    ::waitpid(child, nullptr, 0);
    return 1;
  }
  int rc = client(a, port);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  return rc;
} catch (const std::exception& e) {
  std::fprintf(stderr, "rdmakit-stream-bench: %s\n", e.what());
  return 1;
}
