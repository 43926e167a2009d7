// The HTTP response reader (core/http.hpp) that etcd's answers go through: every framing, fed
// whole and a byte at a time, and malformed or oversized input refused with kProtocol.
#include "core/http.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/etcd.hpp"

namespace ferry {
namespace {

struct Read {
  Status status;
  int code = 0;
  bool complete = false;
  std::string body;
};

// Feeds `wire` in pieces of `step` bytes (0: whole), then the connection's end when `close`.
Read read(const std::string& wire, std::size_t step, bool close, std::size_t max_body = 1 << 20) {
  core::HttpResponseReader reader(max_body);
  Read r;
  for (std::size_t at = 0; at < wire.size() && r.status.ok();) {
    std::size_t n = step == 0 ? wire.size() : std::min(step, wire.size() - at);
    r.status = reader.feed(std::string_view(wire).substr(at, n));
    at += n;
  }
  if (r.status.ok() && close) r.status = reader.finish();
  r.code = reader.status();
  r.complete = reader.complete();
  r.body = reader.body();
  return r;
}

void expect_body(const std::string& wire, bool close, const std::string& body, int code = 200) {
  for (std::size_t step : {0, 1, 2, 7}) {
    Read r = read(wire, step, close);
    EXPECT_TRUE(r.status.ok()) << step << ": " << r.status.to_string();
    EXPECT_TRUE(r.complete) << step;
    EXPECT_EQ(r.code, code) << step;
    EXPECT_EQ(r.body, body) << step;
  }
}

TEST(HttpResponseReader, ReadsEveryFramingWholeAndInPieces) {
  expect_body("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello", false, "hello");
  expect_body("HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}", false, "{}", 404);
  expect_body(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n1;ext=1\r\n \r\nA\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\n",
      false, "hello 0123456789");
  expect_body("HTTP/1.0 200 OK\r\n\r\nuntil the end", true, "until the end");
  expect_body("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 1\r\n\r\nx",
              false, "x", 201);
  expect_body("HTTP/1.1 204 No Content\r\n\r\n", false, "", 204);
  expect_body("HTTP/1.1 200 OK\nContent-Length: 2\n\nok", false, "ok");  // bare newlines
}

TEST(HttpResponseReader, ABodyStreamedInChunksCanBeTakenAsItComes) {
  core::HttpResponseReader reader(16);
  ASSERT_TRUE(reader.feed("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").ok());
  EXPECT_TRUE(reader.headers_done());
  // More than the cap in all, never more than it held at once.
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(reader.feed("8\r\n{\"a\":1}\n\r\n").ok()) << i;
    EXPECT_EQ(reader.body(), "{\"a\":1}\n");
    reader.body().clear();
  }
  EXPECT_FALSE(reader.complete());
  EXPECT_EQ(reader.finish().code(), ErrorCode::kPeerLost);
}

TEST(HttpResponseReader, RefusesMalformedAndOversizedResponses) {
  const std::string big_headers = "HTTP/1.1 200 OK\r\n" + std::string(20000, 'x') + ": y\r\n\r\n";
  const char* bad[] = {
      "HTTP/2 200 OK\r\n\r\n",
      "HTTP/1.1 2x0 OK\r\n\r\n",
      "HTTP/1.1 200OK\r\n\r\n",
      "SSH-2.0-OpenSSH\r\n\r\n",
      "HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFFFF\r\n",
  };
  for (const char* wire : bad) {
    for (std::size_t step : {0, 1}) {
      Read r = read(wire, step, false);
      EXPECT_EQ(r.status.code(), ErrorCode::kProtocol) << wire << " step " << step;
    }
  }
  EXPECT_EQ(read(big_headers, 0, false).status.code(), ErrorCode::kProtocol);
  EXPECT_EQ(
      read(std::string("HTTP/1.1 200 OK\r\n") + std::string(20000, 'x'), 0, false).status.code(),
      ErrorCode::kProtocol);  // a line that never ends
  Read over = read("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789", 0, false, 9);
  EXPECT_EQ(over.status.code(), ErrorCode::kProtocol);
  EXPECT_NE(over.status.message().find("over 9 bytes"), std::string::npos);
  // Cut short: the connection's end before the body's.
  EXPECT_EQ(read("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234", 0, true).status.code(),
            ErrorCode::kPeerLost);
  EXPECT_EQ(read("HTTP/1.1 200 OK\r\nContent-", 0, true).status.code(), ErrorCode::kPeerLost);
}

TEST(HttpUrl, TakesHostAndPortOnly) {
  core::HostPort hp;
  ASSERT_TRUE(core::parse_http_url("http://10.0.0.1:2379/", hp).ok());
  EXPECT_EQ(hp.host, "10.0.0.1");
  EXPECT_EQ(hp.port, 2379);
  ASSERT_TRUE(core::parse_http_url("http://[::1]:2379", hp).ok());
  EXPECT_EQ(hp.host, "::1");
  EXPECT_EQ(core::parse_http_url("https://h:1", hp).code(), ErrorCode::kUnsupported);
  for (const char* bad : {"h:1", "http://h", "http://h:1/v3", "http://:1", "ftp://h:1", ""}) {
    EXPECT_EQ(core::parse_http_url(bad, hp).code(), ErrorCode::kInvalidArgument) << bad;
  }
  std::vector<core::HostPort> endpoints;
  ASSERT_TRUE(core::EtcdClient::parse_endpoints("http://a:1,http://b:2", endpoints).ok());
  ASSERT_EQ(endpoints.size(), 2u);
  EXPECT_EQ(endpoints[1].to_string(), "b:2");
  for (const char* bad : {"http://a:1,", ",http://a:1", "http://a:1,,http://b:2"}) {
    EXPECT_EQ(core::EtcdClient::parse_endpoints(bad, endpoints).code(), ErrorCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace ferry
