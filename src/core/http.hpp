// A small HTTP/1.1 client for JSON services (etcd's gateway, docs/discovery.md): plain http,
// POST only, one request per connection ("Connection: close"), every response's size capped, and
// every wait bounded by the caller's deadline (a stream's, by its wake descriptor as well).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/net.hpp"
#include "ferry/error.hpp"

namespace ferry::core {

// "http://host:port" with an optional trailing '/'. https: kUnsupported (no TLS here); anything
// else, a path included: kInvalidArgument.
Status parse_http_url(std::string_view url, HostPort& out);

// Reads one response as its bytes arrive: the status line, the headers, then a body delimited by
// Content-Length, by chunks, or by the connection's end. Malformed input, and a body or header
// section over its cap, are kProtocol errors naming what was wrong; after one, feed() refuses
// everything.
class HttpResponseReader {
 public:
  static constexpr std::size_t kMaxHeaderBytes = 16 << 10;

  explicit HttpResponseReader(std::size_t max_body) : max_body_(max_body) {}

  Status feed(std::string_view bytes);
  // The connection ended: completes a body delimited by it; anything else cut short is kPeerLost.
  Status finish();

  bool headers_done() const { return state_ > State::kHeaders; }
  int status() const { return status_; }
  bool complete() const { return state_ == State::kDone; }
  // The body decoded so far. A streaming reader erases what it has taken from its front: the
  // cap bounds what is held, so a stream may run for ever.
  std::string& body() { return body_; }

 private:
  enum class State {
    kStatusLine,
    kHeaders,
    kBody,
    kChunkSize,
    kChunkData,
    kChunkEnd,
    kTrailers,
    kDone,
    kFailed
  };
  // Takes one CRLF-terminated line from the front of pending_; false when none is complete.
  bool take_line(std::string& line);
  Status fail(const std::string& what);
  Status header_line(const std::string& line);
  Status add_body(std::string_view bytes);

  const std::size_t max_body_;
  State state_ = State::kStatusLine;
  std::string pending_;  // bytes not yet parsed
  std::size_t pos_ = 0;  // how much of pending_ is parsed
  std::size_t header_bytes_ = 0;
  int status_ = 0;
  bool chunked_ = false;
  bool has_length_ = false;
  uint64_t length_ = 0;  // what is left of the Content-Length or of the current chunk
  std::string body_;
};

// POSTs the JSON `body` to `path` and reads the whole response into `status` and `response`.
// Failures to connect (kConnectFailed), to finish by `deadline` (kTimeout) or to read a
// well-formed response (kProtocol, kPeerLost) name the server; an HTTP error status is not one
// (the caller reads it, and the service's error text in the body).
Status http_post(const HostPort& server, std::string_view path, std::string_view body,
                 Deadline deadline, std::size_t max_response, int& status, std::string& response);

// A POST whose response arrives over a long time, a line at a time (etcd's watch).
class HttpStream {
 public:
  // `max_line`: the longest line held before it is taken.
  explicit HttpStream(std::size_t max_line) : reader_(max_line) {}
  // Connects, sends the request and reads the status line and headers; a status other than 2xx
  // is kProtocol with the body's start. `wake` readable ends any wait with kCancelled.
  Status open(const HostPort& server, std::string_view path, std::string_view body,
              Deadline deadline, int wake);
  // The next complete line of the body (its newline removed), waiting until `deadline`.
  Status next_line(std::string& line, Deadline deadline, int wake);

 private:
  std::string where_;
  Fd fd_;
  HttpResponseReader reader_;
};

}  // namespace ferry::core
