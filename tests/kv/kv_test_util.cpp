#include "kv_test_util.hpp"

#include <xxhash.h>

#include <cstdio>
#include <sstream>

#include "fmt/format.h"

namespace rdmakit::kv::test {

std::vector<std::string> kv_providers() {
  const char* env = std::getenv("RDMAKIT_KV_TEST_PROVIDERS");
  std::string list = env != nullptr && *env != '\0' ? env : "shm,tcp";
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

namespace {

std::shared_ptr<const auth::Secret> secret_from(const char* name, const char* fallback) {
  setenv(name, fallback, /*overwrite=*/0);
  auto s = auth::Secret::from_env(name);
  return s ? std::make_shared<const auth::Secret>(std::move(*s)) : nullptr;
}

}  // namespace

std::shared_ptr<const auth::Secret> test_secret() {
  static const auto secret =
      secret_from("RDMAKIT_KV_TEST_SECRET", "rdmakit-kv test secret 0123456789");
  return secret;
}

std::shared_ptr<const auth::Secret> wrong_secret() {
  static const auto secret =
      secret_from("RDMAKIT_KV_TEST_WRONG_SECRET", "rdmakit-kv WRONG secret 987654321");
  return secret;
}

ServerOptions server_options(rdmakit::test::RoleEnv& env) {
  ServerOptions o;
  o.address = env.listen_address();
  o.provider = env.kind();
  o.quiet = true;
  o.secret = test_secret();
  return o;
}

void serve(rdmakit::test::RoleEnv& env, ServerOptions options) {
  Server server(options);
  env.publish_port(server.port());
  std::atomic<bool> stop{false};
  server.run(stop);
}

void serve(rdmakit::test::RoleEnv& env, int clients, TableOptions table, bool busy_poll) {
  ServerOptions o = server_options(env);
  o.busy_poll = busy_poll;
  o.table = table;
  o.exit_after_clients = clients;
  serve(env, o);
}

ClientOptions client_options(rdmakit::test::RoleEnv& env) {
  ClientOptions o;
  o.address = env.server_address();
  o.provider = env.kind();
  o.timeout = rdmakit::test::scaled(std::chrono::seconds(10));
  o.secret = test_secret();
  return o;
}

std::string checked_value(uint64_t key, uint64_t n, size_t filler) {
  std::string v = fmt::format("k={};n={};", key, n);
  for (size_t i = 0; i < filler; ++i) v.push_back(static_cast<char>('a' + (n + i) % 26));
  v += fmt::format(";{:016x}", XXH3_64bits(v.data(), v.size()));
  return v;
}

bool parse_checked(const std::string& value, uint64_t* key, uint64_t* n) {
  if (value.size() < 17 || value[value.size() - 17] != ';') return false;
  const std::string body = value.substr(0, value.size() - 17);
  if (fmt::format("{:016x}", XXH3_64bits(body.data(), body.size())) !=
      value.substr(value.size() - 16))
    return false;
  unsigned long long k = 0;
  unsigned long long m = 0;
  if (std::sscanf(body.c_str(), "k=%llu;n=%llu;", &k, &m) != 2) return false;
  *key = k;
  *n = m;
  return true;
}

}  // namespace rdmakit::kv::test
