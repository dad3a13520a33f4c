#include "serve/http_connection.h"

#include <fmt/format.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <chrono>

#include "serve/metrics.h"
#include "serve/openai_api.h"

namespace hyperion::serve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

// The bytes every reply starts with (respond and begin_stream write HTTP/1.1 status lines).
constexpr std::string_view kReplyPrefix = "HTTP/1.1 ";

std::string error_json(int status, const std::string& message) {
  ApiError e;
  e.status = status;
  e.message = message;
  return error_body(e);
}

}  // namespace

HttpConnection::HttpConnection(net::ip::tcp::socket socket, HttpApplication& app,
                               const HttpLimits& limits)
    : stream_(std::move(socket)),
      buffer_(limits.buffer_limit),
      app_(app),
      limits_(limits),
      probe_timer_(stream_.get_executor()) {}

HttpConnection::~HttpConnection() {
  app_.connection_closed();
}

void HttpConnection::start() {
  // A new connection owes a request head from the moment it is accepted: its deadline is
  // header_timeout_s, not the idle keep-alive timeout, or silent connections would hold
  // every max_connections place for idle_timeout_s.
  // One accepted just before drain() closed the acceptor is missed by its sweep of idle
  // connections: it closes itself.
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
    if (self->app_.draining()) return self->close();
    self->read_header();
  });
}

void HttpConnection::post(std::function<void()> fn) {
  net::post(stream_.get_executor(), std::move(fn));
}

// Between requests on a kept-alive connection: wait for the first byte of the next one
// (idle timeout), unless pipelined bytes are already here.
void HttpConnection::wait_for_request() {
  if (closed_) return;
  if (buffer_.size() > 0) return read_header();
  if (app_.draining() || !keep_alive_ || peer_eof_) return close();
  stream_.expires_after(seconds(limits_.idle_timeout_s));
  stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](
                                                     beast::error_code ec, size_t n) {
    if (ec) {
      if (ec == beast::error::timeout) self->app_.metrics().http_timeouts.inc();
      return self->close();
    }
    self->buffer_.commit(n);
    self->read_header();
  });
}

void HttpConnection::read_header() {
  if (closed_) return;
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(limits_.header_limit));
  parser_->body_limit(limits_.body_limit);
  // One deadline for the whole head, however it trickles in (a client sending a header
  // line every few seconds is cut at header_timeout_s, not kept forever).
  stream_.expires_after(seconds(limits_.header_timeout_s));
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            self->on_header(ec);
                          });
}

void HttpConnection::on_header(beast::error_code ec) {
  if (closed_) return;
  if (ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted)
      return close();
    if (ec == beast::error::timeout) {
      // The stream closes itself on a deadline: no 408 can be sent (as nginx, the
      // connection is just cut).
      app_.metrics().http_timeouts.inc();
      return close();
    }
    if (ec == http::error::header_limit)
      return protocol_error(431, fmt::format("the request head exceeds {} bytes",
                                             limits_.header_limit));
    if (ec == http::error::body_limit)
      return protocol_error(413, fmt::format("the request body exceeds {} bytes",
                                             limits_.body_limit));
    return protocol_error(400, fmt::format("malformed HTTP request: {}", ec.message()));
  }
  const HttpRequest& req = parser_->get();
  http10_ = req.version() < 11;
  keep_alive_ = req.keep_alive() && !http10_;
  if (parser_->is_done()) return on_body({});
  const auto expect = req.find(http::field::expect);
  if (expect != req.end() && beast::iequals(expect->value(), "100-continue"))
    send("HTTP/1.1 100 Continue\r\n\r\n");
  stream_.expires_after(seconds(limits_.request_timeout_s));
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code e, size_t) { self->on_body(e); });
}

void HttpConnection::on_body(beast::error_code ec) {
  if (closed_) return;
  if (ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted)
      return close();
    if (ec == beast::error::timeout) {
      app_.metrics().http_timeouts.inc();
      return close();
    }
    if (ec == http::error::body_limit)
      return protocol_error(413, fmt::format("the request body exceeds {} bytes",
                                             limits_.body_limit));
    return protocol_error(400, fmt::format("malformed HTTP request body: {}", ec.message()));
  }
  busy_ = true;
  chunked_ = false;
  last_queued_ = false;
  reply_begun_ = false;
  cancel_hook_ = nullptr;
  stream_.expires_never();  // each reply write sets its own deadline
  HttpRequest req = parser_->release();
  parser_.reset();
  watch_disconnect();
  app_.handle(shared_from_this(), std::move(req));
  // A pipelined request read after the client shut its sending side.
  if (peer_eof_) probe_closed_client();
}

void HttpConnection::protocol_error(int status, const std::string& message) {
  app_.metrics().http_bad_requests.inc();
  busy_ = true;
  keep_alive_ = false;
  respond(status, "application/json", error_json(status, message), {}, /*close=*/true);
}

void HttpConnection::respond(int status, const std::string& content_type, std::string body,
                             const HttpHeaders& extra, bool close_after) {
  if (closed_ || last_queued_) return;
  if (close_after || app_.draining()) keep_alive_ = false;
  std::string head = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: {}\r\n", status,
      std::string_view(http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)))),
      content_type, body.size(), keep_alive_ ? "keep-alive" : "close");
  for (const auto& [name, value] : extra) head += fmt::format("{}: {}\r\n", name, value);
  head += "\r\n";
  head += body;
  last_queued_ = true;
  reply_begun_ = true;
  if (prefix_sent_) head.erase(0, kReplyPrefix.size());
  send(std::move(head));
}

void HttpConnection::begin_stream(const std::string& content_type) {
  if (closed_) return;
  // HTTP/1.0 has no chunked encoding: the stream then ends when the connection closes.
  chunked_ = !http10_;
  if (app_.draining()) keep_alive_ = false;
  reply_begun_ = true;
  std::string head =
      fmt::format("HTTP/1.1 200 OK\r\nContent-Type: {}\r\nCache-Control: no-cache\r\n{}"
                  "Connection: {}\r\n\r\n",
                  content_type, chunked_ ? "Transfer-Encoding: chunked\r\n" : "",
                  keep_alive_ ? "keep-alive" : "close");
  if (prefix_sent_) head.erase(0, kReplyPrefix.size());
  send(std::move(head));
}

void HttpConnection::stream_write(std::string data) {
  if (closed_ || data.empty()) return;
  if (chunked_)
    send(fmt::format("{:x}\r\n", data.size()) + data + "\r\n");
  else
    send(std::move(data));
}

void HttpConnection::stream_end() {
  if (closed_ || last_queued_) return;
  last_queued_ = true;
  if (chunked_)
    send("0\r\n\r\n");
  else
    send(std::string());
}

void HttpConnection::send(std::string bytes) {
  if (closed_) return;
  out_.push_back(std::move(bytes));
  if (!writing_) flush();
}

void HttpConnection::flush() {
  // Everything queued goes out in one write.
  while (out_.size() > 1) {
    std::string next = std::move(out_[1]);
    out_.erase(out_.begin() + 1);
    out_.front() += next;
  }
  writing_ = true;
  stream_.expires_after(seconds(limits_.write_timeout_s));
  net::async_write(stream_, net::buffer(out_.front()),
                   [self = shared_from_this()](beast::error_code ec, size_t) {
                     self->on_written(ec);
                   });
}

void HttpConnection::on_written(beast::error_code ec) {
  writing_ = false;
  if (ec) {
    if (ec == beast::error::timeout) app_.metrics().http_timeouts.inc();
    return close();
  }
  out_.pop_front();
  if (!out_.empty()) return flush();
  if (last_queued_) reply_complete();
}

void HttpConnection::reply_complete() {
  busy_ = false;
  last_queued_ = false;
  cancel_hook_ = nullptr;
  prefix_sent_ = false;
  probing_ = false;
  probe_timer_.cancel();
  if (!keep_alive_) {
    beast::error_code ignored;
    stream_.socket().shutdown(net::ip::tcp::socket::shutdown_send, ignored);
    return close();
  }
  if (watching_) {
    // The watch read holds the socket; cancel it and continue from its handler.
    resume_after_watch_ = true;
    beast::error_code ignored;
    stream_.socket().cancel(ignored);
    return;
  }
  wait_for_request();
}

// While a reply is pending, a read on the socket notices a client that goes away (a
// reset); bytes that arrive instead are the next pipelined request, kept in the buffer.
// An end of stream (EOF) is not a client gone: it is also what a client that has sent
// its whole request and shut its sending side (shutdown(SHUT_WR), `nc -N`, `curl
// --no-keepalive` piping) sends, and that client still reads. The reply goes on and the
// connection closes after it (and after any pipelined request already read); a client
// that closed entirely is noticed when a write to
// it fails (a stream's next token; a whole reply is generated to its end, bounded by its
// max_tokens).
void HttpConnection::watch_disconnect() {
  if (watching_ || closed_ || peer_eof_) return;
  net::mutable_buffer space;
  try {
    space = buffer_.prepare(4096);
  } catch (const std::length_error&) {
    return;  // buffer_limit bytes read ahead: stop reading until this reply is done
  }
  watching_ = true;
  stream_.socket().async_read_some(
      space, [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
}

void HttpConnection::on_watch(beast::error_code ec, size_t n) {
  watching_ = false;
  if (closed_) return;
  if (!ec) {
    buffer_.commit(n);
    if (busy_) return watch_disconnect();
  } else if (ec == net::error::eof || ec == http::error::end_of_stream) {
    // Half-closed, or closed: answer this request and any already read behind it, then
    // close, unless the probe finds the client gone.
    peer_eof_ = true;
    probe_closed_client();
  } else if (ec != net::error::operation_aborted) {
    return close();  // the client went away: close() runs the cancel hook
  }
  if (resume_after_watch_) {
    resume_after_watch_ = false;
    wait_for_request();
  }
}

// A client that shut its sending side while a whole reply is being made has either
// closed the connection (gone: its request should be cancelled, as a stream's is when a
// write fails) or only half-closed it (`nc -N`: it still reads). Reading cannot tell the
// two apart; writing can. The first bytes of every reply, "HTTP/1.1 ", go out now: a
// closed client's kernel answers them with a reset, which the socket shows (SO_ERROR, or
// the state TCP_CLOSE) within a round trip, while a half-closed client holds them until
// the rest of the status line comes. The socket is looked at after 20 ms, then at
// doubling intervals up to 1 s, until the reply is ready.
void HttpConnection::probe_closed_client() {
  if (closed_ || !busy_ || reply_begun_ || probing_) return;
  probing_ = true;
  if (!prefix_sent_) {
    prefix_sent_ = true;
    send(std::string(kReplyPrefix));
  }
  probe_delay_ = std::chrono::milliseconds(20);
  arm_probe();
}

void HttpConnection::arm_probe() {
  probe_timer_.expires_after(probe_delay_);
  probe_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec || self->closed_ || !self->probing_) return;
    if (self->reply_begun_) {
      self->probing_ = false;  // the reply is on its way: a failed write tells from here
      return;
    }
    if (self->peer_reset()) return self->close();  // runs the cancel hook
    self->probe_delay_ = std::min(self->probe_delay_ * 2, std::chrono::milliseconds(1000));
    self->arm_probe();
  });
}

bool HttpConnection::peer_reset() {
  const int fd = stream_.socket().native_handle();
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0) return true;
  tcp_info info{};
  len = sizeof info;
  return ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 && info.tcpi_state == TCP_CLOSE;
}

void HttpConnection::close_when_idle() {
  post([self = shared_from_this()] {
    self->keep_alive_ = false;
    // Idle: no reply under way and not a byte of a request (a request begun is read and
    // answered, with a 503).
    const bool waiting =
        !self->parser_ || (!self->parser_->got_some() && self->buffer_.size() == 0);
    if (!self->busy_ && !self->writing_ && waiting) self->close();
  });
}

void HttpConnection::close() {
  if (closed_) return;
  closed_ = true;
  probing_ = false;
  probe_timer_.cancel();
  if (busy_ && cancel_hook_) {
    auto hook = std::move(cancel_hook_);
    cancel_hook_ = nullptr;
    hook();
  }
  beast::error_code ignored;
  stream_.socket().shutdown(net::ip::tcp::socket::shutdown_both, ignored);
  stream_.socket().close(ignored);
}

}  // namespace hyperion::serve
