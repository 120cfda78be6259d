// The session suite runs on shm and tcp unless RDMAKIT_TEST_PROVIDERS says
// otherwise (the verbs VMs set it to verbs).
#include <gtest/gtest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  setenv("RDMAKIT_TEST_PROVIDERS", "shm,tcp", 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
