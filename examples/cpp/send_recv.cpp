// Tagged send/recv: the initiator sends requests on one tag; the target answers each on
// another. Messages of one tag arrive in order; a receive may be posted before or after the
// matching send.
#include <cstring>
#include <sstream>
#include <vector>

#include "two_process.hpp"

using namespace std::chrono_literals;

constexpr uint64_t kRequestTag = 1;
constexpr uint64_t kReplyTag = 2;
constexpr int kRequests = 8;
constexpr std::size_t kMaxMessage = 256;

void target(const std::string& listen, const std::function<void(const std::string&)>& publish) {
  ferry::Engine engine(example::listen_config(listen));
  publish(engine.address());  // messages need no descriptor
  ferry::Peer peer = example::accept_one(engine);
  std::vector<char> inbox(kMaxMessage), outbox(kMaxMessage);
  ferry::Region in = engine.register_memory(inbox.data(), inbox.size(), ferry::Access::kLocal);
  ferry::Region out = engine.register_memory(outbox.data(), outbox.size(), ferry::Access::kLocal);
  for (int i = 0; i < kRequests; ++i) {
    ferry::Future request = peer.recv(kRequestTag, in, 0, kMaxMessage);
    example::check(request.wait(10s), "recv request");
    std::string reply = "re: " + std::string(inbox.data(), request.bytes());
    std::memcpy(outbox.data(), reply.data(), reply.size());
    example::check(peer.send(kReplyTag, out, 0, reply.size()).wait(10s), "send reply");
  }
  std::cout << "target: answered " << kRequests << " requests" << std::endl;
  example::serve_until_closed(peer);
}

void initiator(const std::string& offer) {
  ferry::Engine engine({.listen = false});
  ferry::Peer peer = engine.connect(offer);
  std::vector<char> outbox(kMaxMessage), inbox(kMaxMessage);
  ferry::Region out = engine.register_memory(outbox.data(), outbox.size(), ferry::Access::kLocal);
  ferry::Region in = engine.register_memory(inbox.data(), inbox.size(), ferry::Access::kLocal);
  for (int i = 0; i < kRequests; ++i) {
    std::string request = "request " + std::to_string(i);
    std::memcpy(outbox.data(), request.data(), request.size());
    // Post the receive for the reply first: the reply may come back before send() returns.
    ferry::Future reply = peer.recv(kReplyTag, in, 0, kMaxMessage);
    example::check(peer.send(kRequestTag, out, 0, request.size()).wait(10s), "send request");
    example::check(reply.wait(10s), "recv reply");
    std::string text(inbox.data(), reply.bytes());
    if (text != "re: " + request) throw std::runtime_error("unexpected reply '" + text + "'");
  }
  std::cout << "initiator: " << kRequests << " requests answered in order" << std::endl;
}

int main(int argc, char** argv) { return example::run(argc, argv, target, initiator); }
