// Whether this process is a child forked from the one that made an object. A forked child has
// none of its parent's threads, and shares its parent's sockets: an engine used or torn down
// there would break the parent's connections (a goodbye on a shared socket) or join threads that
// do not exist. Objects record the fork generation at birth and go inert when it changes.
#pragma once

#include <cstdint>

#include "ferry/error.hpp"

namespace ferry::core {

// How many forks separate this process from the first one that asked (0 there); counted by a
// pthread_atfork child handler installed on the first call. One relaxed load after that.
uint64_t fork_generation() noexcept;

// kInvalidArgument naming `call` when `born` (a fork_generation() reading taken when the object
// was made) is not the current one; else ok.
Status forked_child_refusal(uint64_t born, const char* call);
// Throws that refusal.
void refuse_in_forked_child(uint64_t born, const char* call);

}  // namespace ferry::core
