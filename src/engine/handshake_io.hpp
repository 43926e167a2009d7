// A handshake connection's bytes, moved without blocking, for both halves of the handshake
// (listener.cpp, dialer.cpp): the control frame being read, which grows only with the bytes
// that arrived (so a silent or trickling peer holds no more than it sent), and the frames
// queued to send.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/frame.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

class HandshakeIo {
 public:
  HandshakeIo() = default;
  explicit HandshakeIo(int sock) : sock_(sock) {}

  // Reads what has arrived of the next control frame, once (`progressed`: bytes came). When it
  // is whole, `frame` holds it (header and body) and reading starts over; else `frame` is left
  // empty. A frame that is not a control frame, or the connection ending, is an error.
  Status read(bool& progressed, core::FrameHeader& header, std::vector<uint8_t>& frame);
  // Queues `frame` behind what is not sent yet, and sends what the socket takes.
  Status queue(std::span<const uint8_t> frame);
  // Sends what the socket takes of the queued bytes.
  Status flush();
  // Bytes queued and not yet taken by the socket.
  bool sending() const { return done_ < out_.size(); }
  // Nothing of a frame is half sent (an error frame now would not garble one).
  bool idle() const { return out_.empty(); }

 private:
  int sock_ = -1;
  std::vector<uint8_t> in_;
  std::vector<uint8_t> out_;
  std::size_t done_ = 0;
};

}  // namespace ferry::detail
