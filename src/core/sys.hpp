// Helpers that turn failed system calls into Status values naming the call.
#pragma once

#include <string_view>

#include "ferry/error.hpp"

namespace ferry::core {

// "connect 10.0.0.1:7000: Connection refused"
Status sys_status(std::string_view call, int err, ErrorCode code = ErrorCode::kSystem);
// Same, with the current errno.
Status sys_status(std::string_view call);

inline void throw_if_error(const Status& s) {
  if (!s.ok()) throw Error(s);
}

}  // namespace ferry::core
