// The same-host channel's set-up socket (an abstract AF_UNIX SOCK_SEQPACKET socket): its name,
// and messages that carry files (SCM_RIGHTS): rings and bells at set-up, lent regions' files
// after. Shared by the channel and the tests that play a hostile peer.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/net.hpp"
#include "ferry/error.hpp"
#include "transport/shm/shm_wire.hpp"

namespace ferry::transport::shm {

// A HELLO record's payload: the listener's token, then whether the dialer read its probe.
constexpr std::size_t kHelloBytes = sizeof(Nonce) + 1;
// Descriptors a socket message's control buffer holds: one or two belong (a lent region's
// file; a ring and its bell); room for a few more so that the kernel hands extra ones over (to
// be closed) rather than drop them silently with MSG_CTRUNC.
constexpr std::size_t kControlSpaceFds = 4;
using Files = std::array<core::Fd, kControlSpaceFds>;

// Sends `bytes` with `files` attached (SCM_RIGHTS); `full` when the socket has no room.
Status send_with_files(int fd, std::span<const uint8_t> bytes, std::span<const int> files,
                       bool& full);
// Receives one message into `into` (`length` its size, 0 when none waits) and the files it
// carries, every one owned before anything is checked so that none leaks.
Status receive_with_files(int fd, std::span<uint8_t> into, std::size_t& length, Files& files,
                          std::size_t& file_count);
// The abstract socket address of the listener's socket `name`; returns its length.
socklen_t abstract_address(const Nonce& name, sockaddr_un& out);

}  // namespace ferry::transport::shm
