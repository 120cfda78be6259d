// Shared-secret challenge-response (rdmakit/auth.hpp): proofs verify only
// with the same secret, role, label and nonces; key files are refused unless
// private to their owner.
#include "rdmakit/auth.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "rdmakit/error.hpp"

namespace rdmakit::auth {
namespace {

std::string write_key(const std::string& text, mode_t mode) {
  char path[] = "/tmp/rdmakit-auth-XXXXXX";
  const int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::fchmod(fd, mode);
  ::close(fd);
  return path;
}

TEST(AuthTest, ProofVerifiesOnlyWithTheSameInputs) {
  const std::string path = write_key("correct horse battery staple\n", 0600);
  const Secret a = Secret::from_file(path);
  const std::string other = write_key("another secret of enough length", 0600);
  const Secret b = Secret::from_file(other);
  const Nonce nc = fresh_nonce(), ns = fresh_nonce();
  EXPECT_NE(nc, ns);
  const Proof p = a.prove(Role::kClient, "rdmakit-cp", nc, ns);
  EXPECT_TRUE(a.verify(Role::kClient, "rdmakit-cp", nc, ns, p));
  EXPECT_FALSE(b.verify(Role::kClient, "rdmakit-cp", nc, ns, p));  // wrong secret
  EXPECT_FALSE(a.verify(Role::kServer, "rdmakit-cp", nc, ns, p));  // reflected
  EXPECT_FALSE(a.verify(Role::kClient, "rdmakit-kv", nc, ns, p));  // other service
  EXPECT_FALSE(a.verify(Role::kClient, "rdmakit-cp", nc, fresh_nonce(), p));  // replayed
  ::unlink(path.c_str());
  ::unlink(other.c_str());
}

TEST(AuthTest, TrailingNewlineIsNotPartOfTheKey) {
  const std::string with = write_key("0123456789abcdef-key\n", 0600);
  const std::string without = write_key("0123456789abcdef-key", 0400);
  const Nonce nc = fresh_nonce(), ns = fresh_nonce();
  EXPECT_EQ(Secret::from_file(with).prove(Role::kServer, "x", nc, ns),
            Secret::from_file(without).prove(Role::kServer, "x", nc, ns));
  ::unlink(with.c_str());
  ::unlink(without.c_str());
}

TEST(AuthTest, KeyFileReadableByOthersIsRefusedWithItsMode) {
  const std::string path = write_key("0123456789abcdef-key", 0644);
  try {
    (void)Secret::from_file(path);
    FAIL() << "a 0644 key file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("0644"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  ::unlink(path.c_str());
}

TEST(AuthTest, KeyFileOfAnotherUserIsRefused) {
  ASSERT_EQ(::geteuid(), 0u) << "needs root to give the file to another uid";
  const std::string path = write_key("0123456789abcdef-key", 0600);
  ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
  try {
    (void)Secret::from_file(path);
    FAIL() << "a key file of uid 65534 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("owned by uid 65534"), std::string::npos)
        << e.what();
  }
  ::unlink(path.c_str());
}

TEST(AuthTest, ShortSymlinkedOrMissingKeysAreRefused) {
  const std::string shortkey = write_key("short", 0600);
  EXPECT_THROW((void)Secret::from_file(shortkey), Error);
  const std::string good = write_key("0123456789abcdef-key", 0600);
  const std::string link = good + ".link";
  ASSERT_EQ(::symlink(good.c_str(), link.c_str()), 0);
  EXPECT_THROW((void)Secret::from_file(link), Error);
  EXPECT_THROW((void)Secret::from_file("/nonexistent/rdmakit.key"), Error);
  for (const auto& p : {shortkey, good, link}) ::unlink(p.c_str());
}

TEST(AuthTest, EnvironmentSecret) {
  ::unsetenv("RDMAKIT_SECRET_FILE");
  ::unsetenv("RDMAKIT_SECRET");
  EXPECT_FALSE(Secret::resolve("").has_value());
  ::setenv("RDMAKIT_SECRET", "tiny", 1);
  EXPECT_THROW((void)Secret::resolve(""), Error);
  ::setenv("RDMAKIT_SECRET", "a long enough environment secret", 1);
  auto s = Secret::resolve("");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->origin(), "RDMAKIT_SECRET");
  ::unsetenv("RDMAKIT_SECRET");
}

TEST(AuthTest, SecretFromBytes) {
  std::vector<std::byte> key(32, std::byte{7});
  const Secret a = Secret::from_bytes(key, "the ssh channel");
  EXPECT_EQ(a.origin(), "the ssh channel");
  const Nonce nc = fresh_nonce(), ns = fresh_nonce();
  const Proof p = a.prove(Role::kServer, "x", nc, ns);
  EXPECT_TRUE(Secret::from_bytes(key, "again").verify(Role::kServer, "x", nc, ns, p));
  key[0] = std::byte{8};
  EXPECT_FALSE(Secret::from_bytes(key, "other").verify(Role::kServer, "x", nc, ns, p));
  EXPECT_THROW(
      (void)Secret::from_bytes(std::span(key).first(kMinSecretBytes - 1), "short"),
      Error);
}

}  // namespace
}  // namespace rdmakit::auth
