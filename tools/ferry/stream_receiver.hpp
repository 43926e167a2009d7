// `ferry stream`'s receiver: lends its ring of slots to the sender, hands the chunks written
// into it to its sink in order and returns credits.
#pragma once

#include <atomic>

#include "stream.hpp"

namespace ferry::cli::stream {

// Waits for one sender (--listen) and hands its stream to the sink; the exit code.
int run_receiver(const StreamOptions& o, const std::atomic<bool>& stop);

}  // namespace ferry::cli::stream
