#include "core/http.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>

namespace ferry::core {
namespace {
bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Bodies and chunks beyond this are refused before any byte of them is held: far above every
// cap a caller sets, and far below where the counting could overflow.
constexpr uint64_t kMaxDeclaredLength = uint64_t{1} << 40;

bool parse_number(std::string_view text, int base, uint64_t& out) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out, base);
  return ec == std::errc() && end == text.data() + text.size() && out <= kMaxDeclaredLength;
}

std::string excerpt(std::string_view text) {
  constexpr std::size_t kMax = 200;
  return std::string(text.substr(0, kMax)) + (text.size() > kMax ? "..." : "");
}

std::string request(const HostPort& server, std::string_view path, std::string_view body) {
  std::string r;
  r.reserve(160 + path.size() + body.size());
  r.append("POST ").append(path).append(" HTTP/1.1\r\nHost: ").append(server.to_string());
  r.append("\r\nContent-Type: application/json\r\nContent-Length: ");
  r.append(std::to_string(body.size())).append("\r\nConnection: close\r\n\r\n").append(body);
  return r;
}

// A stream may be silent for hours while nothing changes; a server gone without closing it is
// noticed by TCP keepalive probes and the unacknowledged-data timeout within this.
constexpr std::chrono::seconds kStreamSilence{15};

std::span<const uint8_t> as_bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
}  // namespace

Status parse_http_url(std::string_view url, HostPort& out) {
  constexpr std::string_view kScheme = "http://";
  if (url.starts_with("https://")) {
    return {ErrorCode::kUnsupported, "'" + std::string(url) + "': https is not supported"};
  }
  if (!url.starts_with(kScheme)) {
    return {ErrorCode::kInvalidArgument, "'" + std::string(url) + "': expected http://host:port"};
  }
  std::string_view rest = url.substr(kScheme.size());
  if (rest.ends_with('/')) rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos) {
    return {ErrorCode::kInvalidArgument,
            "'" + std::string(url) + "': expected http://host:port, without a path"};
  }
  // parse_host_port reads ":port" as any host, which names no server to connect to.
  Status s = parse_host_port(rest, out);
  if (s.ok() && (rest.starts_with(':') || out.host.empty() || out.port == 0)) {
    return {ErrorCode::kInvalidArgument, "'" + std::string(url) + "': expected http://host:port"};
  }
  return s;
}

Status HttpResponseReader::fail(const std::string& what) {
  state_ = State::kFailed;
  return {ErrorCode::kProtocol, "HTTP response: " + what};
}

bool HttpResponseReader::take_line(std::string& line) {
  std::size_t nl = pending_.find('\n', pos_);
  if (nl == std::string::npos) return false;
  std::size_t end = nl > pos_ && pending_[nl - 1] == '\r' ? nl - 1 : nl;
  line.assign(pending_, pos_, end - pos_);
  pos_ = nl + 1;
  return true;
}

Status HttpResponseReader::add_body(std::string_view bytes) {
  if (body_.size() + bytes.size() > max_body_) {
    return fail("body over " + std::to_string(max_body_) + " bytes");
  }
  body_.append(bytes);
  return {};
}

Status HttpResponseReader::header_line(const std::string& line) {
  if (state_ == State::kStatusLine) {
    // "HTTP/1.1 200 OK"
    if (line.size() < 12 || !line.starts_with("HTTP/1.") || line[8] != ' ' ||
        !std::all_of(line.begin() + 9, line.begin() + 12,
                     [](char c) { return c >= '0' && c <= '9'; }) ||
        (line.size() > 12 && line[12] != ' ')) {
      return fail("bad status line '" + excerpt(line) + "'");
    }
    status_ = std::stoi(line.substr(9, 3));
    state_ = State::kHeaders;
    return {};
  }
  if (!line.empty()) {
    std::size_t colon = line.find(':');
    if (colon == std::string::npos || colon == 0) {
      return fail("bad header line '" + excerpt(line) + "'");
    }
    std::string_view name(line.data(), colon);
    std::string_view value = trim(std::string_view(line).substr(colon + 1));
    if (iequals(name, "Content-Length")) {
      uint64_t n = 0;
      if (!parse_number(value, 10, n) || (has_length_ && n != length_)) {
        return fail("bad Content-Length '" + excerpt(value) + "'");
      }
      has_length_ = true;
      length_ = n;
    } else if (iequals(name, "Transfer-Encoding")) {
      if (!iequals(value, "chunked"))
        return fail("unsupported Transfer-Encoding '" + excerpt(value) + "'");
      chunked_ = true;
    }
    return {};
  }
  // The blank line ends the headers. An interim response (100 Continue) comes before the real one.
  if (status_ >= 100 && status_ < 200) {
    state_ = State::kStatusLine;
    has_length_ = chunked_ = false;
    return {};
  }
  if (status_ == 204 || status_ == 304 || (has_length_ && !chunked_ && length_ == 0)) {
    state_ = State::kDone;
  } else {
    state_ = chunked_ ? State::kChunkSize : State::kBody;
  }
  return {};
}

Status HttpResponseReader::feed(std::string_view bytes) {
  if (state_ == State::kFailed) return {ErrorCode::kProtocol, "HTTP response: already failed"};
  if (state_ == State::kDone) return {};  // what follows a complete response is not ours
  pending_.append(bytes);
  std::string line;
  while (state_ != State::kDone && state_ != State::kFailed) {
    std::string_view left = std::string_view(pending_).substr(pos_);
    if (state_ == State::kBody || state_ == State::kChunkData) {
      if (left.empty()) break;
      std::size_t n =
          has_length_ || chunked_ ? std::min<uint64_t>(left.size(), length_) : left.size();
      if (Status s = add_body(left.substr(0, n)); !s.ok()) return s;
      pos_ += n;
      if (has_length_ || chunked_) length_ -= n;
      if ((has_length_ || chunked_) && length_ == 0) {
        state_ = chunked_ ? State::kChunkEnd : State::kDone;
      }
      continue;
    }
    std::size_t before = pos_;
    // A line over the cap is refused whether its end came with it or not: the verdict does not
    // depend on how the bytes were cut.
    bool whole = take_line(line);
    if ((whole ? line.size() : left.size()) > kMaxHeaderBytes) {
      return fail("line over " + std::to_string(kMaxHeaderBytes) + " bytes");
    }
    if (!whole) break;
    if (state_ == State::kStatusLine || state_ == State::kHeaders || state_ == State::kTrailers) {
      header_bytes_ += pos_ - before;
      if (header_bytes_ > kMaxHeaderBytes) {
        return fail("headers over " + std::to_string(kMaxHeaderBytes) + " bytes");
      }
    }
    switch (state_) {
      case State::kStatusLine:
      case State::kHeaders:
        if (Status s = header_line(line); !s.ok()) return s;
        break;
      case State::kChunkSize: {
        std::string_view size = trim(std::string_view(line).substr(0, line.find(';')));
        if (!parse_number(size, 16, length_)) return fail("bad chunk size '" + excerpt(line) + "'");
        state_ = length_ == 0 ? State::kTrailers : State::kChunkData;
        break;
      }
      case State::kChunkEnd:
        if (!line.empty()) return fail("chunk longer than its size");
        state_ = State::kChunkSize;
        break;
      case State::kTrailers:
        if (line.empty()) state_ = State::kDone;
        break;
      default:
        break;
    }
  }
  pending_.erase(0, pos_);
  pos_ = 0;
  return {};
}

Status HttpResponseReader::finish() {
  if (state_ == State::kBody && !has_length_ && !chunked_) state_ = State::kDone;
  if (state_ == State::kDone) return {};
  if (state_ == State::kFailed) return {ErrorCode::kProtocol, "HTTP response: already failed"};
  state_ = State::kFailed;
  return {ErrorCode::kPeerLost, "HTTP response: connection closed before its end"};
}

namespace {
// Connects and sends the request; `where` names it in every error after.
Status send_request(const HostPort& server, std::string_view path, std::string_view body,
                    Deadline deadline, int wake, Fd& fd, std::string& where) {
  where = "http://" + server.to_string() + std::string(path);
  const int wakes[] = {wake};
  Status s = connect_tcp(server, deadline, fd, wake >= 0 ? wakes : std::span<const int>{});
  if (s.ok()) s = write_all(fd.get(), as_bytes(request(server, path, body)), deadline);
  return s.ok() ? s : Status(s.code(), where + ": " + s.message());
}

// Feeds `reader` what arrives next, or the connection's end.
Status read_more(int fd, HttpResponseReader& reader, Deadline deadline, int wake,
                 const std::string& where) {
  std::array<uint8_t, 16 << 10> buf;
  std::size_t got = 0;
  const int wakes[] = {wake};
  Status s = read_some(fd, buf, deadline, got, wake >= 0 ? wakes : std::span<const int>{});
  if (s.ok()) {
    s = got == 0 ? reader.finish() : reader.feed({reinterpret_cast<const char*>(buf.data()), got});
  }
  return s.ok() ? s : Status(s.code(), where + ": " + s.message());
}
}  // namespace

Status http_post(const HostPort& server, std::string_view path, std::string_view body,
                 Deadline deadline, std::size_t max_response, int& status, std::string& response) {
  Fd fd;
  std::string where;
  if (Status s = send_request(server, path, body, deadline, -1, fd, where); !s.ok()) return s;
  HttpResponseReader reader(max_response);
  while (!reader.complete()) {
    if (Status s = read_more(fd.get(), reader, deadline, -1, where); !s.ok()) return s;
  }
  status = reader.status();
  response = std::move(reader.body());
  return {};
}

Status HttpStream::open(const HostPort& server, std::string_view path, std::string_view body,
                        Deadline deadline, int wake) {
  if (Status s = send_request(server, path, body, deadline, wake, fd_, where_); !s.ok()) return s;
  tune_socket(fd_.get(), kStreamSilence);
  while (!reader_.headers_done()) {
    if (Status s = read_more(fd_.get(), reader_, deadline, wake, where_); !s.ok()) return s;
  }
  if (reader_.status() / 100 != 2) {
    // The error's text, as much of it as comes quickly.
    while (!reader_.complete() && reader_.body().size() < 200 &&
           read_more(fd_.get(), reader_, deadline, wake, where_).ok()) {
    }
    return {ErrorCode::kProtocol,
            where_ + ": HTTP " + std::to_string(reader_.status()) + " " + excerpt(reader_.body())};
  }
  return {};
}

Status HttpStream::next_line(std::string& line, Deadline deadline, int wake) {
  for (;;) {
    std::string& body = reader_.body();
    std::size_t nl = body.find('\n');
    if (nl != std::string::npos) {
      line.assign(body, 0, nl);
      body.erase(0, nl + 1);
      return {};
    }
    if (reader_.complete()) return {ErrorCode::kPeerLost, where_ + ": the stream ended"};
    if (Status s = read_more(fd_.get(), reader_, deadline, wake, where_); !s.ok()) return s;
  }
}

}  // namespace ferry::core
