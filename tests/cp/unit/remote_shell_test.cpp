// rdmakit-cp -e: the remote shell's word splitting (as rsync's), the
// bootstrap line, the remote command and the child process.
#include "remote_shell.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>

namespace rdmakit::cp {
namespace {

using namespace std::chrono_literals;
using Words = std::vector<std::string>;

Words split(const std::string& s) {
  Words w;
  std::string why;
  EXPECT_TRUE(split_words(s, &w, &why)) << s << ": " << why;
  return w;
}

TEST(CpRemoteShell, SplitsOnBlanks) {
  EXPECT_EQ(split("ssh"), Words{"ssh"});
  EXPECT_EQ(split("  ssh  -p\t2222 \n -i key  "),
            (Words{"ssh", "-p", "2222", "-i", "key"}));
  EXPECT_EQ(split("ssh -p 2222 -i key -o StrictHostKeyChecking=no"),
            (Words{"ssh", "-p", "2222", "-i", "key", "-o", "StrictHostKeyChecking=no"}));
}

TEST(CpRemoteShell, QuotesKeepBlanksAndAreRemoved) {
  EXPECT_EQ(split("ssh -i 'my key' -o \"User Name\""),
            (Words{"ssh", "-i", "my key", "-o", "User Name"}));
  EXPECT_EQ(split("a'b c'd\"e f\"g"), Words{"ab cde fg"});  // parts of one word
  EXPECT_EQ(split("ssh '' x"), (Words{"ssh", "", "x"}));    // an empty word
  EXPECT_EQ(split("say \"it's\" 'a \"b\"'"), (Words{"say", "it's", "a \"b\""}));
  EXPECT_EQ(split("say 'it''s' \"x\"\"y\""), (Words{"say", "it's", "x\"y"}));  // doubled
  EXPECT_EQ(split("back\\slash 'a\\b'"), (Words{"back\\slash", "a\\b"}));  // no escapes
}

TEST(CpRemoteShell, RefusesUnbalancedQuotesAndEmptyCommands) {
  Words w;
  std::string why;
  EXPECT_FALSE(split_words("ssh -i 'key", &w, &why));
  EXPECT_NE(why.find("unbalanced single quote"), std::string::npos) << why;
  EXPECT_FALSE(split_words("ssh \"x", &w, &why));
  EXPECT_NE(why.find("unbalanced double quote"), std::string::npos) << why;
  EXPECT_FALSE(split_words("", &w, &why));
  EXPECT_FALSE(split_words(" \t ", &w, &why));
  EXPECT_FALSE(split_words("'' -p 1", &w, &why));  // no program
}

Bootstrap sample() {
  Bootstrap b;
  b.provider = "tcp";
  b.address = "10.1.2.3";
  b.port = 41234;
  for (size_t i = 0; i < b.secret.size(); ++i) b.secret[i] = std::byte(i * 7 + 1);
  return b;
}

TEST(CpBootstrap, RoundTrips) {
  const Bootstrap b = sample();
  const std::string line = format_bootstrap(b);
  EXPECT_EQ(line.rfind("rdmakit-cp-bootstrap 1 tcp 10.1.2.3 41234 01080f16", 0), 0u)
      << line;
  EXPECT_EQ(line.size(),
            std::string("rdmakit-cp-bootstrap 1 tcp 10.1.2.3 41234 ").size() + 64);
  Bootstrap got;
  std::string why;
  ASSERT_TRUE(parse_bootstrap(line, &got, &why)) << why;
  EXPECT_EQ(got.provider, "tcp");
  EXPECT_EQ(got.address, "10.1.2.3");
  EXPECT_EQ(got.port, 41234);
  EXPECT_EQ(got.secret, b.secret);
  EXPECT_EQ(got.endpoint(), "10.1.2.3:41234");
  ASSERT_TRUE(parse_bootstrap(line + "\r", &got, &why)) << why;  // a CR is tolerated
}

TEST(CpBootstrap, Ipv6EndpointIsBracketed) {
  Bootstrap b = sample();
  b.address = "fe80::1%eth0";
  b.provider = "verbs";
  Bootstrap got;
  std::string why;
  ASSERT_TRUE(parse_bootstrap(format_bootstrap(b), &got, &why)) << why;
  EXPECT_EQ(got.endpoint(), "[fe80::1%eth0]:41234");
  EXPECT_EQ(host_port("::1", 0), "[::1]:0");
}

TEST(CpBootstrap, RefusesWhatIsNotOne) {
  const std::string good = format_bootstrap(sample());
  const std::string hex = good.substr(good.rfind(' ') + 1);
  const auto refused = [&](const std::string& line, const std::string& expect) {
    Bootstrap got;
    std::string why;
    EXPECT_FALSE(parse_bootstrap(line, &got, &why)) << line;
    EXPECT_NE(why.find(expect), std::string::npos) << line << ": " << why;
    EXPECT_EQ(why.find(hex), std::string::npos) << "the secret is quoted: " << why;
  };
  refused("", "not a bootstrap line");
  refused("--server --push --provider tcp", "not a bootstrap line");
  refused("Welcome to host!", "not a bootstrap line");
  refused("rdmakit-cp-bootstrap 2 tcp 10.1.2.3 1 " + hex, "bootstrap version 2");
  refused("rdmakit-cp-bootstrap", "version missing");
  refused("rdmakit-cp-bootstrap 1 tcp 10.1.2.3 41234", "5 fields");
  refused("rdmakit-cp-bootstrap 1 tcp 10.1.2.3 41234 " + hex + " x", "7 fields");
  refused("rdmakit-cp-bootstrap 1  tcp 10.1.2.3 41234 " + hex, "7 fields");
  refused("rdmakit-cp-bootstrap 1 udp 10.1.2.3 41234 " + hex, "unknown provider");
  refused("rdmakit-cp-bootstrap 1 tcp example.com 41234 " + hex, "not a numeric address");
  refused("rdmakit-cp-bootstrap 1 tcp 10.1.2.300 41234 " + hex, "not a numeric address");
  refused("rdmakit-cp-bootstrap 1 tcp 10.1.2.3 0 " + hex, "bad port");
  refused("rdmakit-cp-bootstrap 1 tcp 10.1.2.3 65536 " + hex, "bad port");
  refused("rdmakit-cp-bootstrap 1 tcp 10.1.2.3 -1 " + hex, "bad port");
  refused("rdmakit-cp-bootstrap 1 tcp 10.1.2.3 41234 " + hex.substr(2), "64 hex digits");
  refused("rdmakit-cp-bootstrap 1 tcp 10.1.2.3 41234 zz" + hex.substr(2), "not hex");
}

TEST(CpBootstrap, PrintableExcerpt) {
  EXPECT_EQ(printable("a\tb\x1b[31m"), "a?b?[31m");
  EXPECT_EQ(printable(std::string(100, 'x'), 10), "xxxxxxxxxx...");
}

TEST(CpRemoteShell, CommandNamesHostProgramAndServerOptions) {
  RemoteRequest r{"ssh -p 2222 -i 'my key'",
                  "/opt/rdmakit/bin/rdmakit-cp",
                  "alice@host",
                  true,
                  "tcp",
                  true};
  Words argv;
  std::string why;
  ASSERT_TRUE(remote_command(r, &argv, &why)) << why;
  EXPECT_EQ(argv, (Words{"ssh", "-p", "2222", "-i", "my key", "alice@host",
                         "/opt/rdmakit/bin/rdmakit-cp", "--server", "--push",
                         "--provider", "tcp", "--preserve-special"}));
  EXPECT_EQ(command_text(argv).substr(0, 25), "ssh -p 2222 -i 'my key' a");
  r.push = false;
  r.preserve_special = false;
  r.provider = "verbs";
  ASSERT_TRUE(remote_command(r, &argv, &why)) << why;
  EXPECT_EQ(Words(argv.end() - 4, argv.end()),
            (Words{"--server", "--pull", "--provider", "verbs"}));
  // auto: without an RDMA device here only tcp can meet us.
  ::setenv("RDMAKIT_PROVIDER", "tcp", 1);
  r.provider = "auto";
  ASSERT_TRUE(remote_command(r, &argv, &why)) << why;
  EXPECT_EQ(argv.back(), "tcp");
  ::unsetenv("RDMAKIT_PROVIDER");
}

TEST(CpRemoteShell, CommandRefusesOptionLikeHostsAndBadProviders) {
  Words argv;
  std::string why;
  EXPECT_FALSE(remote_command(
      {"ssh", "rdmakit-cp", "-oProxyCommand=x", true, "tcp", false}, &argv, &why));
  EXPECT_NE(why.find("not a host name"), std::string::npos) << why;
  EXPECT_FALSE(
      remote_command({"ssh", "rdmakit-cp", "h", true, "udp", false}, &argv, &why));
  EXPECT_FALSE(
      remote_command({"ssh 'x", "rdmakit-cp", "h", true, "tcp", false}, &argv, &why));
  EXPECT_FALSE(remote_command({"ssh", "", "h", true, "tcp", false}, &argv, &why));
}

TEST(CpRemoteShell, ChildLineEofAndStatus) {
  RemoteShell sh;
  std::string why, line;
  ASSERT_TRUE(sh.spawn({"sh", "-c", "echo first; echo second; exit 3"}, &why)) << why;
  EXPECT_EQ(sh.read_line(5s, 100, &line), RemoteShell::Read::kLine);
  EXPECT_EQ(line, "first");
  EXPECT_EQ(sh.read_line(5s, 100, &line), RemoteShell::Read::kLine);
  EXPECT_EQ(line, "second");
  EXPECT_EQ(sh.read_line(5s, 100, &line), RemoteShell::Read::kEof);
  EXPECT_EQ(sh.finish(5s), "sh exited with status 3");
  EXPECT_FALSE(sh.running());
}

TEST(CpRemoteShell, ClosingStdinEndsTheChild) {
  RemoteShell sh;
  std::string why;
  // cat ends at the end of its input: what the remote server does too.
  ASSERT_TRUE(sh.spawn({"cat"}, &why)) << why;
  EXPECT_EQ(sh.finish(5s), "cat exited with status 0");
  EXPECT_TRUE(WIFEXITED(sh.status()));
}

TEST(CpRemoteShell, SilentChildTimesOutAndIsStopped) {
  RemoteShell sh;
  std::string why, line;
  ASSERT_TRUE(sh.spawn({"sh", "-c", "printf partial; exec sleep 30"}, &why)) << why;
  EXPECT_EQ(sh.read_line(300ms, 100, &line), RemoteShell::Read::kTimeout);
  EXPECT_EQ(line, "partial");
  const std::string how = sh.finish(100ms);
  EXPECT_NE(how.find("killed by signal 15"), std::string::npos) << how;
}

TEST(CpRemoteShell, LongLineAndMissingProgram) {
  RemoteShell sh;
  std::string why, line;
  ASSERT_TRUE(sh.spawn({"sh", "-c", "head -c 1000 /dev/zero | tr '\\0' x"}, &why)) << why;
  EXPECT_EQ(sh.read_line(5s, 256, &line), RemoteShell::Read::kTooLong);
  (void)sh.finish(5s);
  RemoteShell none;
  EXPECT_FALSE(none.spawn({"/nonexistent/ssh"}, &why));
  EXPECT_NE(why.find("cannot run /nonexistent/ssh"), std::string::npos) << why;
}

TEST(CpRemoteShell, StartReportsAProgramThatIsNotTheServer) {
  // A "remote shell" that runs the command here, and /bin/echo as the program.
  const RemoteRequest r{
      "sh -c 'shift; exec \"$@\"' rsh", "/bin/echo", "host", true, "tcp", false};
  Words argv;
  std::string why;
  ASSERT_TRUE(remote_command(r, &argv, &why)) << why;
  RemoteShell sh;
  Bootstrap b;
  EXPECT_FALSE(start_remote_server(r, argv, &sh, &b, &why));
  EXPECT_NE(
      why.find("printed \"--server --push --provider tcp\" instead of a bootstrap line"),
      std::string::npos)
      << why;
  EXPECT_NE(why.find("sh exited with status 0"), std::string::npos) << why;
  EXPECT_NE(why.find("(command: sh -c"), std::string::npos) << why;
  // One that exits before answering: its status is what the user learns.
  const RemoteRequest fails{"sh -c 'exit 255'", "rdmakit-cp", "host", true, "tcp", false};
  ASSERT_TRUE(remote_command(fails, &argv, &why)) << why;
  RemoteShell sh2;
  EXPECT_FALSE(start_remote_server(fails, argv, &sh2, &b, &why));
  EXPECT_NE(why.find("sh exited with status 255 before the server answered"),
            std::string::npos)
      << why;
}

}  // namespace
}  // namespace rdmakit::cp
