// The slot records' parser: bounds on what a peer declares.
#include <gtest/gtest.h>

#include "protocol.hpp"
#include "records.hpp"

namespace rdmakit::cp {
namespace {

TEST(CpRecords, EntryRoundTrips) {
  Writer w;
  w.put<uint32_t>(7).put<uint8_t>(static_cast<uint8_t>(Kind::kFile)).put<uint32_t>(0644);
  w.put<int64_t>(1700000000).put<uint32_t>(5).put<uint64_t>(123);
  w.str("dir/a").str("").put<uint8_t>(0);
  Reader rd(w.data());
  EntryRecord e;
  std::string why;
  ASSERT_EQ(parse_entry(rd, &e, &why), Parsed::kOk) << why;
  EXPECT_EQ(e.id, 7u);
  EXPECT_EQ(e.size, 123u);
  EXPECT_EQ(e.path, "dir/a");
}

TEST(CpRecords, TruncatedEntryIsMalformed) {
  Writer w;
  w.put<uint32_t>(7).put<uint8_t>(static_cast<uint8_t>(Kind::kFile));
  Reader rd(w.data());
  EntryRecord e;
  std::string why;
  EXPECT_EQ(parse_entry(rd, &e, &why), Parsed::kMalformed);
}

}  // namespace
}  // namespace rdmakit::cp
