// Misuse and bad input, the same cases for every transport (tests/conformance/conformance.hpp):
// every failure is typed, names the entry, and changes nothing remotely.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "conformance/conformance.hpp"

namespace ferry::test {
namespace {

class ConformanceErrors : public Conformance {
 protected:
  void SetUp() override {
    Conformance::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    fill_pattern(local_buf, 1);
    remote =
        pair().target.register_memory(remote_buf.data(), remote_buf.size(), Access::kRemoteWrite);
    local = pair().initiator.register_memory(local_buf.data(), local_buf.size(), Access::kLocal);
    desc = remote.descriptor();
  }
  Status write(const Descriptor& d, uint64_t roff, uint64_t len, uint64_t loff = 0) {
    Transfer t{&local, loff, &d, roff, len};
    return pair().peer.write({&t, 1}).wait(kWait);
  }
  bool remote_untouched() const {
    return std::all_of(remote_buf.begin(), remote_buf.end(), [](uint8_t b) { return b == 0; });
  }

  std::vector<uint8_t> local_buf = std::vector<uint8_t>(8192);
  std::vector<uint8_t> remote_buf = std::vector<uint8_t>(4096);
  Region local, remote;
  Descriptor desc;
};

TEST_P(ConformanceErrors, OutOfBoundsIsRefusedByTheInitiator) {
  Status s = write(desc, 4000, 200);
  EXPECT_EQ(s.code(), ErrorCode::kOutOfBounds);
  EXPECT_NE(s.message().find("write entry 0"), std::string::npos) << s.message();
  EXPECT_EQ(write(desc, ~0ull - 1, 4).code(), ErrorCode::kOutOfBounds);
  EXPECT_EQ(write(desc, 0, 16, 8190).code(), ErrorCode::kOutOfBounds) << "local bounds";
  EXPECT_TRUE(remote_untouched());
}

TEST_P(ConformanceErrors, TargetValidatesEvenWhenTheDescriptorLies) {
  // A forged descriptor claiming more length and more rights passes the initiator's checks;
  // the target must still refuse, and write nothing.
  if (nic_served()) {
    // The NIC checks what the region granted; its refusal fails the queue pair with the op
    // (Verbs.TheNicRefuses* tests what follows).
    Descriptor more_rights = desc;
    more_rights.access = Access::kRemoteReadWrite;
    Transfer t{&local, 0, &more_rights, 0, 64};
    Status r = pair().peer.read({&t, 1}).wait(kWait);
    EXPECT_EQ(r.code(), ErrorCode::kPermissionDenied) << r.to_string();
    EXPECT_NE(r.message().find("work completion"), std::string::npos) << r.message();
    EXPECT_TRUE(remote_untouched());
    return;
  }
  Descriptor forged = desc;
  forged.length = 1 << 20;
  Status s = write(forged, 4000, 4096);
  EXPECT_EQ(s.code(), ErrorCode::kOutOfBounds) << s.to_string();
  EXPECT_NE(s.message().find("exceeds"), std::string::npos) << s.message();

  forged = desc;
  forged.access = Access::kRemoteReadWrite;
  Transfer t{&local, 0, &forged, 0, 64};
  Status r = pair().peer.read({&t, 1}).wait(kWait);
  EXPECT_EQ(r.code(), ErrorCode::kPermissionDenied) << r.to_string();

  forged = desc;
  forge_key(forged, GetParam());
  EXPECT_EQ(write(forged, 0, 64).code(), ErrorCode::kWrongKey);

  forged = desc;
  forged.region_id += 1;
  EXPECT_EQ(write(forged, 0, 64).code(), ErrorCode::kUnknownRegion);
  EXPECT_TRUE(remote_untouched());
}

TEST_P(ConformanceErrors, MissingPermissionIsRefusedAtOnce) {
  Transfer t{&local, 0, &desc, 0, 64};
  Status s = pair().peer.read({&t, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kPermissionDenied);
  EXPECT_NE(s.message().find("remote read"), std::string::npos) << s.message();
}

TEST_P(ConformanceErrors, ARevokedRegionIsRefused) {
  ASSERT_TRUE(write(desc, 0, 64).ok());
  remote.deregister();
  std::fill(remote_buf.begin(), remote_buf.end(), 0);
  Status s = write(desc, 0, 64);
  if (nic_served()) {
    EXPECT_EQ(s.code(), ErrorCode::kPermissionDenied) << s.to_string();  // the rkey is gone
  } else {
    EXPECT_TRUE(s.code() == ErrorCode::kRevoked || s.code() == ErrorCode::kUnknownRegion)
        << s.to_string();
  }
  EXPECT_TRUE(remote_untouched());
}

TEST_P(ConformanceErrors, DescriptorOfAnotherEngineOrIncarnationIsRejected) {
  Descriptor stale = desc;
  stale.incarnation ^= 1;
  EXPECT_EQ(write(stale, 0, 8).code(), ErrorCode::kStaleIncarnation);
  Descriptor other = desc;
  other.engine_id ^= 1;
  EXPECT_EQ(write(other, 0, 8).code(), ErrorCode::kWrongPeer);
  Transfer no_remote{&local, 0, nullptr, 0, 8};
  EXPECT_EQ(pair().peer.write({&no_remote, 1}).wait(kWait).code(), ErrorCode::kInvalidArgument);
  Transfer no_local{nullptr, 0, &desc, 0, 8};
  EXPECT_EQ(pair().peer.write({&no_local, 1}).wait(kWait).code(), ErrorCode::kInvalidArgument);
  // A region of another engine cannot be used as the local side.
  Transfer foreign{&remote, 0, &desc, 0, 8};
  EXPECT_EQ(pair().peer.write({&foreign, 1}).wait(kWait).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(remote_untouched());
}

TEST_P(ConformanceErrors, OneBadEntryFailsTheBatchBeforeAnythingIsSent) {
  std::vector<Transfer> batch;
  for (int i = 0; i < 10; ++i)
    batch.push_back({&local, 0, &desc, static_cast<uint64_t>(i) * 64, 64});
  batch.push_back({&local, 0, &desc, 4090, 64});
  Status s = pair().peer.write(batch).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kOutOfBounds);
  EXPECT_NE(s.message().find("entry 10"), std::string::npos) << s.message();
  EXPECT_TRUE(remote_untouched());
}

TEST_P(ConformanceErrors, EmptyBatchSucceeds) {
  EXPECT_TRUE(pair().peer.write({}).wait(kWait).ok());
  Transfer zero{&local, 0, &desc, 0, 0};
  EXPECT_TRUE(pair().peer.write({&zero, 1}).wait(kWait).ok());
}

INSTANTIATE_TEST_SUITE_P(Transports, ConformanceErrors, ::testing::ValuesIn(registered_kinds()),
                         transport_case_name);

}  // namespace
}  // namespace ferry::test
