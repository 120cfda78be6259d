#pragma once
// Shared fixture of the provider conformance suite: every case is written
// once, instantiated for each provider in RDMAKIT_TEST_PROVIDERS, and runs as
// a server process and client process(es) (see support/harness.hpp).
#include <gtest/gtest.h>

#include "harness.hpp"
#include "helpers.hpp"
#include "rdmakit/rdmakit.hpp"

namespace rdmakit::test {

class ProviderTest : public ::testing::TestWithParam<std::string> {
 protected:
  void run(const RoleFn& server, const RoleFn& client, const RunOptions& options = {}) {
    run_roles(GetParam(), server, client, options);
  }
};

}  // namespace rdmakit::test

// Instantiates a ProviderTest-derived suite once per provider under test.
#define RDMAKIT_INSTANTIATE_PROVIDERS(suite)                                        \
  INSTANTIATE_TEST_SUITE_P(                                                         \
      Providers, suite, ::testing::ValuesIn(::rdmakit::test::providers_from_env()), \
      [](const ::testing::TestParamInfo<std::string>& info) { return info.param; })
