#include "core/crypto.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "ferry/error.hpp"

namespace ferry::core {

void random_bytes(std::span<uint8_t> out) {
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1) {
    throw Error(ErrorCode::kSystem, "RAND_bytes: no entropy available");
  }
}

uint64_t random_u64() {
  uint64_t v = 0;
  random_bytes({reinterpret_cast<uint8_t*>(&v), sizeof v});
  return v;
}

Mac hmac_sha256(std::string_view key, std::span<const uint8_t> message) {
  Mac mac{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), message.data(), message.size(),
           mac.data(), &len) == nullptr) {
    throw Error(ErrorCode::kSystem, "HMAC(sha256) failed");
  }
  return mac;
}

bool mac_equal(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace ferry::core
