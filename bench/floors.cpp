// rdmakit-floors: what the hardware allows, measured in the same run as the
// benchmarks so ratios compare like with like.
//   cache-line ping-pong between two pinned cores (half round trip = the
//     time one cache line takes to move from one core to the other);
//   two-line ping-pong: one line per direction, each written by one side
//     and polled by the other, the least any message queue pair moves (a
//     SEND completes into a line of the receiver's ring, the reply into one
//     of the sender's), reported next to the one-line floor;
//   single-thread memcpy bandwidth per size (hot buffers, MB = 10^6 bytes;
//     median of 5 runs of 40 ms, and the best run);
//   with --tcp N, a TCP ping-pong of N bytes over loopback (one send() and
//     one recv() per message, busy-polled: what any transport over kernel
//     TCP pays at least);
//   with --handoff N, a two-core handoff of N-byte chunks through shared
//     slots between two processes (writer memcpy in, reader memcpy out, one
//     flag per chunk): what any two-copy byte stream between two cores pays
//     at least, for each slot count of --handoff-slots (default 2,4,32);
//     --handoff-nt adds the same with the writer's non-temporal stores.
//   rdmakit-floors [--json] [--cpus A,B] [--sizes 8,64,...] [--rounds N]
//                  [--tcp BYTES] [--handoff BYTES] [--handoff-slots 2,4,...]
//                  [--handoff-nt]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fmt/format.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);  // best effort: one core still measures
}

// Times a ping-pong between two pinned threads: exchange i (1-based) is
// ask(i) on cpu_a, which returns once answer(i) on cpu_b has replied. Timed
// in batches of 100 round trips; the median batch gives nanoseconds per
// one-way hop, so a descheduled thread on a shared machine spoils a few
// batches, not the figure. *best gets the fastest batch.
template <typename Ask, typename Answer>
double time_pingpong(int cpu_a, int cpu_b, uint64_t batches, double* best, Ask ask,
                     Answer answer) {
  constexpr uint64_t kBatch = 100;
  std::atomic<bool> go{false};
  std::atomic<bool> b_pinned{false};
  const uint64_t rounds = batches * kBatch;
  std::thread b([&] {
    pin(cpu_b);
    b_pinned.store(true, std::memory_order_release);
    while (!go.load(std::memory_order_acquire)) {
    }
    for (uint64_t i = 1; i <= rounds; ++i) answer(i);
  });
  // B must be on its core before A spins on its own: under SCHED_FIFO (chrt)
  // a spinning A would otherwise keep B from ever running if both started on
  // A's core.
  while (!b_pinned.load(std::memory_order_acquire)) std::this_thread::yield();
  pin(cpu_a);
  std::vector<double> per_hop(batches);
  go.store(true, std::memory_order_release);
  for (uint64_t k = 0; k < batches; ++k) {
    const auto t0 = Clock::now();
    for (uint64_t j = 1; j <= kBatch; ++j) ask(k * kBatch + j);
    const auto t1 = Clock::now();
    per_hop[k] = std::chrono::duration<double, std::nano>(t1 - t0).count() / (2 * kBatch);
  }
  b.join();
  std::sort(per_hop.begin(), per_hop.end());
  *best = per_hop.front();
  return per_hop[per_hop.size() / 2];
}

// One 64-byte line bounced between the threads: A stores odd values, B even
// ones, each waiting for the other's.
double pingpong_half_rtt_ns(int cpu_a, int cpu_b, uint64_t batches, double* best) {
  alignas(128) static std::atomic<uint64_t> line{0};
  line.store(0);
  return time_pingpong(
      cpu_a, cpu_b, batches, best,
      [](uint64_t i) {
        line.store(2 * i - 1, std::memory_order_release);
        while (line.load(std::memory_order_acquire) != 2 * i) {
        }
      },
      [](uint64_t i) {
        while (line.load(std::memory_order_acquire) != 2 * i - 1) {
        }
        line.store(2 * i, std::memory_order_release);
      });
}

// The same with one line per direction: A writes a payload word and a
// sequence number into line_b and polls line_a; B the reverse.
double two_line_half_rtt_ns(int cpu_a, int cpu_b, uint64_t batches, double* best) {
  struct alignas(64) Line {
    std::atomic<uint64_t> seq{0};
    uint64_t payload = 0;
  };
  alignas(128) static Line line_a, line_b;
  line_a.seq.store(0);
  line_b.seq.store(0);
  return time_pingpong(
      cpu_a, cpu_b, batches, best,
      [](uint64_t i) {
        line_b.payload = i;
        line_b.seq.store(i, std::memory_order_release);
        while (line_a.seq.load(std::memory_order_acquire) != i) {
        }
      },
      [](uint64_t i) {
        while (line_b.seq.load(std::memory_order_acquire) != i) {
        }
        line_a.payload = line_b.payload;
        line_a.seq.store(i, std::memory_order_release);
      });
}

// Two connected loopback TCP sockets, TCP_NODELAY and non-blocking.
int tcp_pair(int* a, int* b) {
  const int lst = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (lst < 0 || ::bind(lst, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      ::listen(lst, 1) != 0 ||
      ::getsockname(lst, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    if (lst >= 0) ::close(lst);
    return -1;
  }
  *a = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool ok =
      *a >= 0 && ::connect(*a, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  *b = ok ? ::accept4(lst, nullptr, nullptr, SOCK_CLOEXEC) : -1;
  ::close(lst);
  if (*b < 0) {
    if (*a >= 0) ::close(*a);
    return -1;
  }
  const int one = 1;
  for (int fd : {*a, *b}) {
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  return 0;
}

// A bare TCP ping-pong over loopback, each side busy-polling recv(): one
// send() and one successful recv() per message is what any transport over
// kernel TCP pays at least. The median half round trip in ns, or a negative
// value if the sockets could not be set up.
double tcp_half_rtt_ns(int cpu_a, int cpu_b, size_t size, uint64_t batches,
                       double* best) {
  int a = -1, b = -1;
  if (tcp_pair(&a, &b) != 0) return -1;
  std::vector<char> buf_a(size, 1), buf_b(size, 2);
  auto send_all = [size](int fd, const char* p) {
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::send(fd, p + done, size - done, MSG_NOSIGNAL);
      if (n > 0)
        done += static_cast<size_t>(n);
      else if (n < 0 && errno != EAGAIN && errno != EINTR)
        std::abort();
    }
  };
  auto recv_all = [size](int fd, char* p) {
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::recv(fd, p + done, size - done, 0);
      if (n > 0)
        done += static_cast<size_t>(n);
      else if (n == 0 || (errno != EAGAIN && errno != EINTR))
        std::abort();
    }
  };
  // The answering side is a forked process, as the peers compared with it
  // run: in one multi-threaded process every socket call pays for the
  // shared descriptor table (measured about 1 us slower per half round trip).
  constexpr uint64_t kBatch = 100;
  const uint64_t rounds = batches * kBatch + 1;
  const pid_t child = ::fork();
  if (child < 0) return -1;
  if (child == 0) {
    ::close(a);
    pin(cpu_b);
    for (uint64_t i = 0; i < rounds; ++i) {
      recv_all(b, buf_b.data());
      send_all(b, buf_b.data());
    }
    std::_Exit(0);
  }
  ::close(b);
  pin(cpu_a);
  send_all(a, buf_a.data());  // the child is up and answering
  recv_all(a, buf_a.data());
  std::vector<double> per_hop(batches);
  for (uint64_t k = 0; k < batches; ++k) {
    const auto t0 = Clock::now();
    for (uint64_t j = 0; j < kBatch; ++j) {
      send_all(a, buf_a.data());
      recv_all(a, buf_a.data());
    }
    per_hop[k] = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() /
                 (2 * kBatch);
  }
  ::close(a);
  int status = 0;
  ::waitpid(child, &status, 0);
  std::sort(per_hop.begin(), per_hop.end());
  *best = per_hop.front();
  return per_hop[per_hop.size() / 2];
}

// memcpy of `size` bytes repeated in `reps` runs of `each`. Returns the
// median run in MB/s, wall-clock like the benchmarks it is compared with (a
// preempted run counts as slow there too), and the best run in *best.
double memcpy_MBps(size_t size, int reps, std::chrono::milliseconds each, double* best) {
  auto src = std::unique_ptr<char[]>(new (std::align_val_t(4096)) char[size + 64]);
  auto dst = std::unique_ptr<char[]>(new (std::align_val_t(4096)) char[size + 64]);
  std::memset(src.get(), 1, size);
  std::memset(dst.get(), 2, size);
  std::vector<double> runs;
  for (int r = 0; r < reps; ++r) {
    uint64_t n = 0;
    const auto t0 = Clock::now();
    auto t1 = t0;
    do {
      for (int k = 0; k < 16; ++k) {
        std::memcpy(dst.get(), src.get(), size);
        // Keep the copy: the compiler may not drop it.
        asm volatile("" : : "r"(dst.get()) : "memory");
      }
      n += 16;
      t1 = Clock::now();
    } while (t1 - t0 < each);
    const double s = std::chrono::duration<double>(t1 - t0).count();
    runs.push_back(static_cast<double>(n) * size / s / 1e6);
  }
  std::sort(runs.begin(), runs.end());
  *best = runs.back();
  return runs[runs.size() / 2];
}

// Copies n bytes (n a multiple of 64, both 16-byte aligned) with non-temporal
// stores: the lines go towards memory instead of staying dirty in the
// writer's cache, where the reader would have to fetch them from.
void copy_nontemporal(char* dst, const char* src, size_t n) noexcept {
#if defined(__x86_64__)
  for (size_t i = 0; i < n; i += 64) {
    const auto* s = reinterpret_cast<const __m128i*>(src + i);
    auto* d = reinterpret_cast<__m128i*>(dst + i);
    _mm_stream_si128(d, _mm_load_si128(s));
    _mm_stream_si128(d + 1, _mm_load_si128(s + 1));
    _mm_stream_si128(d + 2, _mm_load_si128(s + 2));
    _mm_stream_si128(d + 3, _mm_load_si128(s + 3));
  }
  _mm_sfence();  // the stores are visible before the flag that publishes them
#else
  std::memcpy(dst, src, n);
#endif
}

// Two pinned processes hand `size`-byte chunks through `slots` shared slots:
// the writer waits for a free slot, memcpy's a chunk in and raises the
// slot's flag (a release store); the reader waits for the flag, memcpy's the
// chunk out into its own hot buffer and clears the flag. Nothing else: no
// indices shared beyond the flags, no protocol, no locks. The slots are
// populated and page-aligned, each flag alone on its cache line. Returns the
// median of `reps` runs of `each` in MB/s (bytes the reader copied out over
// wall-clock time) and the best run in *best.
double handoff_MBps(int cpu_a, int cpu_b, size_t size, size_t slots, bool nontemporal,
                    int reps, std::chrono::milliseconds each, double* best) {
  struct alignas(64) Flag {
    std::atomic<uint32_t> full{0};
  };
  struct alignas(64) Shared {
    std::atomic<uint32_t> ready{0};
    std::atomic<uint32_t> stop{0};
    std::atomic<uint64_t> copied{0};
  };
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared between processes");
  // The reader is a forked process, as the stream's reader is: like for like
  // (two threads of one process measured 2-5x below the stream's processes
  // in one loaded run, though not in others).
  const size_t meta = sizeof(Shared) + slots * sizeof(Flag);
  const size_t meta_bytes = (meta + 4095) / 4096 * 4096;
  const size_t bytes = meta_bytes + size * slots;
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (map == MAP_FAILED) return -1;
  auto* shared = new (map) Shared();
  auto* flags = new (static_cast<char*>(map) + sizeof(Shared)) Flag[slots];
  char* mem = static_cast<char*>(map) + meta_bytes;
  auto spin = [](uint32_t& spins) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    // Both ends on one core (or a busy one) must still progress.
    if (++spins % 4096 == 0) ::sched_yield();
  };
  std::vector<double> runs;
  for (int r = 0; r < reps; ++r) {
    shared->ready.store(0);
    shared->stop.store(0);
    shared->copied.store(0);
    for (size_t k = 0; k < slots; ++k) flags[k].full.store(0);
    const pid_t child = ::fork();
    if (child < 0) break;
    if (child == 0) {
      pin(cpu_b);
      auto out = std::unique_ptr<char[]>(new (std::align_val_t(4096)) char[size]);
      std::memset(out.get(), 0, size);
      shared->ready.store(1, std::memory_order_release);
      uint32_t spins = 0;
      uint64_t copied = 0;
      for (uint64_t i = 0;; ++i) {
        Flag& f = flags[i % slots];
        while (f.full.load(std::memory_order_acquire) == 0) {
          if (shared->stop.load(std::memory_order_relaxed) != 0) {
            shared->copied.store(copied, std::memory_order_release);
            std::_Exit(0);
          }
          spin(spins);
        }
        std::memcpy(out.get(), mem + (i % slots) * size, size);
        asm volatile("" : : "r"(out.get()) : "memory");
        f.full.store(0, std::memory_order_release);
        copied += size;
      }
    }
    pin(cpu_a);
    auto in = std::unique_ptr<char[]>(new (std::align_val_t(4096)) char[size]);
    std::memset(in.get(), 0x5a, size);
    while (shared->ready.load(std::memory_order_acquire) == 0) ::sched_yield();
    uint32_t spins = 0;
    const auto t0 = Clock::now();
    auto t1 = t0;
    for (uint64_t i = 0;; ++i) {
      Flag& f = flags[i % slots];
      while (f.full.load(std::memory_order_acquire) != 0) spin(spins);
      if (nontemporal && size % 64 == 0)
        copy_nontemporal(mem + (i % slots) * size, in.get(), size);
      else
        std::memcpy(mem + (i % slots) * size, in.get(), size);
      f.full.store(1, std::memory_order_release);
      if (i % 16 == 15 && (t1 = Clock::now()) - t0 >= each) break;
    }
    // The reader's count when it sees the stop: what was delivered in time
    // (and the few chunks in flight).
    shared->stop.store(1, std::memory_order_relaxed);
    int status = 0;
    ::waitpid(child, &status, 0);
    const double s = std::chrono::duration<double>(t1 - t0).count();
    runs.push_back(static_cast<double>(shared->copied.load(std::memory_order_acquire)) /
                   s / 1e6);
  }
  ::munmap(map, bytes);
  if (runs.empty()) return -1;
  std::sort(runs.begin(), runs.end());
  *best = runs.back();
  return runs[runs.size() / 2];
}

std::vector<uint64_t> parse_list(const char* s) {
  std::vector<uint64_t> v;
  while (*s) {
    char* end = nullptr;
    v.push_back(std::strtoull(s, &end, 10));
    if (end == s) break;
    s = *end == ',' ? end + 1 : end;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  int cpu_a = 0, cpu_b = 1;
  int rounds = 3;
  uint64_t tcp_size = 0;      // --tcp N: also a loopback TCP ping-pong of N bytes
  uint64_t handoff_size = 0;  // --handoff N: also the two-core handoff floor
  std::vector<uint64_t> handoff_slots{2, 4, 32};
  bool handoff_nt = false;  // --handoff-nt: the writer's copies also non-temporal
  std::vector<uint64_t> sizes;
  for (uint64_t v = 8; v <= (uint64_t{8} << 20); v *= 2) sizes.push_back(v);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--cpus" && i + 1 < argc) {
      const auto v = parse_list(argv[++i]);
      if (v.size() == 2) {
        cpu_a = static_cast<int>(v[0]);
        cpu_b = static_cast<int>(v[1]);
      }
    } else if (a == "--sizes" && i + 1 < argc) {
      sizes = parse_list(argv[++i]);
    } else if (a == "--tcp" && i + 1 < argc) {
      tcp_size = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--handoff" && i + 1 < argc) {
      handoff_size = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--handoff-nt") {
      handoff_nt = true;
    } else if (a == "--handoff-slots" && i + 1 < argc) {
      handoff_slots = parse_list(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(
          stderr,
          "usage: rdmakit-floors [--json] [--cpus A,B] [--sizes 8,64,...] "
          "[--rounds N] [--tcp BYTES] [--handoff BYTES] [--handoff-slots 2,4,...]\n");
      return a == "-h" || a == "--help" ? 0 : 1;
    }
  }
  if (std::thread::hardware_concurrency() < 2) {
    std::fprintf(stderr, "rdmakit-floors: one CPU only; ping-pong shares it\n");
  }

  // Median of several runs of 2000 batches each.
  std::vector<double> hops, mins;
  for (int r = 0; r < rounds; ++r) {
    double best = 0;
    hops.push_back(pingpong_half_rtt_ns(cpu_a, cpu_b, 1000, &best));
    mins.push_back(best);
  }
  std::sort(hops.begin(), hops.end());
  std::sort(mins.begin(), mins.end());
  const double hop = hops[hops.size() / 2];
  double two_line_best = 0;
  const double two_line = two_line_half_rtt_ns(cpu_a, cpu_b, 1000, &two_line_best);
  if (json) {
    std::printf(
        "%s\n",
        fmt::format(
            "{{\"floor\":\"cacheline_pingpong\",\"cpus\":[{},{}],"
            "\"half_rtt_ns\":{:.2f},\"rtt_ns\":{:.2f},\"min_half_rtt_ns\":{:.2f}}}",
            cpu_a, cpu_b, hop, 2 * hop, mins.front())
            .c_str());
    std::printf("%s\n", fmt::format("{{\"floor\":\"two_line_pingpong\",\"cpus\":[{},{}],"
                                    "\"half_rtt_ns\":{:.2f},\"min_half_rtt_ns\":{:.2f}}}",
                                    cpu_a, cpu_b, two_line, two_line_best)
                            .c_str());
  } else {
    std::printf(
        "cache-line ping-pong cpu %d <-> cpu %d: half round trip %.1f ns (min %.1f)\n",
        cpu_a, cpu_b, hop, mins.front());
    std::printf(
        "two-line ping-pong (one line per direction): half round trip %.1f ns (min "
        "%.1f)\n",
        two_line, two_line_best);
  }
  if (tcp_size != 0) {
    double tcp_best = 0;
    const double tcp = tcp_half_rtt_ns(cpu_a, cpu_b, tcp_size, 50, &tcp_best);
    if (json) {
      std::printf("%s\n", fmt::format("{{\"floor\":\"tcp_pingpong\",\"cpus\":[{},{}],"
                                      "\"size\":{},\"half_rtt_ns\":{:.2f},"
                                      "\"min_half_rtt_ns\":{:.2f}}}",
                                      cpu_a, cpu_b, tcp_size, tcp, tcp_best)
                              .c_str());
    } else {
      std::printf(
          "TCP ping-pong over loopback, %llu B: half round trip %.2f us (min %.2f)\n",
          static_cast<unsigned long long>(tcp_size), tcp / 1000, tcp_best / 1000);
    }
  }
  for (int nt = 0; nt <= (handoff_nt ? 1 : 0); ++nt)
    for (uint64_t slots : handoff_size != 0 ? handoff_slots : std::vector<uint64_t>{}) {
      if (slots == 0) continue;
      double hbest = 0;
      const double hbw = handoff_MBps(cpu_a, cpu_b, handoff_size, slots, nt != 0, 5,
                                      std::chrono::milliseconds(100), &hbest);
      if (json) {
        std::printf(
            "{\"floor\":\"handoff\",\"cpus\":[%d,%d],\"size\":%llu,\"slots\":%llu,"
            "\"bw_MBps\":%.2f,\"best_MBps\":%.2f}\n",
            cpu_a, cpu_b, static_cast<unsigned long long>(handoff_size),
            static_cast<unsigned long long>(slots), hbw, hbest);
      } else {
        std::printf(
            "two-core handoff%s, %llu B chunks, %llu slots: %.1f MB/s (best %.1f)\n",
            nt != 0 ? " (non-temporal stores)" : "",
            static_cast<unsigned long long>(handoff_size),
            static_cast<unsigned long long>(slots), hbw, hbest);
      }
      std::fflush(stdout);
    }
  if (!json)
    std::printf("%-10s %-16s %s\n", "#bytes", "memcpy[MB/sec]", "best run[MB/sec]");
  pin(cpu_b);
  for (uint64_t size : sizes) {
    double best = 0;
    const double bw = memcpy_MBps(size, 5, std::chrono::milliseconds(40), &best);
    if (json) {
      std::printf(
          "{\"floor\":\"memcpy\",\"size\":%llu,\"bw_MBps\":%.2f,\"best_MBps\":%.2f}\n",
          static_cast<unsigned long long>(size), bw, best);
    } else {
      std::printf("%-10llu %-16.1f %.1f\n", static_cast<unsigned long long>(size), bw,
                  best);
    }
    std::fflush(stdout);
  }
  return 0;
}
