// The same-host channel's rings: records in order and byte-exact across wraps, back-pressure,
// the bell's once-per-wake rule, and a producer that scribbles on the shared memory.
#include "transport/shm/shm_ring.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include "transport/shm/shm_wire.hpp"

namespace ferry::transport::shm {
namespace {

// A consumer's ring and a producer opened on its file, as the peer would.
struct Pair {
  Pair() {
    EXPECT_TRUE(Ring::create(consumer).ok());
    core::Fd copy(::fcntl(consumer.file(), F_DUPFD_CLOEXEC, 0));
    EXPECT_TRUE(Ring::open(std::move(copy), producer).ok());
  }
  Ring consumer, producer;
};

uint8_t pattern(uint64_t record, std::size_t i) { return static_cast<uint8_t>(record * 31 + i); }

TEST(ShmRing, RecordsArriveInOrderAndByteExactAcrossManyWrapsFromAnotherThread) {
  Pair p;
  constexpr uint64_t kRecords = 20000;
  // Lengths from 1 byte to the largest record, so that records end everywhere in the ring.
  auto length = [](uint64_t r) { return 1 + (r * 7919) % kMaxRecordBytes; };
  std::thread producer([&] {
    std::vector<uint8_t> bytes(kMaxRecordBytes);
    for (uint64_t r = 0; r < kRecords; ++r) {
      std::size_t n = length(r);
      for (std::size_t i = 0; i < n; ++i) bytes[i] = pattern(r, i);
      std::size_t head = std::min<std::size_t>(n, 5);  // in two parts, as header and payload
      while (!p.producer.write({bytes.data(), head}, {bytes.data() + head, n - head})) {
        std::this_thread::yield();
      }
    }
  });
  std::vector<uint8_t> in(kMaxRecordBytes);
  for (uint64_t r = 0; r < kRecords;) {
    std::size_t n = 0;
    ASSERT_TRUE(p.consumer.read(in, n).ok());
    if (n == 0) continue;
    ASSERT_EQ(n, length(r)) << "record " << r;
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(in[i], pattern(r, i)) << r << " at " << i;
    ++r;
  }
  producer.join();
  std::size_t n = 1;
  EXPECT_TRUE(p.consumer.read(in, n).ok());
  EXPECT_EQ(n, 0u);
  EXPECT_FALSE(p.consumer.pending());
}

// A polling producer sees room as soon as the consumer reads on; one that sleeps is rung once.
TEST(ShmRing, AFullRingRefusesWholeRecordsAndTheConsumerIsAskedForRoomOnce) {
  Pair p;
  std::vector<uint8_t> record(kMaxRecordBytes, 7);
  int written = 0;
  while (p.producer.write(record)) ++written;
  EXPECT_GE(written, 4);
  EXPECT_FALSE(p.producer.write(record));  // still full: nothing half written
  EXPECT_FALSE(p.producer.room_freed());
  std::vector<uint8_t> in(kMaxRecordBytes);
  std::size_t n = 0;
  ASSERT_TRUE(p.consumer.read(in, n).ok());
  EXPECT_EQ(n, record.size());
  EXPECT_TRUE(p.producer.room_freed()) << "the consumer read on: room before it says so";
  EXPECT_TRUE(p.consumer.room_wanted());
  EXPECT_TRUE(p.producer.room_freed());
  EXPECT_FALSE(p.consumer.room_wanted());  // the producer's bell rings once
  EXPECT_TRUE(p.producer.write(record));
  for (int i = 0; i < written; ++i) {
    ASSERT_TRUE(p.consumer.read(in, n).ok());
    EXPECT_EQ(n, record.size());
    EXPECT_EQ(in[0], 7);
  }
  ASSERT_TRUE(p.consumer.read(in, n).ok());
  EXPECT_EQ(n, 0u);
}

// A sleeping producer learns of room from the request's answer alone (its bell's reason).
TEST(ShmRing, TakingTheRequestForRoomTellsTheProducer) {
  Pair p;
  std::vector<uint8_t> record(kMaxRecordBytes, 3);
  while (p.producer.write(record)) {
  }
  EXPECT_FALSE(p.producer.room_freed());
  EXPECT_TRUE(p.consumer.room_wanted());
  EXPECT_TRUE(p.producer.room_freed()) << "the request was taken";
  EXPECT_FALSE(p.producer.write(record)) << "yet nothing was read: still full";
  EXPECT_FALSE(p.producer.room_freed()) << "asked again";
}

// A record read in place (peek) keeps its room until it is released: the producer cannot
// overwrite the bytes being copied out of it.
TEST(ShmRing, APeekedRecordKeepsItsRoomUntilReleased) {
  Pair p;
  std::vector<uint8_t> record(kMaxRecordBytes);
  for (std::size_t i = 0; i < record.size(); ++i) record[i] = pattern(1, i);
  while (p.producer.write(record)) {
  }
  const uint8_t* at = nullptr;
  std::size_t n = 0;
  ASSERT_TRUE(p.consumer.peek(kMaxRecordBytes, at, n).ok());
  ASSERT_EQ(n, record.size());
  EXPECT_EQ(0, std::memcmp(at, record.data(), n));
  EXPECT_FALSE(p.producer.write(record)) << "the shown record's room was given back";
  p.consumer.release();
  EXPECT_TRUE(p.producer.write(record));
  // Larger than the caller takes: a protocol error, nothing shown.
  Status s = p.consumer.peek(kMaxRecordBytes - 1, at, n);
  EXPECT_EQ(s.code(), ErrorCode::kProtocol) << s.to_string();
  EXPECT_EQ(n, 0u);
}

TEST(ShmRing, TheBellRingsOncePerWakeAndNotWhileAThreadPolls) {
  Pair p;
  const uint8_t byte = 1;
  ASSERT_TRUE(p.producer.write({&byte, 1}));
  EXPECT_TRUE(p.producer.wake_needed());
  ASSERT_TRUE(p.producer.write({&byte, 1}));
  EXPECT_FALSE(p.producer.wake_needed());  // one is on its way
  p.consumer.woken();
  p.consumer.poll_begin();
  ASSERT_TRUE(p.producer.write({&byte, 1}));
  EXPECT_FALSE(p.producer.wake_needed());  // a thread polls: it sees the record
  // The poller leaves with records it did not take: the consumer's own bell must ring, once.
  EXPECT_TRUE(p.consumer.poll_end());
  p.consumer.poll_begin();
  EXPECT_FALSE(p.consumer.poll_end());
  p.consumer.woken();
  std::vector<uint8_t> in(16);
  std::size_t n = 0;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(p.consumer.read(in, n).ok());
    EXPECT_EQ(n, 1u);
  }
  p.consumer.poll_begin();
  EXPECT_FALSE(p.consumer.poll_end());  // nothing waits
}

// The ring's file as a hostile producer sees it: positions in the first page, records after.
struct Scribbler {
  explicit Scribbler(const Ring& r) {
    void* m = ::mmap(nullptr, kRingFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, r.file(), 0);
    EXPECT_NE(m, MAP_FAILED);
    base = static_cast<uint8_t*>(m);
  }
  ~Scribbler() { ::munmap(base, kRingFileBytes); }
  void tail(uint64_t v) { std::memcpy(base, &v, sizeof v); }  // the first word
  void prefix(std::size_t at, uint32_t length, uint32_t flags) {
    std::memcpy(base + kRingControlBytes + at, &length, 4);
    std::memcpy(base + kRingControlBytes + at + 4, &flags, 4);
  }
  uint8_t* base;
};

TEST(ShmRing, AScribblingProducerIsAProtocolErrorNeverAReadOutsideTheRing) {
  std::vector<uint8_t> in(kMaxRecordBytes);
  std::size_t n = 0;
  auto broken = [&](auto&& scribble) {
    Ring consumer;
    EXPECT_TRUE(Ring::create(consumer).ok());
    Scribbler s(consumer);
    scribble(s);
    Status st = consumer.read(in, n);
    return st.code() == ErrorCode::kProtocol;
  };
  EXPECT_TRUE(broken([](Scribbler& s) { s.tail(kRingBytes + kRecordAlign); }));  // beyond
  EXPECT_TRUE(broken([](Scribbler& s) { s.tail(~uint64_t{0} - 63); }));          // behind
  EXPECT_TRUE(broken([](Scribbler& s) { s.tail(13); }));                         // misaligned
  EXPECT_TRUE(broken([](Scribbler& s) {  // longer than any record
    s.prefix(0, kMaxRecordBytes + 1, 0);
    s.tail(kRingBytes);
  }));
  EXPECT_TRUE(broken([](Scribbler& s) {  // longer than what was published
    s.prefix(0, 1000, 0);
    s.tail(kRecordAlign);
  }));
  EXPECT_TRUE(broken([](Scribbler& s) {  // unknown flags
    s.prefix(0, 8, 6);
    s.tail(kRecordAlign);
  }));
  EXPECT_TRUE(broken([](Scribbler& s) {  // empty
    s.prefix(0, 0, 0);
    s.tail(kRecordAlign);
  }));
  EXPECT_TRUE(broken([](Scribbler& s) {  // a record crossing the ring's end
    s.prefix(0, 0, 1);                   // padding: skip to the end...
    s.tail(kRingBytes + kRecordAlign);   // ...then one line, but the ring holds at most its size
  }));
  // A well-formed record after all that is read.
  EXPECT_FALSE(broken([](Scribbler& s) {
    s.prefix(0, 3, 0);
    s.tail(kRecordAlign);
  }));
  EXPECT_EQ(n, 3u);
}

TEST(ShmRing, OnlySealedRingFilesAndNonBlockingEventfdsAreAccepted) {
  Ring r;
  core::Fd unsealed(::memfd_create("x", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(unsealed.get(), static_cast<off_t>(kRingFileBytes)), 0);
  EXPECT_EQ(Ring::open(std::move(unsealed), r).code(), ErrorCode::kProtocol);
  core::Fd small(::memfd_create("x", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(::ftruncate(small.get(), 4096), 0);
  ASSERT_EQ(::fcntl(small.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  EXPECT_EQ(Ring::open(std::move(small), r).code(), ErrorCode::kProtocol);
  EXPECT_FALSE(r.valid());

  int pipe_ends[2];
  ASSERT_EQ(::pipe2(pipe_ends, O_NONBLOCK | O_CLOEXEC), 0);
  core::Fd read_end(pipe_ends[0]), write_end(pipe_ends[1]);
  EXPECT_EQ(check_bell(write_end.get()).code(), ErrorCode::kProtocol);
  core::Fd blocking(::eventfd(0, EFD_CLOEXEC));
  EXPECT_EQ(check_bell(blocking.get()).code(), ErrorCode::kProtocol);
  core::Fd bell(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  EXPECT_TRUE(check_bell(bell.get()).ok());
}

}  // namespace
}  // namespace ferry::transport::shm
