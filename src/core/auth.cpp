#include "rdmakit/auth.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/fd.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::auth {
namespace {

Error secret_error(const std::string& where, int err, const std::string& detail) {
  return Error("load secret", "auth", where, err, detail);
}

void ensure_sodium() {
  // sodium_init is idempotent and thread-safe; -1 means no usable RNG.
  if (::sodium_init() < 0) throw Error("sodium_init", "auth", "", 0, "libsodium failed");
}

std::vector<std::byte> without_newline(std::vector<std::byte> key) {
  if (!key.empty() && key.back() == std::byte{'\n'}) key.pop_back();
  if (!key.empty() && key.back() == std::byte{'\r'}) key.pop_back();
  return key;
}

}  // namespace

Nonce fresh_nonce() {
  ensure_sodium();
  Nonce n;
  ::randombytes_buf(n.data(), n.size());
  return n;
}

Secret::Secret(std::vector<std::byte> key, std::string origin)
    : key_(std::move(key)), origin_(std::move(origin)) {}

Secret::~Secret() {
  if (!key_.empty()) ::sodium_memzero(key_.data(), key_.size());
}

Secret Secret::from_file(const std::string& path) {
  core::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY));
  if (!fd) {
    const int err = errno;
    throw secret_error(
        path, err, err == ELOOP ? "the key file is a symbolic link" : "open key file");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw secret_error(path, errno, "fstat");
  if (!S_ISREG(st.st_mode)) throw secret_error(path, EINVAL, "not a regular file");
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    throw secret_error(path, EPERM,
                       fmt::format("owned by uid {}; it must belong to uid {} or root",
                                   st.st_uid, ::geteuid()));
  }
  if ((st.st_mode & 077) != 0) {
    throw secret_error(path, EPERM,
                       fmt::format("mode {:04o} lets other users read it; chmod 600 {}",
                                   st.st_mode & 07777, path));
  }
  if (st.st_size > static_cast<off_t>(kMaxSecretBytes + 2)) {
    throw secret_error(
        path, EFBIG,
        fmt::format("{} bytes; a secret has at most {}", st.st_size, kMaxSecretBytes));
  }
  std::vector<std::byte> key(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < key.size()) {
    const ssize_t n = ::read(fd.get(), key.data() + got, key.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw secret_error(path, errno, "read");
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  key.resize(got);
  key = without_newline(std::move(key));
  if (key.size() < kMinSecretBytes || key.size() > kMaxSecretBytes) {
    const size_t size = key.size();
    ::sodium_memzero(key.data(), key.size());
    throw secret_error(path, EINVAL,
                       fmt::format("{} bytes; a secret has {} to {}", size,
                                   kMinSecretBytes, kMaxSecretBytes));
  }
  return Secret(std::move(key), "file " + path);
}

std::optional<Secret> Secret::from_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  const size_t len = std::strlen(value);
  if (len < kMinSecretBytes || len > kMaxSecretBytes) {
    throw secret_error(name, EINVAL,
                       fmt::format("{} bytes; a secret has {} to {}", len,
                                   kMinSecretBytes, kMaxSecretBytes));
  }
  const auto* bytes = reinterpret_cast<const std::byte*>(value);
  return Secret(std::vector<std::byte>(bytes, bytes + len), name);
}

Secret Secret::from_bytes(std::span<const std::byte> key, std::string origin) {
  if (key.size() < kMinSecretBytes || key.size() > kMaxSecretBytes) {
    throw secret_error(origin, EINVAL,
                       fmt::format("{} bytes; a secret has {} to {}", key.size(),
                                   kMinSecretBytes, kMaxSecretBytes));
  }
  return Secret(std::vector<std::byte>(key.begin(), key.end()), std::move(origin));
}

std::optional<Secret> Secret::resolve(const std::string& file) {
  if (!file.empty()) return from_file(file);
  if (const char* env = std::getenv("RDMAKIT_SECRET_FILE"); env != nullptr && *env != 0)
    return from_file(env);
  return from_env("RDMAKIT_SECRET");
}

Proof Secret::prove(Role role, std::string_view label, const Nonce& client,
                    const Nonce& server) const {
  ensure_sodium();
  crypto_auth_hmacsha256_state state;
  ::crypto_auth_hmacsha256_init(
      &state, reinterpret_cast<const unsigned char*>(key_.data()), key_.size());
  // Length-prefixed label, so "ab"+role never equals "a"+other bytes.
  const auto label_len = static_cast<unsigned char>(std::min<size_t>(label.size(), 255));
  const auto role_byte = static_cast<unsigned char>(role);
  ::crypto_auth_hmacsha256_update(&state, &label_len, 1);
  ::crypto_auth_hmacsha256_update(
      &state, reinterpret_cast<const unsigned char*>(label.data()), label_len);
  ::crypto_auth_hmacsha256_update(&state, &role_byte, 1);
  ::crypto_auth_hmacsha256_update(
      &state, reinterpret_cast<const unsigned char*>(client.data()), client.size());
  ::crypto_auth_hmacsha256_update(
      &state, reinterpret_cast<const unsigned char*>(server.data()), server.size());
  Proof out;
  ::crypto_auth_hmacsha256_final(&state, reinterpret_cast<unsigned char*>(out.data()));
  ::sodium_memzero(&state, sizeof state);
  return out;
}

bool Secret::verify(Role role, std::string_view label, const Nonce& client,
                    const Nonce& server, const Proof& proof) const {
  const Proof expected = prove(role, label, client, server);
  return ::sodium_memcmp(expected.data(), proof.data(), proof.size()) == 0;
}

}  // namespace rdmakit::auth
