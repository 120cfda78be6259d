#include "bootstrap.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#ifdef RDMAKIT_MESH_HAVE_PMIX
#include <pmix.h>
#endif

namespace mesh {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error("bootstrap: " + what + ": " + std::strerror(errno));
}

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = ::recv(fd, c, n, 0);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
bool send_str(int fd, const std::string& s) {
  const auto n = static_cast<uint32_t>(s.size());
  return write_all(fd, &n, 4) && write_all(fd, s.data(), n);
}
std::optional<std::string> recv_str(int fd) {
  uint32_t n = 0;
  if (!read_all(fd, &n, 4) || n > (16u << 20)) return std::nullopt;
  std::string s(n, '\0');
  if (!read_all(fd, s.data(), n)) return std::nullopt;
  return s;
}

sockaddr_in resolve(const std::string& hostport) {
  const auto colon = hostport.rfind(':');
  if (colon == std::string::npos)
    throw std::runtime_error("bootstrap: --root wants HOST:PORT");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string host = hostport.substr(0, colon);
  const std::string port = hostport.substr(colon + 1);
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    throw std::runtime_error("bootstrap: cannot resolve " + hostport);
  }
  sockaddr_in a = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  return a;
}

class Standalone : public Bootstrap {
 public:
  Standalone(int rank, int size, const std::string& root) {
    rank_ = rank;
    size_ = size;
    const sockaddr_in addr = resolve(root);
    if (rank == 0) {
      const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const int one = 1;
      setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(ls, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
        fail("bind " + root);
      }
      if (::listen(ls, size) != 0) fail("listen");
      peers_.assign(static_cast<size_t>(size), -1);
      for (int i = 1; i < size; ++i) {
        timeval tv{30, 0};
        setsockopt(ls, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        const int fd = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) fail("waiting for the other ranks on " + root);
        int32_t r = -1;
        if (!read_all(fd, &r, 4) || r <= 0 || r >= size ||
            peers_[static_cast<size_t>(r)] >= 0) {
          throw std::runtime_error("bootstrap: bad or duplicate rank from a peer");
        }
        peers_[static_cast<size_t>(r)] = fd;
      }
      ::close(ls);
    } else {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      for (;;) {
        root_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (::connect(root_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) ==
            0) {
          break;
        }
        ::close(root_fd_);
        if (std::chrono::steady_clock::now() > deadline) fail("connect to root " + root);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      const int32_t r = rank;
      if (!write_all(root_fd_, &r, 4)) fail("hello to root");
    }
  }
  ~Standalone() override {
    for (int fd : peers_) {
      if (fd >= 0) ::close(fd);
    }
    if (root_fd_ >= 0) ::close(root_fd_);
  }
  const char* name() const override { return "standalone"; }

  std::vector<std::optional<std::string>> allgather(const std::string& mine) override {
    std::vector<std::optional<std::string>> all(static_cast<size_t>(size_));
    if (rank_ == 0) {
      all[0] = mine;
      for (int r = 1; r < size_; ++r) {
        int& fd = peers_[static_cast<size_t>(r)];
        if (fd >= 0) all[static_cast<size_t>(r)] = recv_str(fd);
        if (!all[static_cast<size_t>(r)] && fd >= 0) {
          ::close(fd);
          fd = -1;  // that rank is gone
        }
      }
      std::string blob;
      for (const auto& e : all) {
        blob += e ? "1" : "0";
        const std::string s = e.value_or("");
        blob += std::to_string(s.size()) + ":" + s;
      }
      for (int r = 1; r < size_; ++r) {
        int fd = peers_[static_cast<size_t>(r)];
        if (fd >= 0) (void)send_str(fd, blob);
      }
      return all;
    }
    if (!send_str(root_fd_, mine)) fail("allgather send to root");
    const std::optional<std::string> blob = recv_str(root_fd_);
    if (!blob) throw std::runtime_error("bootstrap: root (rank 0) is gone");
    size_t pos = 0;
    for (auto& e : all) {
      const bool present = (*blob)[pos++] == '1';
      const size_t colon = blob->find(':', pos);
      const size_t n = std::stoul(blob->substr(pos, colon - pos));
      if (present) e = blob->substr(colon + 1, n);
      pos = colon + 1 + n;
    }
    return all;
  }

 private:
  std::vector<int> peers_;
  int root_fd_ = -1;
};

#ifdef RDMAKIT_MESH_HAVE_PMIX
class Pmix : public Bootstrap {
 public:
  Pmix() {
    if (PMIx_Init(&me_, nullptr, 0) != PMIX_SUCCESS) {
      throw std::runtime_error("bootstrap: PMIx_Init failed under a PMIx launcher");
    }
    rank_ = static_cast<int>(me_.rank);
    pmix_proc_t job;
    PMIX_PROC_CONSTRUCT(&job);
    std::memcpy(job.nspace, me_.nspace, sizeof job.nspace);
    job.rank = PMIX_RANK_WILDCARD;
    pmix_value_t* v = nullptr;
    if (PMIx_Get(&job, PMIX_JOB_SIZE, nullptr, 0, &v) != PMIX_SUCCESS || v == nullptr) {
      throw std::runtime_error("bootstrap: PMIx_Get(PMIX_JOB_SIZE) failed");
    }
    size_ = static_cast<int>(v->data.uint32);
    PMIX_VALUE_RELEASE(v);
  }
  ~Pmix() override { PMIx_Finalize(nullptr, 0); }
  const char* name() const override { return "pmix"; }

  std::vector<std::optional<std::string>> allgather(const std::string& mine) override {
    const std::string key = "rdmakit.mesh." + std::to_string(round_++);
    pmix_value_t value;
    PMIX_VALUE_CONSTRUCT(&value);
    value.type = PMIX_STRING;
    value.data.string = const_cast<char*>(mine.c_str());
    if (PMIx_Put(PMIX_GLOBAL, key.c_str(), &value) != PMIX_SUCCESS ||
        PMIx_Commit() != PMIX_SUCCESS) {
      throw std::runtime_error("bootstrap: PMIx_Put/Commit failed");
    }
    pmix_proc_t job;
    PMIX_PROC_CONSTRUCT(&job);
    std::memcpy(job.nspace, me_.nspace, sizeof job.nspace);
    job.rank = PMIX_RANK_WILDCARD;
    pmix_info_t info;
    bool collect = true;
    PMIX_INFO_CONSTRUCT(&info);
    PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    if (PMIx_Fence(&job, 1, &info, 1) != PMIX_SUCCESS) {
      throw std::runtime_error("bootstrap: PMIx_Fence failed");
    }
    PMIX_INFO_DESTRUCT(&info);
    std::vector<std::optional<std::string>> all(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      pmix_proc_t p;
      PMIX_PROC_CONSTRUCT(&p);
      std::memcpy(p.nspace, me_.nspace, sizeof p.nspace);
      p.rank = static_cast<pmix_rank_t>(r);
      pmix_value_t* v = nullptr;
      if (PMIx_Get(&p, key.c_str(), nullptr, 0, &v) == PMIX_SUCCESS && v != nullptr) {
        if (v->type == PMIX_STRING && v->data.string != nullptr) {
          all[static_cast<size_t>(r)] = std::string(v->data.string);
        }
        PMIX_VALUE_RELEASE(v);
      }
    }
    return all;
  }

 private:
  pmix_proc_t me_{};
  int round_ = 0;
};
#endif

}  // namespace

std::unique_ptr<Bootstrap> standalone_bootstrap(int rank, int size,
                                                const std::string& root) {
  return std::make_unique<Standalone>(rank, size, root);
}

std::unique_ptr<Bootstrap> pmix_bootstrap() {
#ifdef RDMAKIT_MESH_HAVE_PMIX
  if (std::getenv("PMIX_RANK") != nullptr || std::getenv("PMIX_NAMESPACE") != nullptr) {
    return std::make_unique<Pmix>();
  }
#endif
  return nullptr;
}

}  // namespace mesh
