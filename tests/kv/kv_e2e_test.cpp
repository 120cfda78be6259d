// The server and clients in separate processes, on every provider under test:
// the operations and their limits, several clients, growth seen by a client
// holding the old table, a full table refused, a hostile client, and the
// server killed under a running client.
#include <signal.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "helpers.hpp"
#include "kv_raw_client.hpp"
#include "kv_test_util.hpp"

namespace rdmakit::kv::test {
namespace {

using rdmakit::test::RoleEnv;
using rdmakit::test::run_roles;
using Clock = std::chrono::steady_clock;

class KvTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Providers, KvTest, ::testing::ValuesIn(kv_providers()));

// prefix + i, appended rather than prefix + to_string(i), whose inlined
// insert GCC 12 flags with a false -Wrestrict.
std::string cat(const char* prefix, uint64_t i) {
  std::string v = prefix;
  v += std::to_string(i);
  return v;
}
std::string v_of(int i) { return cat("v", static_cast<uint64_t>(i)); }

std::string get(Client& c, std::string_view key, GetMode mode,
                KvStatus want = KvStatus::kOk) {
  std::string v;
  EXPECT_EQ(c.get(key, &v, mode), want) << key;
  return v;
}

// --busy-poll: the server never sleeps; it still adopts clients that come
// later, serves both GET modes (on tcp it answers READs itself) and exits
// when its clients are gone.
TEST_P(KvTest, BusyPollingServerServesBothGetModes) {
  run_roles(
      GetParam(),
      [](RoleEnv& env) { serve(env, 2, {.capacity = 8}, /*busy_poll=*/true); },
      [](RoleEnv& env) {
        Client c(client_options(env));
        // 40 keys in a table sized for 8: it grows and stays crowded, so
        // some READ-GETs read past the first 4 slots.
        for (int i = 0; i < 40; ++i)
          ASSERT_EQ(c.put(std::to_string(i), v_of(i)), KvStatus::kOk);
        for (int i = 0; i < 40; ++i) {
          EXPECT_EQ(get(c, std::to_string(i), GetMode::kRead), v_of(i));
          EXPECT_EQ(get(c, std::to_string(i), GetMode::kRpc), v_of(i));
        }
        EXPECT_GT(c.read_stats().wide, 0u);
        EXPECT_GT(c.table().epoch, 1u);
        Client later(client_options(env));
        EXPECT_EQ(get(later, "7", GetMode::kRead), "v7");
        ASSERT_EQ(later.del("7"), KvStatus::kOk);
        get(c, "7", GetMode::kRead, KvStatus::kNotFound);
      });
}

// A READ-GET copies only the slots its bucket's reach covered when the client
// last looked; a reach grown since (another client's PUTs) shows in the
// copied home slot, and the GET reads on once and remembers it.
TEST_P(KvTest, ReadGetsCopyTheReachAsLastSeenAndFollowItsGrowth) {
  run_roles(
      GetParam(), [](RoleEnv& env) { serve(env, 2, {.capacity = 8, .grow = false}); },
      [](RoleEnv& env) {
        Client reader(client_options(env));
        Client writer(client_options(env));
        std::vector<std::string> same;  // keys of one home bucket
        const uint64_t home = reader.table().home_bucket(key_hash("0"));
        for (int i = 0; same.size() < 6; ++i) {
          std::string k = std::to_string(i);
          if (reader.table().home_bucket(key_hash(k)) == home) same.push_back(k);
        }
        ASSERT_EQ(writer.put(same[0], "v0"), KvStatus::kOk);
        EXPECT_EQ(get(reader, same[0], GetMode::kRead), "v0");  // 4 slots: not seen yet
        ReadStats before = reader.read_stats();
        EXPECT_EQ(get(reader, same[0], GetMode::kRead), "v0");
        EXPECT_EQ(reader.read_stats().reads - before.reads, 1u);
        EXPECT_EQ(reader.read_stats().bytes - before.bytes, kSlotSize);  // reach 1
        for (size_t i = 1; i < same.size(); ++i)
          ASSERT_EQ(writer.put(same[i], v_of(i)), KvStatus::kOk);
        before = reader.read_stats();
        EXPECT_EQ(get(reader, same[5], GetMode::kRead), "v5");
        EXPECT_EQ(reader.read_stats().wide - before.wide, 1u);
        EXPECT_EQ(reader.read_stats().bytes - before.bytes, 6 * kSlotSize);
        before = reader.read_stats();
        EXPECT_EQ(get(reader, same[3], GetMode::kRead), "v3");
        EXPECT_EQ(reader.read_stats().reads - before.reads, 1u);
        EXPECT_EQ(reader.read_stats().bytes - before.bytes, 6 * kSlotSize);
      });
}

TEST_P(KvTest, PutGetDeleteAndLimits) {
  run_roles(
      GetParam(), [](RoleEnv& env) { serve(env, 2); },
      [](RoleEnv& env) {
        Client c(client_options(env));
        for (GetMode mode : {GetMode::kRpc, GetMode::kRead}) {
          // The lab's integer keys and values, as they are.
          ASSERT_EQ(c.put("32767", "123456"), KvStatus::kOk);
          EXPECT_EQ(get(c, "32767", mode), "123456");
          ASSERT_EQ(c.put("32767", "7"), KvStatus::kOk);
          EXPECT_EQ(get(c, "32767", mode), "7");
          get(c, "unknown", mode, KvStatus::kNotFound);
          // Byte strings, empty values, the longest key and value.
          const std::string bin("a\0b\xff", 4);
          ASSERT_EQ(c.put(bin, bin), KvStatus::kOk);
          EXPECT_EQ(get(c, bin, mode), bin);
          ASSERT_EQ(c.put("empty", ""), KvStatus::kOk);
          EXPECT_EQ(get(c, "empty", mode), "");
          const std::string key(kMaxKey, 'k');
          const std::string value(kMaxValue, 'v');
          ASSERT_EQ(c.put(key, value), KvStatus::kOk);
          EXPECT_EQ(get(c, key, mode), value);
          // Too long: refused for that request only.
          std::string why;
          EXPECT_EQ(c.put(std::string(kMaxKey + 1, 'k'), "x", &why),
                    KvStatus::kKeyTooLong);
          EXPECT_NE(why.find("257"), std::string::npos) << why;
          EXPECT_EQ(c.put("x", std::string(kMaxValue + 1, 'v'), &why),
                    KvStatus::kValueTooLong);
          EXPECT_EQ(c.put("", "x"), KvStatus::kKeyTooLong);
          // Deletes: gone for both GET modes, a second delete finds nothing.
          ASSERT_EQ(c.del(key), KvStatus::kOk);
          ASSERT_EQ(c.del(bin), KvStatus::kOk);
          EXPECT_EQ(c.del(bin), KvStatus::kNotFound);
          get(c, key, GetMode::kRead, KvStatus::kNotFound);
          get(c, key, GetMode::kRpc, KvStatus::kNotFound);
          get(c, bin, GetMode::kRead, KvStatus::kNotFound);
          EXPECT_EQ(get(c, "32767", mode), "7");
        }
        // A second client at the same time sees the first one's writes.
        Client other(client_options(env));
        EXPECT_EQ(get(other, "32767", GetMode::kRead), "7");
        ASSERT_EQ(other.put("from-other", "yes"), KvStatus::kOk);
        EXPECT_EQ(get(c, "from-other", GetMode::kRead), "yes");
      });
}

TEST_P(KvTest, GrowthIsLearntThroughTheEpoch) {
  run_roles(
      GetParam(), [](RoleEnv& env) { serve(env, 2, {.capacity = 8, .blocks = 1}); },
      [](RoleEnv& env) {
        Client reader(client_options(env));  // holds the first table
        Client writer(client_options(env));
        const uint32_t first_epoch = reader.table().epoch;
        ASSERT_EQ(writer.put("early", "v0"), KvStatus::kOk);
        EXPECT_EQ(get(reader, "early", GetMode::kRead), "v0");
        for (int i = 0; i < 600; ++i) {
          const std::string v =
              i % 50 == 0 ? std::string(2000, char('a' + i % 26)) : std::to_string(i);
          ASSERT_EQ(writer.put(cat("k", i), v), KvStatus::kOk) << i;
        }
        ASSERT_EQ(writer.put("early", "v1"), KvStatus::kOk);
        // The reader READs its old table, finds it moved, fetches the new one.
        EXPECT_EQ(get(reader, "early", GetMode::kRead), "v1");
        EXPECT_GT(reader.table().epoch, first_epoch);
        EXPECT_GE(reader.read_stats().table_moves, 1u);
        for (int i = 0; i < 600; ++i) {
          const std::string v =
              i % 50 == 0 ? std::string(2000, char('a' + i % 26)) : std::to_string(i);
          ASSERT_EQ(get(reader, cat("k", i), GetMode::kRead), v) << i;
        }
      });
}

TEST_P(KvTest, FullTableRefusesClearlyAndStaysIntact) {
  run_roles(
      GetParam(),
      [](RoleEnv& env) { serve(env, 1, {.capacity = 8, .blocks = 1, .grow = false}); },
      [](RoleEnv& env) {
        Client c(client_options(env));
        int stored = 0;
        std::string why;
        KvStatus s = KvStatus::kOk;
        for (int i = 0; i < 1000 && s == KvStatus::kOk; ++i) {
          s = c.put(std::to_string(i), v_of(i), &why);
          if (s == KvStatus::kOk) ++stored;
        }
        ASSERT_EQ(s, KvStatus::kTableFull);
        EXPECT_NE(why.find("table full"), std::string::npos) << why;
        EXPECT_NE(why.find("growth disabled"), std::string::npos) << why;
        for (int i = 0; i < stored; ++i)
          EXPECT_EQ(get(c, std::to_string(i), GetMode::kRead), v_of(i));
        ASSERT_EQ(c.put("0", std::string(1000, 'x')),
                  KvStatus::kOk);  // takes the one block
        EXPECT_EQ(c.put("1", std::string(1000, 'y'), &why), KvStatus::kTableFull);
        EXPECT_NE(why.find("blocks"), std::string::npos) << why;
        EXPECT_EQ(get(c, "1", GetMode::kRead), "v1");
        EXPECT_EQ(get(c, "0", GetMode::kRpc), std::string(1000, 'x'));
      });
}

TEST_P(KvTest, HostileClientGetsErrorsAndTheServerStaysIntact) {
  run_roles(
      GetParam(), [](RoleEnv& env) { serve(env, 4); },
      [](RoleEnv& env) {
        Client good(client_options(env));
        ASSERT_EQ(good.put("keep", "me"), KvStatus::kOk);
        {
          RawClient raw(env);
          raw.login(*test_secret());
          std::vector<std::byte> buf(kMaxRequest);
          std::string why;
          auto expect_error = [&](std::span<const std::byte> bytes, KvStatus want) {
            auto r = raw.send(bytes, &why);
            ASSERT_TRUE(r) << "no reply";
            EXPECT_EQ(r->status, want) << kv_status_name(r->status) << ": " << why;
            EXPECT_FALSE(why.empty());
          };
          expect_error(std::span(buf).first(3), KvStatus::kMalformed);  // short
          size_t n = encode_request(buf, Op::kPut, 1, "keep", "overwritten?");
          expect_error(std::span(buf).first(n - 3), KvStatus::kMalformed);  // lengths lie
          expect_error(std::span(buf).first(n + 5), KvStatus::kMalformed);
          n = encode_request(buf, static_cast<Op>(77), 2, "keep", "");
          expect_error(std::span(buf).first(n), KvStatus::kUnknownOp);
          n = encode_request(buf, Op::kPut, 3, std::string(300, 'k'), "v");
          expect_error(std::span(buf).first(n), KvStatus::kKeyTooLong);
          n = encode_request(buf, Op::kDel, 4, "keep", "junk");
          expect_error(std::span(buf).first(n), KvStatus::kMalformed);
          n = encode_request(buf, Op::kPut, 5, "keep", "x");
          buf[0] = std::byte{0x42};  // bad magic
          expect_error(std::span(buf).first(n), KvStatus::kMalformed);
          // A well-formed request on the same connection still works.
          n = encode_request(buf, Op::kGet, 6, "keep", "");
          auto r = raw.send(std::span(buf).first(n), &why);
          ASSERT_TRUE(r);
          EXPECT_EQ(r->status, KvStatus::kOk);
          EXPECT_EQ(why, "me");
          // A READ outside the table fails on this client's QP only.
          raw.qp->post_send(
              {.wr_id = 9,
               .opcode = Opcode::kRead,
               .flags = kSignaled,
               .length = 64,
               .local_addr = raw.mr->data(),
               .lkey = raw.mr->lkey(),
               .remote_addr = raw.table.region.addr + raw.table.region.length,
               .rkey = raw.table.region.rkey});
          Completion c;
          ASSERT_TRUE(rdmakit::test::wait_one(*raw.cq, &c));
          EXPECT_EQ(c.status, Status::kRemoteAccessError);
        }
        {
          // A message larger than the server's receive buffer: that client's
          // connection fails (verbs semantics), nobody else's.
          RawClient raw(env);
          raw.login(*test_secret());
          std::vector<std::byte> huge(kMaxRequest + 512);
          const size_t n = encode_request(huge, Op::kPut, 1, "keep", "x");
          (void)n;
          std::string why;
          EXPECT_FALSE(raw.send(huge, &why));
        }
        EXPECT_EQ(get(good, "keep", GetMode::kRpc), "me");
        EXPECT_EQ(get(good, "keep", GetMode::kRead), "me");
        Client fresh(client_options(env));
        EXPECT_EQ(get(fresh, "keep", GetMode::kRead), "me");
      });
}

TEST_P(KvTest, ServerKilledMidBenchFailsClientsClearly) {
  run_roles(
      GetParam(),
      [](RoleEnv& env) {
        Server server(server_options(env));
        env.publish_port(server.port());
        std::atomic<bool> stop{false};
        // Serve for a moment, then die without closing anything.
        std::thread killer([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(600));
          std::fflush(nullptr);
          ::raise(SIGKILL);
        });
        server.run(stop);
        killer.join();
      },
      [](RoleEnv& env) {
        ClientOptions co = client_options(env);
        co.timeout = std::chrono::seconds(4);
        Client c(co);
        const auto t0 = Clock::now();
        std::string error;
        uint64_t ops = 0;
        try {
          std::string v;
          for (; Clock::now() - t0 < std::chrono::seconds(30); ++ops) {
            ASSERT_EQ(c.put(std::to_string(ops % 100), "v"), KvStatus::kOk);
            c.get(std::to_string(ops % 100), &v,
                  ops % 2 ? GetMode::kRead : GetMode::kRpc);
          }
        } catch (const ClientError& e) {
          error = e.what();
        }
        const auto took = Clock::now() - t0;
        ASSERT_FALSE(error.empty()) << "the server's death was never reported";
        EXPECT_GT(ops, 0u);
        EXPECT_LT(took, std::chrono::seconds(12));
        EXPECT_NE(error.find("rdmakit-kv"), std::string::npos) << error;
        EXPECT_NE(error.find(env.provider()), std::string::npos) << error;
        std::printf("[ kv      ] %s: after %lu ops: %s\n", env.provider().c_str(),
                    static_cast<unsigned long>(ops), error.c_str());
        // Later calls fail at once with the same error, they do not hang.
        std::string v;
        EXPECT_THROW(c.get("1", &v, GetMode::kRpc), ClientError);
      },
      {.server_may_be_killed = true});
}

}  // namespace
}  // namespace rdmakit::kv::test
