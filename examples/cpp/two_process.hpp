// What every example shares: running its two sides as two processes, and handing the target's
// address and descriptor (the "offer") to the initiator.
//
//   ./example                      both sides on this host: the target runs in a child process
//   ./example target [HOST:PORT]   the target alone; prints its offer line and serves one peer
//   ./example initiator OFFER...   the initiator alone, given the target's offer line
//
// The offer goes through a pipe here; any channel the application has will do (a file, a
// key-value store, a scheduler's environment, or Ferry itself: see descriptor_in_band.cpp).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "ferry/ferry.hpp"

namespace example {

using namespace std::chrono_literals;

// The target's side: `listen` is where to accept its peer ("127.0.0.1:0" by default);
// `publish` hands the offer line to the initiator.
using Target = std::function<void(const std::string& listen,
                                  const std::function<void(const std::string&)>& publish)>;
using Initiator = std::function<void(const std::string& offer)>;

inline ferry::Config listen_config(const std::string& host_port) {
  ferry::Config config;
  auto colon = host_port.rfind(':');
  config.listen_host = host_port.substr(0, colon);
  config.listen_port = static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1)));
  return config;
}

// An offer of "ADDRESS DESCRIPTOR", as the examples' targets publish it.
struct Offer {
  std::string address;
  ferry::Descriptor remote;
};
inline Offer parse_offer(const std::string& offer) {
  std::istringstream in(offer);
  std::string address, blob;
  in >> address >> blob;
  return {address, ferry::Descriptor::parse(blob)};
}

// The initiator leaves by shutting its engine down; the target serves until then.
inline void serve_until_closed(const ferry::Peer& peer) {
  while (peer.connected()) std::this_thread::sleep_for(10ms);
}

// A target that never talks to its peer itself serves until one initiator has come and gone.
// It watches the engine's counts rather than accept(): an initiator that is quickly done may
// leave before accept() would have returned it, and a peer that left is not returned.
inline void serve_one(const ferry::Engine& engine) {
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (engine.stats().peers_admitted == 0) {
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("no initiator connected within 60 s");
    std::this_thread::sleep_for(10ms);
  }
  while (engine.stats().peers > 0) std::this_thread::sleep_for(10ms);
}

inline ferry::Peer accept_one(ferry::Engine& engine) {
  std::optional<ferry::Peer> peer = engine.accept(60s);
  if (!peer) throw std::runtime_error("no initiator connected within 60 s");
  return *peer;
}

inline void check(const ferry::Status& s, const char* what) {
  if (!s.ok()) throw std::runtime_error(std::string(what) + ": " + s.to_string());
}

inline int guarded(const char* side, const std::function<void()>& fn) {
  try {
    fn();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << side << ": " << e.what() << std::endl;
    return 1;
  }
}

inline int run(int argc, char** argv, const Target& target, const Initiator& initiator) {
  std::string role = argc > 1 ? argv[1] : "";
  if (role == "target") {
    std::string listen = argc > 2 ? argv[2] : "127.0.0.1:0";
    return guarded("target", [&] {
      target(listen, [](const std::string& offer) { std::cout << offer << std::endl; });
    });
  }
  if (role == "initiator" && argc > 2) {
    std::string offer;
    for (int i = 2; i < argc; ++i) offer += (i > 2 ? " " : "") + std::string(argv[i]);
    return guarded("initiator", [&] { initiator(offer); });
  }
  if (!role.empty()) {
    std::cerr << "usage: " << argv[0] << " [target [HOST:PORT] | initiator OFFER]\n";
    return 2;
  }
  // Both sides: fork before any engine exists (an engine owns threads, which fork does not copy).
  int fds[2];
  if (pipe(fds) != 0) return 1;
  pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    close(fds[0]);
    int rc = guarded("target", [&] {
      target("127.0.0.1:0", [&](const std::string& offer) {
        std::string line = offer + "\n";
        if (write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size()))
          throw std::runtime_error("cannot hand the offer over");
        close(fds[1]);
      });
    });
    _exit(rc);
  }
  close(fds[1]);
  std::string offer;
  char c;
  while (read(fds[0], &c, 1) == 1 && c != '\n') offer += c;
  close(fds[0]);
  int rc = offer.empty() ? 1 : guarded("initiator", [&] { initiator(offer); });
  int status = 0;
  waitpid(child, &status, 0);
  bool target_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return rc != 0 || !target_ok ? 1 : 0;
}

}  // namespace example
