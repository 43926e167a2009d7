// Two engines in one process connected over loopback, with registered buffers on each side.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "ferry/ferry.hpp"

namespace ferry::test {

using namespace std::chrono_literals;
constexpr Duration kWait = 20s;  // generous: sanitizer builds on 2 cores are slow

inline Config test_config() {
  Config c;
  c.listen_host = "127.0.0.1";
  c.peer_timeout = 5s;
  c.connect_timeout = 5s;
  c.busy_poll = 0us;  // sanitizer runs share 2 cores; spinning only slows them down
  c.wait_spin = 0us;
  return c;
}

// Pseudo-random bytes, four at a time (sanitizer builds make byte loops slow).
inline void fill_pattern(uint8_t* p, std::size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    std::memcpy(p + i, &x, 4);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(x >> (8 * (i % 4)));
}
inline void fill_pattern(std::vector<uint8_t>& v, uint32_t seed) {
  fill_pattern(v.data(), v.size(), seed);
}

// A patterned buffer registered with an engine.
struct Buffer {
  Buffer(Engine& e, std::size_t n, Access access, uint32_t seed) : bytes(n) {
    fill_pattern(bytes, seed);
    region = e.register_memory(bytes.data(), n, access);
  }
  std::vector<uint8_t> bytes;
  Region region;
};

struct Pair {
  explicit Pair(Config target_config = test_config(), Config initiator_config = test_config())
      : target(target_config), initiator(initiator_config) {
    peer = initiator.connect(target.address());
    auto accepted = target.accept(kWait);
    if (!accepted) throw Error(ErrorCode::kTimeout, "target did not accept");
    target_peer = *accepted;
  }
  Engine target;
  Engine initiator;
  Peer peer;         // initiator -> target
  Peer target_peer;  // target -> initiator
};

// A scattered batch (odd sizes and offsets, one entry over the slice size) prepared once and
// posted again and again: each post moves the bytes there at the time; posts may overlap; the
// checks of write() apply when preparing; a local region deregistered since fails the post.
inline void expect_prepared_transfers(Pair& p) {
  constexpr uint64_t kSize = 3 << 20;
  Buffer src(p.initiator, kSize, Access::kLocal, 40);
  Buffer back(p.initiator, kSize, Access::kLocal, 41);
  Buffer remote(p.target, kSize, Access::kRemoteReadWrite, 42);
  Descriptor d = remote.region.descriptor();
  struct Range {
    uint64_t local, remote, length;
  };
  const Range ranges[] = {{1, 7, 5}, {4099, 8192, 100000}, {1 << 20, (1 << 20) + 3, (2 << 20) - 8}};
  std::vector<Transfer> out, in;
  for (const Range& r : ranges) {
    out.push_back({&src.region, r.local, &d, r.remote, r.length});
    in.push_back({&back.region, r.local, &d, r.remote, r.length});
  }
  Prepared write = p.peer.prepare_write(out);
  Prepared read = p.peer.prepare_read(in);
  for (uint32_t round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    fill_pattern(src.bytes, 50 + round);
    ASSERT_TRUE(write.post().wait(kWait).ok());
    ASSERT_TRUE(read.post().wait(kWait).ok());
    for (const Range& r : ranges) {
      ASSERT_EQ(0,
                std::memcmp(src.bytes.data() + r.local, remote.bytes.data() + r.remote, r.length));
      ASSERT_EQ(0, std::memcmp(src.bytes.data() + r.local, back.bytes.data() + r.local, r.length));
    }
  }
  Future first = write.post(), second = write.post();
  EXPECT_TRUE(first.wait(kWait).ok());
  EXPECT_TRUE(second.wait(kWait).ok());
  EXPECT_EQ(second.bytes(), 5u + 100000u + (2u << 20) - 8u);

  Prepared notify = p.peer.prepare_write_with_imm(out, 77);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(notify.post().wait(kWait).ok());
    auto ev = p.target.next_imm(kWait);
    ASSERT_TRUE(ev.has_value());
    EXPECT_EQ(ev->imm, 77u);
  }

  Transfer beyond{&src.region, 0, &d, kSize - 4, 8};
  try {
    p.peer.prepare_write({&beyond, 1});
    ADD_FAILURE() << "an out-of-bounds batch was prepared";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfBounds) << e.what();
  }

  Buffer gone(p.initiator, 4096, Access::kLocal, 43);
  Transfer from_gone{&gone.region, 0, &d, 0, 4096};
  Prepared stale = p.peer.prepare_write({&from_gone, 1});
  std::vector<uint8_t> before(remote.bytes.begin(), remote.bytes.begin() + 4096);
  gone.region.deregister();
  Status s = stale.post().wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kRevoked) << s.to_string();
  EXPECT_TRUE(std::equal(before.begin(), before.end(), remote.bytes.begin()));
  EXPECT_THROW(Prepared().post(), Error);
  // A closed peer fails the post at once.
  p.peer.close();
  Status closed = write.post().wait(std::chrono::milliseconds(100));
  EXPECT_EQ(closed.code(), ErrorCode::kPeerLost) << closed.to_string();
}

// write_with_imm of `len` bytes, three rounds: at the moment each notification is seen, every
// byte must already be in the target's memory; one notification per operation.
inline void expect_imm_after_every_byte(Pair& p, uint64_t len, uint32_t first_imm) {
  Buffer local(p.initiator, len, Access::kLocal, first_imm);
  Buffer remote(p.target, len, Access::kRemoteWrite, first_imm + 1);
  Descriptor d = remote.region.descriptor();
  for (uint32_t round = 0; round < 3; ++round) {
    fill_pattern(local.bytes, first_imm + 100 + round);
    Transfer t{&local.region, 0, &d, 0, len};
    Future f = p.peer.write_with_imm({&t, 1}, first_imm + round);
    auto ev = p.target.next_imm(kWait);
    ASSERT_TRUE(ev.has_value());
    EXPECT_EQ(ev->imm, first_imm + round);
    EXPECT_EQ(ev->peer_engine_id, p.initiator.id());
    // Named by the connection it came on, not only by the id that peer claimed.
    EXPECT_EQ(ev->peer.incarnation(), p.initiator.incarnation());
    EXPECT_EQ(ev->peer.address(), p.target_peer.address());
    // Before the initiator's future completes.
    ASSERT_EQ(0, std::memcmp(local.bytes.data(), remote.bytes.data(), len)) << round;
    ASSERT_TRUE(f.wait(kWait).ok());
  }
  EXPECT_FALSE(p.target.next_imm(std::chrono::milliseconds(100)).has_value())
      << "one notification per op";
}

}  // namespace ferry::test
