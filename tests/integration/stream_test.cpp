// `ferry emulate` and `ferry stream` as users run them, each side its own process: emulator ->
// sender -> receiver -> sink, checked by the frames' sequence numbers and CRCs and by bytes
// compared; a slow sink, a killed receiver or sender, and Ctrl-C at either end.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"
#include "support/cli_process.hpp"

namespace ferry::test {
namespace {

// The rest of a line that starts with "listening on ", the first line `p` prints.
std::string listening_on(Background& p) {
  std::string first = p.line();
  const std::string prefix = "listening on ";
  EXPECT_EQ(first.rfind(prefix, 0), 0u) << first;
  return first.rfind(prefix, 0) == 0 ? first.substr(prefix.size()) : "";
}

// Lines until the end of `p`'s output.
std::vector<std::string> remaining_lines(Background& p) {
  std::vector<std::string> lines;
  for (std::string l = p.line(); !l.empty(); l = p.line()) lines.push_back(l);
  return lines;
}

// The --json summary line among `lines` ("" when there is none).
std::string summary_of(const std::vector<std::string>& lines) {
  for (const std::string& l : lines) {
    if (l.find("\"kind\":\"summary\"") != std::string::npos) return l;
  }
  return "";
}

// A number field of a JSON line; -1 when it is missing.
double field(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\":(-?[0-9.]+)"))) return -1;
  return std::stod(m[1].str());
}

std::string text_field(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\":\"([^\"]*)\""))) return "";
  return m[1].str();
}

// Reads `p`'s lines until a progress line, which says the stream is moving.
bool until_progress(Background& p) {
  for (std::string l = p.line(); !l.empty(); l = p.line()) {
    if (l.find("\"kind\":\"progress\"") != std::string::npos) return true;
  }
  return false;
}

class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/ferry-stream-XXXXXX";
    path_ = ::mkdtemp(name);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

class StreamOver : public testing::TestWithParam<std::string> {};

// Whether `name` can carry a stream here; verbs only where an RDMA device is (the guest suite
// sets FERRY_STREAM_REQUIRE_VERBS, so there its absence fails instead).
bool usable_here(const std::string& name) {
  if (name == "auto") return true;
  for (const TransportInfo& t : Engine::transports()) {
    if (to_string(t.kind) == name) return t.usable;
  }
  return false;
}

TEST_P(StreamOver, EmulatorFramesArriveInOrderWithTheirChecksums) {
  const std::string transport = GetParam();
  if (!usable_here(transport)) {
    if (std::getenv("FERRY_STREAM_REQUIRE_VERBS") != nullptr) FAIL() << transport << " is unusable";
    GTEST_SKIP() << transport << " is not usable on this host";
  }
  Background emulator({"emulate", "--listen", "tcp:127.0.0.1:0", "--rate", "200MB/s", "--frame",
                       "16K", "--frames", "2000", "--burst", "4", "--jitter", "0.2", "--json"});
  std::string source = listening_on(emulator);
  Background receiver({"stream", "--listen", "127.0.0.1:0", "--verify", "--json", "--slots", "8",
                       "--slot-bytes", "256K", "--transport", transport});
  std::string at = listening_on(receiver);
  // Two writes in flight into eight slots: the window, not the ring, holds the sender back.
  Background sender({"stream", "--connect", at, "--source", source, "--json", "--transport",
                     transport, "--window", "2"});
  std::vector<std::string> sent = remaining_lines(sender);
  ASSERT_EQ(sender.wait(), 0) << sender.errors();
  ASSERT_EQ(emulator.wait(), 0) << emulator.errors();
  std::vector<std::string> received = remaining_lines(receiver);
  ASSERT_EQ(receiver.wait(), 0) << receiver.errors();

  // auto: the same-host transport, the best one both ends have here.
  std::string expected = transport == "auto" ? "shm" : transport;
  EXPECT_NE(sent.front().find("over " + expected), std::string::npos) << sent.front();
  EXPECT_NE(sent.front().find("8 slots of 256K, 2 in flight at most"), std::string::npos)
      << sent.front();
  std::string rx = summary_of(received);
  EXPECT_EQ(field(rx, "frames"), 2000) << rx;
  EXPECT_EQ(field(rx, "lost"), 0) << rx;
  EXPECT_EQ(field(rx, "bad_crc"), 0) << rx;
  EXPECT_EQ(field(rx, "reordered"), 0) << rx;
  EXPECT_EQ(field(rx, "total_bytes"), 2000 * 16384) << rx;
  EXPECT_EQ(text_field(rx, "problem"), "none") << rx;
  EXPECT_GT(field(rx, "latency_p50_us"), 0) << rx;
  std::string em = summary_of(remaining_lines(emulator));
  EXPECT_EQ(field(em, "frames"), 2000) << em;
  EXPECT_EQ(text_field(summary_of(sent), "ended"), "the source ended") << summary_of(sent);
}

INSTANTIATE_TEST_SUITE_P(Transports, StreamOver, testing::Values("auto", "tcp", "verbs"));

TEST(Stream, AFileArrivesByteExactThroughSlotsUsedManyTimes) {
  TempDir dir;
  std::vector<char> bytes(5 * 1048576 + 12345);
  std::mt19937 random(3);
  for (char& b : bytes) b = static_cast<char>(random());
  std::ofstream(dir.file("in.bin"), std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  Background receiver({"stream", "--listen", "127.0.0.1:0", "--sink", dir.file("out.bin"),
                       "--slots", "3", "--slot-bytes", "64K", "--json"});
  std::string at = listening_on(receiver);
  Background sender(
      {"stream", "--connect", at, "--source", "file:" + dir.file("in.bin"), "--json"});
  remaining_lines(sender);
  ASSERT_EQ(sender.wait(), 0) << sender.errors();
  std::string rx = summary_of(remaining_lines(receiver));
  ASSERT_EQ(receiver.wait(), 0) << receiver.errors();
  EXPECT_EQ(field(rx, "total_bytes"), static_cast<double>(bytes.size())) << rx;
  EXPECT_EQ(field(rx, "gather_ms"), 0) << "three slots are too few to gather in: " << rx;
  std::ifstream out(dir.file("out.bin"), std::ios::binary);
  std::vector<char> got((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(got == bytes) << got.size() << " bytes arrived of " << bytes.size();
}

// Generated frames, whose sender always has more ready, through a receiver that keeps up (one
// 4 KiB chunk in flight at a time, each checked in microseconds, so that its passes stay short
// even in a sanitizer build): it lets chunks gather between its passes, and every frame
// arrives, in order, with its CRC. With --gather-us 0 it never pauses. (When it pauses and for
// how long: gather_test.cpp.)
TEST(Stream, FramesArriveWholeWhileTheReceiverGathersThem) {
  for (const std::string gather_us : {"10000", "0"}) {
    Background receiver({"stream", "--listen", "127.0.0.1:0", "--verify", "--json", "--slots", "64",
                         "--slot-bytes", "4112", "--gather-us", gather_us});
    std::string at = listening_on(receiver);
    Background sender({"stream", "--connect", at, "--source", "gen", "--frame", "4K", "--bytes",
                       "2M", "--window", "1", "--json"});
    remaining_lines(sender);
    ASSERT_EQ(sender.wait(), 0) << sender.errors();
    std::string rx = summary_of(remaining_lines(receiver));
    ASSERT_EQ(receiver.wait(), 0) << receiver.errors();
    EXPECT_EQ(field(rx, "frames"), 512) << rx;
    EXPECT_EQ(field(rx, "lost"), 0) << rx;
    EXPECT_EQ(field(rx, "bad_crc"), 0) << rx;
    EXPECT_EQ(field(rx, "reordered"), 0) << rx;
    EXPECT_EQ(text_field(rx, "problem"), "none") << rx;
    // 513 chunks (the last ends the stream): credits for a quarter ring (16) or more each, and
    // the end's confirmation, but at least one per ring or the sender would have stalled.
    EXPECT_LE(field(rx, "credits"), 513 / 16 + 1) << rx;
    EXPECT_GE(field(rx, "credits"), 513 / 64) << rx;
    if (gather_us == "0") {
      EXPECT_EQ(field(rx, "gather_ms"), 0) << rx;
    } else {
      EXPECT_GT(field(rx, "gather_ms"), 0) << rx;
    }
  }
}

// A sender made by hand, connected to the receiver at `at`, its hello taken and the ring's
// descriptor decoded: a test writes with it what no `ferry stream` sender would.
struct HandMadeSender {
  static constexpr uint64_t kHelloTag = 0x4652595300000001, kControlTag = kHelloTag + 1;
  explicit HandMadeSender(const std::string& at)
      : engine(without_listener()),
        peer(engine.connect(at)),
        control(engine.allocate(4096, Access::kLocal)) {
    if (!peer.recv(kHelloTag, control, 0, 4096).wait(std::chrono::seconds(30)).ok())
      throw std::runtime_error("no hello from the receiver");
    uint16_t descriptor_bytes = 0;
    std::memcpy(&descriptor_bytes, bytes() + 6, sizeof descriptor_bytes);
    ring = Descriptor::decode({bytes() + 16, descriptor_bytes});
  }
  static Config without_listener() {
    Config c;
    c.listen = false;
    return c;
  }
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(control.data()); }
  Engine engine;
  Peer peer;
  Region control;  // the hello, then control messages
  Descriptor ring;
};

// A sender made by hand names a run of slots outside the receiver's ring of 8: one that starts
// beyond it, one longer than it. The receiver ends with an error naming what it was sent.
TEST(Stream, ARunOfSlotsOutsideTheRingEndsTheReceiverWithAnErrorNamingIt) {
  for (uint32_t imm : {uint32_t{8}, uint32_t{8} << 16}) {
    Background receiver(
        {"stream", "--listen", "127.0.0.1:0", "--slots", "8", "--slot-bytes", "4K", "--json"});
    HandMadeSender sender(listening_on(receiver));
    Region chunk = sender.engine.allocate(4096, Access::kLocal);
    Transfer t{&chunk, 0, &sender.ring, 0, 16};
    // Whether the write completes well or fails is a race: the receiver may close before its
    // completion comes back.
    (void)sender.peer.write_with_imm({&t, 1}, imm).wait(std::chrono::seconds(30));
    remaining_lines(receiver);
    EXPECT_EQ(receiver.wait(), 1);
    std::string errors = receiver.errors();
    std::string named = imm == 8 ? "the sender named a run of 1 from slot 8 in a ring of 8"
                                 : "the sender named a run of 9 from slot 0 in a ring of 8";
    EXPECT_NE(errors.find(named), std::string::npos) << errors;
  }
}

// A sender made by hand writes a ring of 8 in runs, one of which wraps (slots 6, 7 and 0, after
// a credit for slot 0), then ends the stream: the sink gets every chunk's bytes in order.
TEST(Stream, ARunThatWrapsTheRingArrivesInOrder) {
  constexpr uint64_t kPayload = 100, kSlotBytes = 4096;
  TempDir dir;
  Background receiver({"stream", "--listen", "127.0.0.1:0", "--slots", "8", "--slot-bytes", "4K",
                       "--sink", dir.file("out.bin"), "--json"});
  HandMadeSender sender(listening_on(receiver));
  Region staging = sender.engine.allocate(8 * kSlotBytes, Access::kLocal);
  std::string expected;
  // Chunks first..first+n-1 into their slots as one write; the last ends the stream if `end`.
  auto write_run = [&](uint64_t first, uint64_t n, bool end) {
    std::vector<Transfer> run;
    for (uint64_t seq = first; seq < first + n; ++seq) {
      uint64_t slot = seq % 8;
      auto* p = static_cast<uint8_t*>(staging.data()) + slot * kSlotBytes;
      bool last = end && seq == first + n - 1;
      uint32_t length = last ? 0 : kPayload, flags = last ? 1 : 0;
      std::memcpy(p, &length, 4);
      std::memcpy(p + 4, &flags, 4);
      std::memcpy(p + 8, &seq, 8);
      std::memset(p + 16, 'a' + static_cast<int>(seq), length);
      expected.append(length, static_cast<char>('a' + seq));
      run.push_back({&staging, slot * kSlotBytes, &sender.ring, slot * kSlotBytes, 16 + length});
    }
    auto imm = static_cast<uint32_t>(first % 8 | (n - 1) << 16);
    Status written = sender.peer.write_with_imm(run, imm).wait(std::chrono::seconds(30));
    // After the end of the stream the receiver may close before the completion comes back.
    if (!end) {
      EXPECT_TRUE(written.ok()) << written.to_string();
    }
  };
  write_run(0, 6, false);
  uint64_t consumed = 0;
  while (consumed < 1) {
    Future credit = sender.peer.recv(HandMadeSender::kControlTag, sender.control, 0, 16);
    ASSERT_TRUE(credit.wait(std::chrono::seconds(30)).ok());
    std::memcpy(&consumed, sender.bytes() + 8, sizeof consumed);
  }
  write_run(6, 3, false);  // slots 6, 7, 0
  write_run(9, 1, true);
  std::string rx = summary_of(remaining_lines(receiver));
  ASSERT_EQ(receiver.wait(), 0) << receiver.errors();
  EXPECT_EQ(field(rx, "chunks"), 10) << rx;
  std::ifstream out(dir.file("out.bin"), std::ios::binary);
  std::string got((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, expected);
}

TEST(Stream, ASlowSinkSlowsTheSourceAndLosesNothing) {
  TempDir dir;
  // 39 MB at a sink of 10 MB/s, over a Unix socket from the emulator: far more than the ring
  // (4 MiB) and the socket (a few hundred KiB; a loopback TCP socket autotunes to megabytes)
  // hold, so the emulator must wait for its reader unless it runs slower than ~12 MB/s. Under
  // TSan beside another test it ran at 34 MB/s; with 20 MB/s and TCP, buffers took the surplus.
  Background emulator({"emulate", "--listen", "unix:" + dir.file("source.sock"), "--rate",
                       "400MB/s", "--frame", "64K", "--frames", "600", "--json"});
  std::string source = listening_on(emulator);
  Background receiver({"stream", "--listen", "127.0.0.1:0", "--verify", "--json", "--slots", "4",
                       "--slot-bytes", "1M", "--sink", dir.file("out.bin"), "--sink-rate",
                       "10MB/s"});
  std::string at = listening_on(receiver);
  Background sender({"stream", "--connect", at, "--source", source, "--json"});
  std::string tx = summary_of(remaining_lines(sender));
  ASSERT_EQ(sender.wait(), 0) << sender.errors();
  std::string em = summary_of(remaining_lines(emulator));
  ASSERT_EQ(emulator.wait(), 0) << emulator.errors();
  std::string rx = summary_of(remaining_lines(receiver));
  ASSERT_EQ(receiver.wait(), 0) << receiver.errors();
  EXPECT_EQ(field(rx, "frames"), 600) << rx;
  EXPECT_EQ(field(rx, "lost"), 0) << rx;
  EXPECT_EQ(field(rx, "bad_crc"), 0) << rx;
  EXPECT_GT(field(rx, "sink_wait_ms"), 0) << rx;
  EXPECT_GT(field(tx, "credit_wait_ms"), 0) << tx;     // the ring was full: back-pressure
  EXPECT_GT(field(em, "reader_blocked_ms"), 0) << em;  // and it reached the source
  EXPECT_EQ(std::filesystem::file_size(dir.file("out.bin")), 600u * 65536);
}

TEST(Stream, AKilledReceiverStopsTheSenderWithAClearError) {
  Background receiver({"stream", "--listen", "127.0.0.1:0", "--json"});
  std::string at = listening_on(receiver);
  Background sender({"stream", "--connect", at, "--json", "--interval", "0.1"});
  ASSERT_TRUE(until_progress(sender)) << sender.errors();
  receiver.kill_now();
  remaining_lines(sender);
  EXPECT_EQ(sender.wait(), 1);
  std::string errors = sender.errors();
  EXPECT_NE(errors.find("ferry stream: "), std::string::npos) << errors;
  EXPECT_NE(errors.find("receiver"), std::string::npos) << errors;
}

TEST(Stream, AKilledSenderFailsTheReceiverAfterItsSummary) {
  Background receiver({"stream", "--listen", "127.0.0.1:0", "--json", "--verify"});
  std::string at = listening_on(receiver);
  Background sender({"stream", "--connect", at, "--json", "--interval", "0.1"});
  ASSERT_TRUE(until_progress(sender)) << sender.errors();
  sender.kill_now();
  std::string rx = summary_of(remaining_lines(receiver));
  EXPECT_EQ(receiver.wait(), 1);
  EXPECT_GT(field(rx, "frames"), 0) << rx;
  std::string errors = receiver.errors();
  EXPECT_NE(errors.find("went away before the end of its stream"), std::string::npos) << errors;
}

TEST(Stream, CtrlCAtTheSenderEndsBothSidesWithTheirSummaries) {
  Background receiver({"stream", "--listen", "127.0.0.1:0", "--json", "--verify"});
  std::string at = listening_on(receiver);
  Background sender({"stream", "--connect", at, "--json", "--interval", "0.1"});
  ASSERT_TRUE(until_progress(sender)) << sender.errors();
  sender.signal(SIGINT);
  std::string tx = summary_of(remaining_lines(sender));
  EXPECT_EQ(sender.wait(), 0) << sender.errors();
  std::string rx = summary_of(remaining_lines(receiver));
  EXPECT_EQ(receiver.wait(), 0) << receiver.errors();
  EXPECT_EQ(text_field(tx, "ended"), "stopped (signal)") << tx;
  EXPECT_EQ(text_field(rx, "problem"), "none") << rx;
  EXPECT_EQ(field(rx, "total_bytes"), field(tx, "total_bytes")) << rx << "\n" << tx;
}

TEST(Stream, CtrlCAtTheReceiverEndsBothSidesWithTheirSummaries) {
  Background receiver(
      {"stream", "--listen", "127.0.0.1:0", "--json", "--verify", "--interval", "0.1"});
  std::string at = listening_on(receiver);
  Background sender({"stream", "--connect", at, "--json"});
  ASSERT_TRUE(until_progress(receiver)) << receiver.errors();
  receiver.signal(SIGINT);
  std::string rx = summary_of(remaining_lines(receiver));
  EXPECT_EQ(receiver.wait(), 0) << receiver.errors();
  std::string tx = summary_of(remaining_lines(sender));
  EXPECT_EQ(sender.wait(), 0) << sender.errors();
  EXPECT_EQ(text_field(tx, "ended"), "the receiver asked to stop") << tx;
  EXPECT_EQ(text_field(rx, "problem"), "none") << rx;
  EXPECT_EQ(field(rx, "total_bytes"), field(tx, "total_bytes")) << rx << "\n" << tx;
}

}  // namespace
}  // namespace ferry::test
