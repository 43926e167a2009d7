// A one-way queue of records in memory two processes share: the same-host channel's requests
// and answers travel in one ring per direction, with no system call while the consumer is
// polling and one eventfd write (the consumer's "bell") when it sleeps.
//
// The consumer creates its ring (a sealed memory file) and sends the file to its producer, so
// each process owns the ring it reads. Both map it writable; the peer may be hostile, so each
// side keeps its own position privately, only publishes it, and checks what it reads of the
// other's: a consumer copies every record out before using it and treats a position or length
// that does not fit as a protocol error; a producer never writes outside the ring whatever the
// consumer published (a broken consumer only stalls itself).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/net.hpp"
#include "ferry/error.hpp"

namespace ferry::transport::shm {

// Bytes of one ring's record area (a power of two): eleven of the largest records (a full entry
// table and inline bytes, ~44 KiB), so a producer posting a batch rarely waits for room.
constexpr std::size_t kRingBytes = 512 << 10;
// Records start on a cache line: a producer's next record never shares one with a record the
// consumer is copying out.
constexpr std::size_t kRecordAlign = 64;
// The ring's memory file: a page of positions and flags, then the records.
constexpr std::size_t kRingControlBytes = 4096;
constexpr std::size_t kRingFileBytes = kRingControlBytes + kRingBytes;

class Ring {
 public:
  // The consumer's ring: a new memory file, to send to the producer.
  static Status create(Ring& out);
  // The producer's: the file the consumer sent, checked to be a sealed memory file of exactly
  // a ring's size (one that could shrink under the mapping would kill us with SIGBUS).
  static Status open(core::Fd file, Ring& out);

  Ring() = default;
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  Ring(Ring&& other) noexcept { *this = std::move(other); }
  Ring& operator=(Ring&& other) noexcept;
  ~Ring();

  bool valid() const { return control_ != nullptr; }
  int file() const { return file_.get(); }

  // ---- producer (one thread at a time) ----
  // Appends one record, `a` then `b`, and publishes it; false, with nothing written, when the
  // ring lacks room: then the consumer rings the producer's bell once it freed some.
  bool write(std::span<const uint8_t> a, std::span<const uint8_t> b = {});
  // After writes: whether to ring the consumer's bell (nobody polls the ring and no wake-up is
  // on its way). True at most once until the consumer was woken().
  bool wake_needed();
  // After a write() that found no room: whether the consumer has since freed some (it read
  // on, or took the request for room, for which it rings our bell too).
  bool room_freed() const;

  // ---- consumer (one thread at a time) ----
  // Shows the next record, of at most `max_length` bytes, where it lies in the ring; `length`
  // 0 when none waits. Its room stays taken until release(), and the producer can still write
  // there (the peer may be hostile): what is interpreted must be copied out first
  // (parse_in_place). One record at a time.
  Status peek(std::size_t max_length, const uint8_t*& at, std::size_t& length);
  void release();
  // Copies the next record into `out` and frees its room; `length` 0 when none waits.
  Status read(std::span<uint8_t> out, std::size_t& length);
  // The consumer was woken: the next record published rings the bell again. Call before
  // reading what is there.
  void woken();
  // Whether the producer waits for room that reads have since freed (it wants its bell rung).
  bool room_wanted();

  // ---- any thread of the consumer's process ----
  bool pending() const;
  // A thread polls the ring: producers ring no bell meanwhile.
  void poll_begin();
  // It stopped: true when records wait that nobody will see unless the consumer's own bell is
  // rung (once; the caller rings it).
  bool poll_end();

 private:
  struct Control;
  void attach(uint8_t* base);
  Control* control_ = nullptr;
  uint8_t* records_ = nullptr;
  core::Fd file_;
  uint64_t position_ = 0;  // producer: where the next record goes; consumer: the next to read
  uint64_t seen_ = 0;      // producer: the consumer's position last read; consumer: the producer's
  uint64_t shown_ = 0;     // consumer: the ring bytes of the record peek() shows
  void* order_key_ = nullptr;  // ThreadSanitizer builds: the ring's, shared by both ends
};

// Checks that `fd`, received from a peer, is a non-blocking eventfd: writing a wake-up to it
// must never block us (a pipe or socket the peer keeps full would).
Status check_bell(int fd);
// Rings a bell (an eventfd); a full counter already wakes its reader.
void ring_bell(int fd);

}  // namespace ferry::transport::shm
