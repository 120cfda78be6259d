#pragma once
// Shared pieces of the kv tests: the providers under test, a server role and
// values that carry their own checksum.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "client.hpp"
#include "harness.hpp"
#include "server.hpp"

namespace rdmakit::kv::test {

// RDMAKIT_KV_TEST_PROVIDERS (comma list), default "shm,tcp".
std::vector<std::string> kv_providers();

// The secret the kv tests' servers and clients share (RDMAKIT_KV_TEST_SECRET,
// set to a fixed test value if unset): every kv test runs authenticated.
std::shared_ptr<const auth::Secret> test_secret();
// Another secret of the same length, for the wrong-secret cases.
std::shared_ptr<const auth::Secret> wrong_secret();

// A server on the harness's address with the test secret, quiet.
ServerOptions server_options(rdmakit::test::RoleEnv& env);

// Runs a Server on the harness's address until `clients` connections came
// and went.
void serve(rdmakit::test::RoleEnv& env, int clients, TableOptions table = {},
           bool busy_poll = false);
void serve(rdmakit::test::RoleEnv& env, ServerOptions options);

// A client of the harness's server with the test secret.
ClientOptions client_options(rdmakit::test::RoleEnv& env);

// "k=<key>;n=<n>;<filler>;<16 hex digits of xxh3 of what precedes>". The
// filler length varies with n so entries move between inline and block form.
std::string checked_value(uint64_t key, uint64_t n, size_t filler);
// Parses and verifies a checked value; false if torn or malformed.
bool parse_checked(const std::string& value, uint64_t* key, uint64_t* n);

}  // namespace rdmakit::kv::test
