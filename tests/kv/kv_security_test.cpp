// The kv server's door and its table's bounds, on every provider under test:
// clients without the secret, with a wrong one, replaying a recorded proof,
// or never proving are refused or dropped; a non-loopback bind without a
// secret is refused; lengths written into the table behind the server's back
// are bounded before it copies. In each case a genuine client still works
// afterwards. Cross-uid attacks run on tcp in kv_cross_user_test.sh.
#include <dirent.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "helpers.hpp"
#include "kv_raw_client.hpp"
#include "kv_test_util.hpp"

namespace rdmakit::kv::test {
namespace {

using rdmakit::test::RoleEnv;
using rdmakit::test::run_roles;
using rdmakit::test::scaled;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

class KvSecurityTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Providers, KvSecurityTest, ::testing::ValuesIn(kv_providers()));

// A genuine client: PUT, both GETs, DEL.
void genuine_client_works(RoleEnv& env, const std::string& key) {
  Client c(client_options(env));
  ASSERT_EQ(c.put(key, "genuine"), KvStatus::kOk);
  std::string v;
  ASSERT_EQ(c.get(key, &v, GetMode::kRpc), KvStatus::kOk);
  EXPECT_EQ(v, "genuine");
  ASSERT_EQ(c.get(key, &v, GetMode::kRead), KvStatus::kOk);
  EXPECT_EQ(v, "genuine");
  EXPECT_EQ(c.del(key), KvStatus::kOk);
}

std::string client_error(const ClientOptions& o) {
  try {
    Client c(o);
  } catch (const ClientError& e) {
    return e.what();
  }
  return "";
}

TEST_P(KvSecurityTest, ClientWithoutSecretIsRefused) {
  run_roles(
      GetParam(), [](RoleEnv& env) { serve(env, 4); },
      [](RoleEnv& env) {
        ClientOptions o = client_options(env);
        o.secret = nullptr;
        const std::string error = client_error(o);
        EXPECT_NE(
            error.find("the server requires a secret (--secret-file or RDMAKIT_SECRET)"),
            std::string::npos)
            << error;
        {
          // One that goes on anyway and sends a proof without a secret.
          RawClient raw(env);
          EXPECT_TRUE(raw.challenge.auth_required);
          const auto s = raw.authenticate(std::nullopt);
          ASSERT_TRUE(s);
          EXPECT_EQ(*s, AuthStatus::kNoSecret);
          EXPECT_TRUE(raw.closed_by_server(scaled(5s)));
        }
        {
          // One that skips the proof and sends a request: no answer to it,
          // a refusal, and the connection closed.
          RawClient raw(env);
          std::vector<std::byte> buf(kMaxRequest);
          const size_t n = encode_request(buf, Op::kTable, 1, "", "");
          std::string payload;
          EXPECT_FALSE(raw.send(std::span(buf).first(n), &payload));
          EXPECT_TRUE(raw.closed_by_server(scaled(5s)));
        }
        genuine_client_works(env, "after-no-secret");
      });
}

TEST_P(KvSecurityTest, ClientWithWrongSecretIsRefused) {
  run_roles(
      GetParam(), [](RoleEnv& env) { serve(env, 3); },
      [](RoleEnv& env) {
        ClientOptions o = client_options(env);
        o.secret = wrong_secret();
        const std::string error = client_error(o);
        EXPECT_NE(error.find("authentication failed: wrong secret"), std::string::npos)
            << error;
        RawClient raw(env);
        const auto s = raw.authenticate(raw.proof_for(*wrong_secret()));
        ASSERT_TRUE(s);
        EXPECT_EQ(*s, AuthStatus::kWrongSecret);
        EXPECT_TRUE(raw.closed_by_server(scaled(5s)));
        genuine_client_works(env, "after-wrong-secret");
      });
}

// A client with a secret does not use a server that has none.
TEST_P(KvSecurityTest, ClientWithSecretRefusesServerWithout) {
  run_roles(
      GetParam(),
      [](RoleEnv& env) {
        ServerOptions o = server_options(env);
        o.secret = nullptr;  // loopback: allowed, with a warning
        o.exit_after_clients = 2;
        serve(env, o);
      },
      [](RoleEnv& env) {
        const std::string error = client_error(client_options(env));
        EXPECT_NE(error.find("the server does not authenticate"), std::string::npos)
            << error;
        ClientOptions o = client_options(env);
        o.secret = nullptr;
        Client c(o);
        EXPECT_EQ(c.put("k", "v"), KvStatus::kOk);
      });
}

// An eavesdropper that recorded a genuine exchange (the client's nonce and
// proof) and replays it on a new connection: the server's nonce is new, so
// the proof does not verify.
TEST_P(KvSecurityTest, ReplayedProofIsRefused) {
  run_roles(
      GetParam(), [](RoleEnv& env) { serve(env, 2); },
      [](RoleEnv& env) {
        RawClient genuine(env);
        const auth::Proof recorded = genuine.proof_for(*test_secret());
        ASSERT_EQ(genuine.authenticate(recorded), AuthStatus::kOk);

        RawClient replay(env, genuine.client_nonce);  // the same hello
        EXPECT_NE(replay.challenge.server_nonce, genuine.challenge.server_nonce);
        const auto s = replay.authenticate(recorded);
        ASSERT_TRUE(s);
        EXPECT_EQ(*s, AuthStatus::kWrongSecret);
        EXPECT_TRUE(replay.closed_by_server(scaled(5s)));
        EXPECT_EQ(replay.table.region.rkey, 0u) << "a descriptor reached the replayer";

        // The recorded connection itself is still served.
        std::vector<std::byte> buf(kMaxRequest);
        const size_t n = encode_request(buf, Op::kPut, 7, "replayed?", "no");
        std::string why;
        const auto r = genuine.send(std::span(buf).first(n), &why);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, KvStatus::kOk) << why;
      });
  // And a genuine Client afterwards, on a fresh server.
  run_roles(
      GetParam(), [](RoleEnv& env) { serve(env, 1); },
      [](RoleEnv& env) { genuine_client_works(env, "after-replay"); });
}

// A client that connects and never proves holds its server slot only until
// the authentication timeout; the server keeps serving meanwhile. With one
// slot, the genuine client gets in once the silent one was dropped.
TEST_P(KvSecurityTest, SilentClientIsDroppedAndTheServerKeepsServing) {
  run_roles(
      GetParam(),
      [](RoleEnv& env) {
        ServerOptions o = server_options(env);
        o.auth_timeout = 500ms;
        o.max_clients = 1;
        o.exit_after_clients = 3;
        serve(env, o);
      },
      [](RoleEnv& env) {
        RawClient silent(env);
        const auto t0 = Clock::now();
        genuine_client_works(env, "while-silent");  // waits for the slot
        EXPECT_GE(Clock::now() - t0, 400ms);
        EXPECT_TRUE(silent.closed_by_server(scaled(5s)));
        genuine_client_works(env, "after-silent");
      });
}

TEST(KvSecurity, NonLoopbackBindWithoutSecretIsRefused) {
  for (const char* address : {"0.0.0.0:0", "[::]:0", "192.0.2.1:0"}) {
    ServerOptions o;
    o.address = address;
    o.provider = ProviderKind::kTcp;
    try {
      Server s(o);
      ADD_FAILURE() << address << ": started without a secret";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--no-auth"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(is_loopback_host("127.0.0.1:7471"));
  EXPECT_TRUE(is_loopback_host("127.1.2.3"));
  EXPECT_TRUE(is_loopback_host("[::1]:7471"));
  EXPECT_TRUE(is_loopback_host("localhost:1"));
  EXPECT_FALSE(is_loopback_host("0.0.0.0:7471"));
  EXPECT_FALSE(is_loopback_host("127.0.0.1.evil.example:1"));
  EXPECT_FALSE(is_loopback_host("10.0.0.1"));
  EXPECT_FALSE(is_loopback_host("[::]:1"));
  // Loopback without a secret starts (and warns).
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.provider = ProviderKind::kTcp;
  Server s(o);
  EXPECT_NE(s.describe().find("auth OFF"), std::string::npos) << s.describe();
}

// The tool: the default bind is loopback and the log line says so and whether
// auth is on; --bind 0.0.0.0 without a secret exits with the reason.
TEST(KvSecurity, ToolBindsLoopbackByDefaultAndRefusesAnOpenBind) {
  auto run = [](const std::string& args, int* status) {
    const std::string cmd = std::string("env -u RDMAKIT_SECRET -u RDMAKIT_SECRET_FILE ") +
                            "timeout -s KILL 10 " + RDMAKIT_KV_BINARY + " " + args +
                            " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[512];
    while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
    *status = p != nullptr ? pclose(p) : -1;
    return out;
  };
  int status = 0;
  std::string out = run("server --provider tcp -p 0 --bind 0.0.0.0", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("refusing to listen on 0.0.0.0:0 without a secret"),
            std::string::npos)
      << out;
  // The default: 127.0.0.1, stopped by timeout's SIGTERM after a moment.
  const std::string cmd =
      std::string("env -u RDMAKIT_SECRET -u RDMAKIT_SECRET_FILE timeout -s TERM 1 ") +
      RDMAKIT_KV_BINARY + " server --provider tcp -p 0 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  out.clear();
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  pclose(p);
  EXPECT_NE(out.find("listening on 127.0.0.1:"), std::string::npos) << out;
  EXPECT_NE(out.find("auth OFF"), std::string::npos) << out;
  EXPECT_NE(out.find("any local user can connect"), std::string::npos) << out;
}

// The server process's pid: the role process that is our sibling.
pid_t sibling_pid() {
  const pid_t parent = getppid();
  DIR* d = opendir("/proc");
  pid_t found = 0;
  while (dirent* e = d != nullptr ? readdir(d) : nullptr) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0 || pid == getpid()) continue;
    std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) == 2 &&
        ppid == parent)
      found = pid;
  }
  if (d != nullptr) closedir(d);
  return found;
}

// A hostile peer that writes lying lengths into the table: through the
// provider (a WRITE with the table's rkey: the region grants READ only), and
// as the same user writing the server's memory directly (what a same-uid
// peer on shm could do with the mapping; any provider, process_vm_writev).
// The server must bound what it reads back before it copies: GETs of the
// poisoned keys answer NOT_FOUND instead of copying 2 GiB, PUTs and DELs go
// on, growth drops the poisoned entries, and every client keeps working.
TEST_P(KvSecurityTest, LyingLengthsInTheTableAreBoundedByTheServer) {
  run_roles(
      GetParam(),
      [](RoleEnv& env) {
        ServerOptions o = server_options(env);
        o.table.capacity = 8;  // 16 buckets: PUTs below make it grow
        o.exit_after_clients = 3;
        serve(env, o);
      },
      [](RoleEnv& env) {
        Client c(client_options(env));
        for (int i = 0; i < 8; ++i)
          ASSERT_EQ(c.put("p" + std::to_string(i),
                          i % 2 ? std::string(2000, 'L') : std::string("short")),
                    KvStatus::kOk);
        RawClient raw(env);
        raw.login(*test_secret());
        // 1. A WRITE into the table is refused by the provider.
        std::memset(raw.mr->data(), 0xff, 128);
        ASSERT_TRUE(
            raw.qp
                ->post_send({.wr_id = 9,
                             .opcode = Opcode::kWrite,
                             .flags = kSignaled,
                             .length = 128,
                             .local_addr = raw.mr->data(),
                             .lkey = raw.mr->lkey(),
                             .remote_addr = raw.table.region.addr_at(kTableHeader),
                             .rkey = raw.table.region.rkey})
                .ok());
        Completion done;
        ASSERT_TRUE(rdmakit::test::wait_one(*raw.cq, &done));
        EXPECT_EQ(done.status, Status::kRemoteAccessError);

        // 2. The same user writes the server's table memory directly.
        const pid_t server = sibling_pid();
        ASSERT_GT(server, 0) << "server role not found";
        const TableInfo t = c.table();
        std::vector<Slot> slots(t.slot_count);
        iovec local{slots.data(), slots.size() * sizeof(Slot)};
        iovec remote{reinterpret_cast<void*>(t.region.addr_at(t.slot_offset(0))),
                     local.iov_len};
        ASSERT_EQ(process_vm_readv(server, &local, 1, &remote, 1, 0),
                  static_cast<ssize_t>(local.iov_len))
            << std::strerror(errno);
        int poisoned = 0;
        for (Slot& s : slots) {
          if (s.state != uint16_t(SlotState::kInline) &&
              s.state != uint16_t(SlotState::kIndirect))
            continue;
          // The key's length stays (so the server's lookup matches it); the
          // value's length and the block index lie.
          s.value_len = 0x7fffffffu;
          s.block = 0xfffffff0u;
          ++poisoned;
        }
        ASSERT_EQ(poisoned, 8);
        ASSERT_EQ(process_vm_writev(server, &local, 1, &remote, 1, 0),
                  static_cast<ssize_t>(local.iov_len))
            << std::strerror(errno);

        std::string v;
        for (int i = 0; i < 8; ++i)
          EXPECT_EQ(c.get("p" + std::to_string(i), &v, GetMode::kRpc),
                    KvStatus::kNotFound);
        EXPECT_EQ(c.del("p0"), KvStatus::kNotFound);
        EXPECT_EQ(c.put("p1", "again"), KvStatus::kOk);
        EXPECT_EQ(c.get("p1", &v, GetMode::kRpc), KvStatus::kOk);
        EXPECT_EQ(v, "again");
        // Enough keys to grow the 16-bucket table: the rebuild skips the
        // poisoned slots, and READ-GETs see a clean table again.
        for (int i = 0; i < 64; ++i)
          ASSERT_EQ(c.put("g" + std::to_string(i), std::to_string(i)), KvStatus::kOk);
        for (int i = 0; i < 64; ++i) {
          ASSERT_EQ(c.get("g" + std::to_string(i), &v, GetMode::kRead), KvStatus::kOk);
          EXPECT_EQ(v, std::to_string(i));
        }
        EXPECT_GT(c.table().epoch, t.epoch);
        ASSERT_EQ(c.get("p1", &v, GetMode::kRead), KvStatus::kOk);
        EXPECT_EQ(v, "again");
        EXPECT_EQ(c.get("p2", &v, GetMode::kRead), KvStatus::kNotFound);
        genuine_client_works(env, "after-lying-lengths");
      });
}

}  // namespace
}  // namespace rdmakit::kv::test
