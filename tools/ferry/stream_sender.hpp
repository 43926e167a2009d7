// `ferry stream`'s sender: fills slots from its source and writes them into the receiver's
// ring with write_with_imm, as far as the receiver's credits allow.
#pragma once

#include <atomic>

#include "stream.hpp"

namespace ferry::cli::stream {

// Connects to the receiver (--connect) and streams the source to it; the exit code.
int run_sender(const StreamOptions& o, const std::atomic<bool>& stop);

}  // namespace ferry::cli::stream
