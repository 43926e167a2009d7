#include "core/locality.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <string>
#include <vector>

#include "core/crypto.hpp"

namespace ferry::core {
namespace {

std::string link_target(const char* path) {
  std::array<char, 256> buf{};
  ssize_t n = ::readlink(path, buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<std::size_t>(n)) : std::string();
}

std::array<uint8_t, 16> compute_host_id() {
  std::array<uint8_t, 16> id{};
  std::string boot_id;
  std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), boot_id);
  if (boot_id.empty()) {
    random_bytes(id);  // unknown host: never taken for the same one
    return id;
  }
  std::string facts =
      boot_id + '\n' + link_target("/proc/self/ns/pid") + '\n' + link_target("/proc/self/ns/net");
  Mac mac = hmac_sha256("ferry-host-id-v1",
                        {reinterpret_cast<const uint8_t*>(facts.data()), facts.size()});
  std::copy_n(mac.begin(), id.size(), id.begin());
  return id;
}

}  // namespace

Locality this_locality() {
  static const std::array<uint8_t, 16> host = compute_host_id();
  // getpid() each time: a forked child is another process.
  return {host, static_cast<uint32_t>(::getpid())};
}

Reach reach_between(const Locality& us, const Locality& them) {
  if (us.host != them.host) return Reach::kOtherHost;
  return us.process == them.process ? Reach::kSameProcess : Reach::kSameHost;
}

}  // namespace ferry::core

namespace ferry {

std::string_view to_string(Reach reach) noexcept {
  switch (reach) {
    case Reach::kSameProcess:
      return "same process";
    case Reach::kSameHost:
      return "same host";
    case Reach::kOtherHost:
      return "other host";
  }
  return "unknown";
}

}  // namespace ferry
