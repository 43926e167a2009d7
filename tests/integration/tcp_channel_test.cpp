// The TCP channel alone against a hand-driven peer socket: what a peer's bytes (or its words
// about bytes to come) make the channel allocate, queue and read.
#include "transport/tcp/tcp_channel.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "core/frame.hpp"
#include "core/net.hpp"
#include "core/reactor.hpp"
#include "support/pair.hpp"
#include "transport/contract.hpp"
#include "transport/tcp/tcp_frame.hpp"

namespace ferry::test {
namespace {

namespace tcp = transport::tcp;

using transport::Matcher;
using transport::tcp::TcpChannel;

struct TestHost final : transport::Host {
  transport::RegionTable table;
  core::Reactor loops{1, std::chrono::nanoseconds(0)};
  core::Teardown steps;
  transport::RegionTable& regions() override { return table; }
  core::Reactor& reactor() override { return loops; }
  core::Teardown& teardown() override { return steps; }
  void deliver_imm(transport::PeerLink&, uint32_t) override {}
};

// One channel of one stream, attached to a socket pair; `peer` is the other end.
class Channel : public ::testing::Test {
 protected:
  void open(std::size_t max_unexpected_bytes, std::size_t max_total_bytes) {
    budget = std::make_shared<transport::UnexpectedBudget>(max_total_bytes, 4096);
    link = std::make_shared<transport::PeerLink>(7, max_unexpected_bytes, budget);
    transport::tcp::TcpOptions options;
    options.streams = 1;
    channel = TcpChannel::create(host, link, options, [this](const Status& why) {
      std::lock_guard lock(closed_mu);
      closed_why = why;
    });
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    peer = core::Fd(sv[1]);
    ASSERT_TRUE(channel->attach_side(0, core::Fd(sv[0])).ok());
  }
  void TearDown() override {
    if (channel) {
      channel->close({ErrorCode::kCancelled, "test over"});
      wait_for([&] { return channel->quiesced(); });
      link->fail_all({ErrorCode::kCancelled, "test over"});
    }
    host.loops.stop();
  }
  template <typename Pred>
  static void wait_for(Pred done) {
    auto deadline = Clock::now() + kWait;
    while (!done() && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(done());
  }
  void send(const std::vector<uint8_t>& bytes) {
    ASSERT_TRUE(core::write_all(peer.get(), bytes, Clock::now() + kWait).ok());
  }
  static std::vector<uint8_t> frame(const core::FrameHeader& h) {
    std::vector<uint8_t> out(core::kFrameHeaderSize);
    core::encode_header(h, out.data());
    return out;
  }
  static core::FrameHeader message(uint64_t tag, uint32_t length) {
    core::FrameHeader h;
    h.type = tcp::TcpFrame::kSend;
    h.op_id = 99;
    h.key = tag;
    h.length = length;
    return h;
  }
  // Reads frames from the channel until one of `type` arrives; returns its header.
  core::FrameHeader read_frame() {
    uint8_t raw[core::kFrameHeaderSize];
    core::FrameHeader h;
    EXPECT_TRUE(core::read_all(peer.get(), raw, Clock::now() + kWait).ok());
    EXPECT_TRUE(core::decode_header(raw, h).ok());
    std::vector<uint8_t> body(tcp::payload_length(h));
    EXPECT_TRUE(core::read_all(peer.get(), body, Clock::now() + kWait).ok());
    return h;
  }

  // Why the channel closed (set once it has).
  Status why_closed() {
    std::lock_guard lock(closed_mu);
    return closed_why;
  }

  TestHost host;
  std::mutex closed_mu;
  Status closed_why;
  std::shared_ptr<transport::UnexpectedBudget> budget;
  std::shared_ptr<transport::PeerLink> link;
  std::shared_ptr<TcpChannel> channel;
  core::Fd peer;
};

// A peer announces a 1 GiB message (within generous limits) and sends 10 bytes of it: the
// channel counts the message against the limits but allocates only for what arrived; when the
// peer goes, the count is given back.
TEST_F(Channel, AnAnnouncedMessageIsAllocatedOnlyAsItsBytesArrive) {
  constexpr uint32_t kAnnounced = 1u << 30;
  open(std::size_t{2} << 30, std::size_t{4} << 30);
  std::vector<uint8_t> bytes = frame(message(1, kAnnounced));
  for (uint8_t i = 0; i < 10; ++i) bytes.push_back(i);
  send(bytes);
  wait_for([&] { return channel->usage().at(0).message_bytes == 10; });
  TcpChannel::StreamUsage u = channel->usage().at(0);
  EXPECT_LE(u.message_buffer, std::size_t{64} << 10) << "allocated for 10 bytes received";
  EXPECT_GE(u.message_buffer, 10u);
  Matcher::Usage counted = link->matcher.usage();
  EXPECT_EQ(counted.messages, 1u);
  EXPECT_EQ(counted.bytes, kAnnounced + Matcher::kUnexpectedOverheadBytes);
  EXPECT_EQ(budget->used(), counted.bytes);

  peer.reset();  // the rest never comes
  wait_for([&] { return channel->quiesced(); });
  EXPECT_EQ(link->matcher.usage().messages, 0u);
  EXPECT_EQ(budget->used(), 0u) << "the engine's budget is whole again";
}

// An announcement of a large message (no receive posted, so the matcher holds it) and a second
// one of the same op id: a protocol error that closes the channel, not a second message.
TEST_F(Channel, AMessageAnnouncedTwiceIsAProtocolError) {
  open(64 << 20, 64 << 20);
  core::FrameHeader h = message(3, 4 << 20);
  h.flags = tcp::kFlagAnnounce;
  send(frame(h));
  wait_for([&] { return link->matcher.usage().messages == 1; });
  send(frame(h));
  wait_for([&] { return channel->closed(); });
  wait_for([&] { return channel->quiesced(); });
  Status why = why_closed();
  EXPECT_EQ(why.code(), ErrorCode::kProtocol) << why.to_string();
  EXPECT_NE(why.message().find("message 99 announced twice"), std::string::npos) << why.to_string();
}

// A large unmatched message sent in pieces arrives intact through every growth step, then
// waits for its receive; its buffer ends exactly as long as the message.
TEST_F(Channel, AGrowingMessageBufferKeepsEveryByte) {
  constexpr uint32_t kLength = (3u << 20) + 5;
  open(64 << 20, 64 << 20);
  std::vector<uint8_t> payload(kLength);
  fill_pattern(payload, 9);
  send(frame(message(4, kLength)));
  for (std::size_t at = 0; at < kLength; at += 100000) {
    std::size_t n = std::min<std::size_t>(100000, kLength - at);
    send(std::vector<uint8_t>(payload.begin() + at, payload.begin() + at + n));
  }
  core::FrameHeader ack = read_frame();
  EXPECT_EQ(ack.type, tcp::TcpFrame::kSendAck);
  EXPECT_EQ(ack.status, 0);
  EXPECT_EQ(link->matcher.usage().messages, 1u);
  std::vector<uint8_t> got(kLength + 10);
  transport::OpState r;
  r.tag = 4;
  r.entries = {{got.data(), got.size()}};
  ASSERT_TRUE(link->matcher.take_buffered(&r));
  EXPECT_EQ(r.bytes.load(), kLength);
  EXPECT_EQ(0, std::memcmp(got.data(), payload.data(), kLength));
  EXPECT_EQ(link->matcher.usage().bytes, 0u);
}

// The staging buffer starts small and grows when a burst of small frames fills it.
TEST_F(Channel, TheStagingBufferStartsSmallAndGrowsWithUse) {
  open(64 << 20, 64 << 20);
  std::size_t first = channel->usage().at(0).receive_buffer;
  EXPECT_GT(first, 0u);
  EXPECT_LE(first, std::size_t{16} << 10);
  // 1024 empty messages, 48 KiB of frames in one write: a recv fills the buffer.
  constexpr int kFrames = 1024;
  std::vector<uint8_t> burst;
  for (int i = 0; i < kFrames; ++i) {
    std::vector<uint8_t> f = frame(message(5, 0));
    burst.insert(burst.end(), f.begin(), f.end());
  }
  send(burst);
  for (int i = 0; i < kFrames; ++i) ASSERT_EQ(read_frame().type, tcp::TcpFrame::kSendAck);
  std::size_t grown = channel->usage().at(0).receive_buffer;
  EXPECT_GT(grown, first);
  EXPECT_LE(grown, std::size_t{256} << 10);
}

// A peer that sends read requests and never reads the answers is no longer read once a bound
// of answers is queued; once it reads them, the channel reads again and answers every request.
TEST_F(Channel, APeerThatDoesNotReadItsAnswersIsNotReadEither) {
  constexpr uint32_t kLength = 64 << 10;
  constexpr int kRequests = 1500;  // the bound is 1024 with the default options
  std::vector<uint8_t> mem(kLength);
  fill_pattern(mem, 3);
  uint32_t id = host.table.insert(mem.data(), mem.size(), Access::kRemoteRead, 55);
  open(64 << 20, 64 << 20);
  std::vector<uint8_t> requests;
  for (int i = 0; i < kRequests; ++i) {
    core::FrameHeader h;
    h.type = tcp::TcpFrame::kReadReq;
    h.op_id = static_cast<uint64_t>(i);
    h.region_id = id;
    h.key = 55;
    h.length = kLength;
    std::vector<uint8_t> f = frame(h);
    requests.insert(requests.end(), f.begin(), f.end());
  }
  send(requests);  // 72 KiB: the socket takes it all
  wait_for([&] { return channel->usage().at(0).reading_paused; });
  TcpChannel::StreamUsage u = channel->usage().at(0);
  EXPECT_LE(u.queued_responses, 1024u);
  EXPECT_GT(u.queued_responses, 512u);

  for (int i = 0; i < kRequests; ++i) {
    core::FrameHeader h = read_frame();
    ASSERT_EQ(h.type, tcp::TcpFrame::kReadData);
    ASSERT_EQ(h.status, 0);
    ASSERT_EQ(h.op_id, static_cast<uint64_t>(i)) << "in order, none lost";
  }
  u = channel->usage().at(0);
  EXPECT_FALSE(u.reading_paused);
  EXPECT_EQ(u.queued_responses, 0u);
}

// Group read requests are answers of up to 14 KiB of table, pieces and leases each: a stream
// queues at most 2 x slices_in_flight_per_stream (128 by default) of them for a peer that does
// not read, far fewer than single answers, then reads no more until half are taken; none is
// lost.
TEST_F(Channel, APeerThatDoesNotReadItsGroupAnswersIsNotReadEither) {
  constexpr uint32_t kEntries = 256, kEntry = 64;
  constexpr int kRequests = 400;
  std::vector<uint8_t> mem(kEntries * kEntry);
  fill_pattern(mem, 4);
  uint32_t id = host.table.insert(mem.data(), mem.size(), Access::kRemoteRead, 56);
  open(64 << 20, 64 << 20);
  std::vector<uint8_t> requests;
  for (int i = 0; i < kRequests; ++i) {
    core::FrameHeader h;
    h.type = tcp::TcpFrame::kReadGroupReq;
    h.op_id = static_cast<uint64_t>(i);
    h.region_id = kEntries;
    h.length = kEntries * tcp::kGroupEntrySize;
    std::vector<uint8_t> f = frame(h);
    f.resize(core::kFrameHeaderSize + h.length);
    for (uint32_t e = 0; e < kEntries; ++e) {
      tcp::encode_group_entry({id, kEntry, 56, e * kEntry, e},
                              f.data() + core::kFrameHeaderSize + e * tcp::kGroupEntrySize);
    }
    requests.insert(requests.end(), f.begin(), f.end());
  }
  std::thread writer([&] { send(requests); });  // 3.2 MiB: the socket takes part of it
  wait_for([&] { return channel->usage().at(0).reading_paused; });
  TcpChannel::StreamUsage u = channel->usage().at(0);
  EXPECT_LE(u.queued_responses, 128u);
  EXPECT_GT(u.queued_responses, 64u);

  for (int i = 0; i < kRequests; ++i) {
    core::FrameHeader h = read_frame();
    ASSERT_EQ(h.type, tcp::TcpFrame::kReadGroupData);
    ASSERT_EQ(h.status, 0);
    ASSERT_EQ(h.region_id, kEntries);
    ASSERT_EQ(h.op_id, static_cast<uint64_t>(i)) << "in order, none lost";
  }
  writer.join();
  u = channel->usage().at(0);
  EXPECT_FALSE(u.reading_paused);
  EXPECT_EQ(u.queued_responses, 0u);
}

// More frames arrive at once than a stream handles per wake-up (256): the rest are taken up
// later, though the socket has nothing more to wake the loop with. The loop is held while the
// burst is written, so that its first recv takes all of it.
TEST_F(Channel, FramesBeyondThePerWakeBudgetAreHandledToo) {
  std::vector<uint8_t> mem(300);
  uint32_t id = host.table.insert(mem.data(), mem.size(), Access::kRemoteWrite, 56);
  open(64 << 20, 64 << 20);
  constexpr int kWrites = 300;  // 49 bytes each: 14.7 KB, within the first staging buffer
  std::vector<uint8_t> burst;
  for (int i = 0; i < kWrites; ++i) {
    core::FrameHeader h;
    h.type = tcp::TcpFrame::kWrite;
    h.op_id = static_cast<uint64_t>(i);
    h.region_id = id;
    h.key = 56;
    h.offset = static_cast<uint64_t>(i);
    h.length = 1;
    std::vector<uint8_t> f = frame(h);
    burst.insert(burst.end(), f.begin(), f.end());
    burst.push_back(1);
  }
  std::promise<void> held, release;
  host.loops.post(0, [&] {
    held.set_value();
    release.get_future().wait();
  });
  held.get_future().wait();
  send(burst);
  release.set_value();
  for (int i = 0; i < kWrites; ++i) {
    core::FrameHeader h = read_frame();
    ASSERT_EQ(h.type, tcp::TcpFrame::kWriteAck);
    ASSERT_EQ(h.status, 0);
    ASSERT_EQ(h.op_id, static_cast<uint64_t>(i));
  }
  EXPECT_TRUE(std::all_of(mem.begin(), mem.end(), [](uint8_t b) { return b == 1; }));
}

}  // namespace
}  // namespace ferry::test
