// The slot records' parser: bounds on what a peer declares.
#include "records.hpp"

#include <gtest/gtest.h>

#include "protocol.hpp"
#include "report.hpp"
#include "tree.hpp"

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

namespace rdmakit::cp {
namespace {

TEST(CpRecords, HelloRoundTrips) {
  Request r;
  r.version = kProtocolVersion;
  r.op = static_cast<uint8_t>(Op::kPush);
  r.paths = {".", "1"};
  r.sync = kSyncDelete | kSyncChecksum;
  r.filters = {std::byte{1}, std::byte{2}};
  r.partial_dir = ".part";
  r.bwlimit = 4096;
  Writer w = message(Msg::kHello);
  encode_request(r, &w);
  Request back;
  ASSERT_EQ(parse_request(w.data(), &back), Parsed::kOk);
  EXPECT_EQ(back.sync, r.sync);
  EXPECT_EQ(back.filters, r.filters);
  EXPECT_EQ(back.partial_dir, ".part");
  EXPECT_EQ(back.bwlimit, 4096u);
}

TEST(CpRecords, HelloRefusesAPartialDirThatLeads) {
  for (const char* bad : {"a/b", "..", "."}) {
    Request r;
    r.version = kProtocolVersion;
    r.op = static_cast<uint8_t>(Op::kPull);
    r.paths = {"x"};
    r.partial_dir = bad;
    Writer w = message(Msg::kHello);
    encode_request(r, &w);
    Request back;
    EXPECT_EQ(parse_request(w.data(), &back), Parsed::kMalformed) << bad;
  }
}

TEST(CpRecords, EntryWithEveryPartRoundTrips) {
  EntryRecord e;
  e.id = 9;
  e.kind = static_cast<uint8_t>(Kind::kFile);
  e.size = 3 * kBlockSize;
  e.path = "t/f";
  e.flags = kEntryOwner | kEntryXattrs | kEntryBasisFinal | kEntryChecksum;
  e.uid = 7;
  e.user = "daemon";
  e.xattrs = {std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0}};
  e.sent = {true, false, true};
  e.checksum = 42;
  Writer w;
  encode_entry(e, &w);
  Reader rd(w.data());
  EntryRecord back;
  std::string why;
  ASSERT_EQ(parse_entry(rd, &back, &why), Parsed::kOk) << why;
  EXPECT_TRUE(rd.at_end());
  EXPECT_EQ(back.sent, e.sent);
  EXPECT_EQ(back.user, "daemon");
  EXPECT_EQ(back.checksum, 42u);
}

TEST(CpRecords, BasisBitmapMustMatchTheSize) {
  EntryRecord e;
  e.kind = static_cast<uint8_t>(Kind::kFile);
  e.size = 3 * kBlockSize;
  e.path = "f";
  e.flags = kEntryBasisPart;
  e.sent = {true, true};  // two bits for three blocks: a lying sender
  Writer w;
  encode_entry(e, &w);
  Reader rd(w.data());
  EntryRecord back;
  std::string why;
  EXPECT_EQ(parse_entry(rd, &back, &why), Parsed::kMalformed);
}

}  // namespace
}  // namespace rdmakit::cp

namespace rdmakit::cp {
namespace {

TEST(CpPrintable, EscapesControlBytesOnly) {
  EXPECT_EQ(printable("a b/c.txt"), "a b/c.txt");
  EXPECT_EQ(printable("x\033[2Jy"), "x\\#033[2Jy");
  EXPECT_EQ(printable("nl\n"), "nl\\#012");
  EXPECT_EQ(printable(printable("\x7f")), "\\#177");
}

}  // namespace
}  // namespace rdmakit::cp
