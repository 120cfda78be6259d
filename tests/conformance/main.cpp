// Prints the harness configuration so a two-host run shows what it agreed on.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "harness.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const auto& config = rdmakit::test::HarnessConfig::get();
  std::string providers;
  for (const auto& p : config.providers) providers += (providers.empty() ? "" : ",") + p;
  const char* mode = config.mode == rdmakit::test::RoleMode::kFork     ? "fork"
                     : config.mode == rdmakit::test::RoleMode::kServer ? "server"
                                                                       : "client";
  std::printf(
      "rdmakit conformance: providers=%s role=%s host=%s base_port=%s%s%s\n",
      providers.c_str(), mode, config.host.c_str(),
      config.base_port != 0 ? std::to_string(config.base_port).c_str() : "ephemeral",
      config.server_netns.empty() ? "" : " server_netns=", config.server_netns.c_str());
  return RUN_ALL_TESTS();
}
