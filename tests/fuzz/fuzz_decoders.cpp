// libFuzzer target for every decoder that reads bytes from the network or from users:
// frame headers, group frames' entry tables, handshake bodies (channel addresses included),
// verbs queue-pair addresses and message headers, shm channel addresses and records,
// descriptors (binary, text), HTTP responses (etcd's answers, core/http.hpp), and the CUDA IPC
// transport's keys, address and frames. The first input
// byte picks the decoder. Decoders must reject bad input with an error, never crash or over-read.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "core/frame.hpp"
#include "core/http.hpp"
#include "engine/handshake.hpp"
#include "ferry/ferry.hpp"
#include "transport/cuda_ipc/cuda_ipc_wire.hpp"
#include "transport/shm/shm_wire.hpp"
#include "transport/tcp/tcp_frame.hpp"
#include "transport/verbs/verbs_channel.hpp"
#include "transport/verbs/verbs_message.hpp"

namespace tcp = ferry::transport::tcp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::span<const uint8_t> body(data + 1, size - 1);
  switch (data[0] % 16) {
    case 0:
      if (body.size() >= ferry::core::kFrameHeaderSize) {
        ferry::core::FrameHeader h;
        if (ferry::core::decode_header(body.data(), h).ok() && !ferry::core::is_control(h.type) &&
            tcp::check_data_header(h).ok()) {
          (void)tcp::payload_length(h);
        }
      }
      break;
    case 10: {
      // A group frame's header, then its table as the channel reads it: only when the header
      // decodes, exactly the table it announces, into room for the most entries allowed.
      if (body.size() < ferry::core::kFrameHeaderSize) break;
      ferry::core::FrameHeader h;
      if (!ferry::core::decode_header(body.data(), h).ok() || ferry::core::is_control(h.type) ||
          !tcp::check_data_header(h).ok()) {
        break;
      }
      std::span<const uint8_t> rest = body.subspan(ferry::core::kFrameHeaderSize);
      std::size_t table = std::size_t{h.region_id} * tcp::kGroupEntrySize;
      tcp::GroupEntry entries[tcp::kMaxGroupEntries];
      uint64_t total = 0;
      // The announced count as the decoder must bound it, and the table's bytes as they came.
      if (tcp::decode_group_table(rest.data(), std::min(table, rest.size()), h.region_id, entries,
                                  total)
              .ok()) {
        if (h.region_id == 0 || h.region_id > tcp::kMaxGroupEntries) __builtin_trap();
        uint8_t again[tcp::kGroupEntrySize];
        for (uint32_t i = 0; i < h.region_id; ++i) {
          tcp::encode_group_entry(entries[i], again);
          if (std::memcmp(again, rest.data() + i * sizeof again, sizeof again) != 0)
            __builtin_trap();
        }
      }
      break;
    }
    case 1: {
      ferry::engine::Hello m;
      (void)ferry::engine::decode(body, m);
      break;
    }
    case 2: {
      ferry::engine::HelloAck m;
      (void)ferry::engine::decode(body, m);
      break;
    }
    case 3: {
      ferry::engine::Join m;
      (void)ferry::engine::decode(body, m);
      break;
    }
    case 4: {
      ferry::engine::ErrorMsg m;
      (void)ferry::engine::decode(body, m);
      break;
    }
    case 5: {
      ferry::engine::Auth m;
      (void)ferry::engine::decode(body, m);
      break;
    }
    case 6:
      try {
        auto d = ferry::Descriptor::decode(body);
        // What decodes must encode back to the same bytes.
        if (d.encode() != std::vector<uint8_t>(body.begin(), body.end())) __builtin_trap();
      } catch (const ferry::Error&) {
      }
      break;
    case 8: {
      ferry::transport::verbs::VerbsAddress a;
      if (ferry::transport::verbs::VerbsAddress::decode(body, a).ok()) {
        if (a.encode() != std::vector<uint8_t>(body.begin(), body.end())) __builtin_trap();
      }
      break;
    }
    case 9: {
      ferry::transport::verbs::MsgHeader h;
      if (ferry::transport::verbs::MsgHeader::decode(body, h).ok()) {
        uint8_t again[ferry::transport::verbs::MsgHeader::kSize];
        h.encode(again);
        if (std::memcmp(again, body.data(), sizeof again) != 0) __builtin_trap();
        // What an ACK names: at least one message, exactly one with an error, no gap.
        ferry::transport::verbs::AckNames names;
        if (ferry::transport::verbs::AckNames::decode(h, names).ok()) {
          bool one =
              (names.count == 1 && names.compact == 0) || (names.count == 0 && names.compact == 1);
          if (names.count > names.kMaxIds || (names.count == 0 && names.compact == 0))
            __builtin_trap();
          if (h.status != 0 && !one) __builtin_trap();
          for (std::size_t i = 0; i < names.kMaxIds; ++i) {
            if ((names.ids[i] == 0) != (i >= names.count)) __builtin_trap();
          }
        }
      }
      break;
    }
    case 11: {
      ferry::engine::ChannelAddresses m;
      if (ferry::engine::decode(body, m).ok()) {
        // What decodes must encode back to the same bytes.
        auto again = ferry::engine::encode(m);
        if (!std::equal(again.begin() + ferry::core::kFrameHeaderSize, again.end(), body.begin(),
                        body.end()))
          __builtin_trap();
      }
      break;
    }
    case 12: {
      ferry::transport::shm::Address a;
      if (ferry::transport::shm::decode(body, a).ok()) {
        if (ferry::transport::shm::encode(a) != std::vector<uint8_t>(body.begin(), body.end()))
          __builtin_trap();
      }
      break;
    }
    case 13: {
      // A record as it came off the socket: what parses must lie inside it, entries included.
      ferry::transport::shm::View v;
      bool parsed = ferry::transport::shm::parse(body, v).ok();
      if (parsed) {
        if (v.table.size() + v.payload.size() + ferry::transport::shm::kHeaderBytes != body.size())
          __builtin_trap();
        for (std::size_t i = 0; i < v.table.size() / ferry::transport::shm::kEntryBytes; ++i)
          (void)v.entry(i);
      }
      // The same record as it lies in a ring: the same verdict and table, the payload in place.
      static std::vector<uint8_t> copy(ferry::transport::shm::kMaxRecordBytes);
      ferry::transport::shm::View w;
      if (body.size() <= copy.size()) {
        bool in_place = ferry::transport::shm::parse_in_place(body, copy, w).ok();
        if (in_place != parsed) __builtin_trap();
        if (in_place && (w.payload.data() != body.data() + (body.size() - w.payload.size()) ||
                         w.payload.size() != v.payload.size() || w.table.size() != v.table.size() ||
                         !std::equal(w.table.begin(), w.table.end(), v.table.begin())))
          __builtin_trap();
      }
      break;
    }
    case 14: {
      // A response fed whole and fed in two pieces (split where its first byte says) must get
      // the same verdict and body, within the cap.
      if (body.empty()) break;
      std::string_view wire(reinterpret_cast<const char*>(body.data()) + 1, body.size() - 1);
      constexpr std::size_t kCap = 256;
      ferry::core::HttpResponseReader whole(kCap), split(kCap);
      bool whole_ok = whole.feed(wire).ok() && whole.finish().ok();
      std::size_t at = std::min<std::size_t>(body[0], wire.size());
      bool split_ok = split.feed(wire.substr(0, at)).ok() && split.feed(wire.substr(at)).ok() &&
                      split.finish().ok();
      if (whole_ok != split_ok || whole.body() != split.body() || whole.body().size() > kCap)
        __builtin_trap();
      break;
    }
    case 15: {
      // What decodes must encode back to the same bytes: a key, an address, each whole frame.
      namespace ipc = ferry::transport::cuda_ipc;
      ipc::Key key;
      if (ipc::decode(body, key).ok()) {
        auto again = ipc::encode(key);
        if (!std::equal(again.begin(), again.end(), body.begin(), body.end())) __builtin_trap();
      }
      uint32_t pid = 0;
      if (ipc::decode_address(body, pid).ok() && ipc::encode_address(pid).size() != body.size())
        __builtin_trap();
      for (std::size_t at = 0; at + ipc::kFrameBytes <= body.size(); at += ipc::kFrameBytes) {
        std::span<const uint8_t, ipc::kFrameBytes> bytes(body.data() + at, ipc::kFrameBytes);
        ipc::Frame frame;
        if (!ipc::decode(bytes, frame).ok()) continue;
        std::array<uint8_t, ipc::kFrameBytes> again;
        ipc::encode(frame, again);
        if (!std::equal(again.begin(), again.end(), bytes.begin())) __builtin_trap();
      }
      break;
    }
    case 7:
      try {
        (void)ferry::Descriptor::parse(
            std::string_view(reinterpret_cast<const char*>(body.data()), body.size()));
      } catch (const ferry::Error&) {
      }
      break;
  }
  return 0;
}
