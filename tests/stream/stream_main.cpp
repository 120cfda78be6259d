// The main of the two-process stream suites: streams are tested on both
// software providers unless RDMAKIT_TEST_PROVIDERS says otherwise.
#include <gtest/gtest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  ::setenv("RDMAKIT_TEST_PROVIDERS", "shm,tcp", 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
