#include "core/crypto.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "core/sys.hpp"
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

struct SigningKey::Key {
  explicit Key(EVP_PKEY* k) : pkey(k) {}
  ~Key() { EVP_PKEY_free(pkey); }
  Key(const Key&) = delete;
  Key& operator=(const Key&) = delete;
  EVP_PKEY* pkey;
};

namespace {

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

struct DigestContext {
  DigestContext() : ctx(EVP_MD_CTX_new()) {
    if (ctx == nullptr) throw Error(ErrorCode::kSystem, "EVP_MD_CTX_new: out of memory");
  }
  ~DigestContext() { EVP_MD_CTX_free(ctx); }
  DigestContext(const DigestContext&) = delete;
  DigestContext& operator=(const DigestContext&) = delete;
  EVP_MD_CTX* ctx;
};

// Writes a new key to `path`, which must not exist (O_EXCL: two engines starting together with
// one file never both write it); false when another process created it first.
bool create_key_file(const std::string& path, EVP_PKEY* key) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) return false;
    throw_if_error(sys_status("identity file: open " + path + " to create it"));
  }
  File f(::fdopen(fd, "w"));
  if (!f) {
    ::close(fd);
    throw_if_error(sys_status("identity file: fdopen " + path));
  }
  if (PEM_write_PrivateKey(f.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1 ||
      std::fflush(f.get()) != 0 || ::fsync(fd) != 0) {
    ::unlink(path.c_str());
    throw Error(ErrorCode::kSystem, "identity file: PEM_write_PrivateKey " + path + " failed");
  }
  return true;
}

}  // namespace

SigningKey::SigningKey(std::shared_ptr<Key> key) : key_(std::move(key)) {
  std::size_t len = public_key_.size();
  if (EVP_PKEY_get_raw_public_key(key_->pkey, public_key_.data(), &len) != 1 ||
      len != public_key_.size()) {
    throw Error(ErrorCode::kSystem, "EVP_PKEY_get_raw_public_key failed");
  }
}

SigningKey SigningKey::generate() {
  EVP_PKEY* pkey = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (pkey == nullptr) throw Error(ErrorCode::kSystem, "EVP_PKEY_Q_keygen(ED25519) failed");
  return SigningKey(std::make_shared<Key>(pkey));
}

SigningKey SigningKey::load_or_create(const std::string& path) {
  for (;;) {
    File f(std::fopen(path.c_str(), "re"));
    if (!f) {
      if (errno != ENOENT) throw_if_error(sys_status("identity file: open " + path));
      SigningKey fresh = generate();
      if (create_key_file(path, fresh.key_->pkey)) return fresh;
      continue;  // another engine created it meanwhile: use theirs
    }
    struct stat st {};
    if (::fstat(::fileno(f.get()), &st) != 0) {
      throw_if_error(sys_status("identity file: fstat " + path));
    }
    // As ssh does with its keys: a private key others can read is no one's identity.
    if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  "identity file " + path + " is accessible by group or others (chmod 600 it)");
    }
    EVP_PKEY* pkey = PEM_read_PrivateKey(f.get(), nullptr, nullptr, nullptr);
    if (pkey == nullptr || EVP_PKEY_get_base_id(pkey) != EVP_PKEY_ED25519) {
      EVP_PKEY_free(pkey);
      throw Error(ErrorCode::kInvalidArgument,
                  "identity file " + path + " holds no Ed25519 private key (PEM)");
    }
    return SigningKey(std::make_shared<Key>(pkey));
  }
}

Signature SigningKey::sign(std::span<const uint8_t> message) const {
  DigestContext d;
  Signature sig{};
  std::size_t len = sig.size();
  if (EVP_DigestSignInit(d.ctx, nullptr, nullptr, nullptr, key_->pkey) != 1 ||
      EVP_DigestSign(d.ctx, sig.data(), &len, message.data(), message.size()) != 1 ||
      len != sig.size()) {
    throw Error(ErrorCode::kSystem, "EVP_DigestSign(ED25519) failed");
  }
  return sig;
}

bool signature_valid(const PublicKey& key, std::span<const uint8_t> message,
                     const Signature& signature) {
  EVP_PKEY* pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, key.data(), key.size());
  if (pkey == nullptr) return false;  // not a point on the curve
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> owned(pkey, EVP_PKEY_free);
  DigestContext d;
  return EVP_DigestVerifyInit(d.ctx, nullptr, nullptr, nullptr, pkey) == 1 &&
         EVP_DigestVerify(d.ctx, signature.data(), signature.size(), message.data(),
                          message.size()) == 1;
}

}  // namespace ferry::core
