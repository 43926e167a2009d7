// Randomness, HMAC-SHA256 and Ed25519 signatures (OpenSSL's libcrypto) for ids, keys and the
// handshake.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace ferry::core {

using Mac = std::array<uint8_t, 32>;
using PublicKey = std::array<uint8_t, 32>;  // Ed25519, raw
using Signature = std::array<uint8_t, 64>;

void random_bytes(std::span<uint8_t> out);
uint64_t random_u64();
Mac hmac_sha256(std::string_view key, std::span<const uint8_t> message);
// Constant-time comparison, so a forger learns nothing from timing.
bool mac_equal(const Mac& a, const Mac& b);

// An Ed25519 key pair: an engine's identity. Copies share the key.
class SigningKey {
 public:
  // A new random key, kept only in memory.
  static SigningKey generate();
  // The key in `path` (PEM, PKCS#8, as `openssl genpkey -algorithm ed25519` writes it); a
  // missing file is created with a new key, readable by its owner only. Throws kInvalidArgument
  // for a file that is not an Ed25519 private key or that others may read, kSystem when it cannot
  // be read or written.
  static SigningKey load_or_create(const std::string& path);

  const PublicKey& public_key() const { return public_key_; }
  Signature sign(std::span<const uint8_t> message) const;

 private:
  struct Key;
  explicit SigningKey(std::shared_ptr<Key> key);
  std::shared_ptr<Key> key_;
  PublicKey public_key_{};
};

// Whether `signature` is `key`'s Ed25519 signature of `message`.
bool signature_valid(const PublicKey& key, std::span<const uint8_t> message,
                     const Signature& signature);

}  // namespace ferry::core
