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

// Runs a Server on the harness's address until `clients` connections came
// and went.
void serve(rdmakit::test::RoleEnv& env, int clients, TableOptions table = {},
           bool busy_poll = false);

ClientOptions client_options(rdmakit::test::RoleEnv& env);

// "k=<key>;n=<n>;<filler>;<16 hex digits of xxh3 of what precedes>". The
// filler length varies with n so entries move between inline and block form.
std::string checked_value(uint64_t key, uint64_t n, size_t filler);
// Parses and verifies a checked value; false if torn or malformed.
bool parse_checked(const std::string& value, uint64_t* key, uint64_t* n);

}  // namespace rdmakit::kv::test
