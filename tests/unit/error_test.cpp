// Control-path errors name what failed, where, with whom and why.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "rdmakit/rdmakit.hpp"

namespace rdmakit {
namespace {

TEST(ErrorTest, MessageNamesOperationProviderPeerAndErrno) {
  const Error e("connect", "tcp", "127.0.0.1:4791", ECONNREFUSED, "no listener");
  const std::string what = e.what();
  EXPECT_NE(what.find("connect"), std::string::npos) << what;
  EXPECT_NE(what.find("tcp"), std::string::npos) << what;
  EXPECT_NE(what.find("127.0.0.1:4791"), std::string::npos) << what;
  EXPECT_NE(what.find("ECONNREFUSED"), std::string::npos) << what;
  EXPECT_NE(what.find("no listener"), std::string::npos) << what;
  EXPECT_EQ(e.operation(), "connect");
  EXPECT_EQ(e.provider(), "tcp");
  EXPECT_EQ(e.peer(), "127.0.0.1:4791");
  EXPECT_EQ(e.sys_errno(), ECONNREFUSED);
}

TEST(ErrorTest, IsARuntimeError) {
  try {
    throw Error("register_memory", "verbs", "", ENOMEM, "");
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("register_memory"), std::string::npos) << what;
    EXPECT_NE(what.find("verbs"), std::string::npos) << what;
    EXPECT_NE(what.find("ENOMEM"), std::string::npos) << what;
  }
}

TEST(ErrorTest, ParseProviderAcceptsKnownNames) {
  EXPECT_EQ(parse_provider("auto"), ProviderKind::kAuto);
  EXPECT_EQ(parse_provider("shm"), ProviderKind::kShm);
  EXPECT_EQ(parse_provider("tcp"), ProviderKind::kTcp);
  EXPECT_EQ(parse_provider("verbs"), ProviderKind::kVerbs);
}

TEST(ErrorTest, OpenWithUnknownProviderThrowsNamingIt) {
  try {
    ContextOptions options;
    options.provider = parse_provider("bogus-provider");
    (void)Context::open(options);
    FAIL() << "expected rdmakit::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bogus-provider"), std::string::npos)
        << e.what();
    EXPECT_EQ(e.sys_errno(), EINVAL);
  }
}

TEST(ErrorTest, OpenWithUnknownProviderFromEnvironmentThrowsNamingIt) {
  const char* saved = std::getenv("RDMAKIT_PROVIDER");
  const std::string old = saved != nullptr ? saved : "";
  ::setenv("RDMAKIT_PROVIDER", "nosuchprov", 1);
  try {
    (void)Context::open();
    ADD_FAILURE() << "expected rdmakit::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nosuchprov"), std::string::npos) << e.what();
  }
  if (saved != nullptr) {
    ::setenv("RDMAKIT_PROVIDER", old.c_str(), 1);
  } else {
    ::unsetenv("RDMAKIT_PROVIDER");
  }
}

}  // namespace
}  // namespace rdmakit
