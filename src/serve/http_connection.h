// One HTTP/1.1 connection of `hyperion serve` (serve/http_server.h): reads requests with
// Beast's strict parser under deadlines, hands each to the application, and writes its
// reply (whole, or a chunked stream) before reading the next, so pipelined requests are
// answered in order. All of a connection's work runs on its own strand.
//
// Malformed HTTP is answered here, without the application: 400 (bad syntax, conflicting
// or negative Content-Length, bad chunking), 413 (body too large), 431 (headers too
// large); the connection is then closed. A request that misses its deadline is cut (the
// connection closed, as nginx does).
//
// While a reply is pending the connection watches the socket: if the client goes away
// the application's cancel hook runs (the engine frees the request's slot at once). A
// client that closes before a whole (not streamed) reply is ready is told from one that
// only half-closed (and still reads) by sending the reply's first bytes early
// (probe_closed_client).
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hyperion::serve {

class HttpConnection;
struct ServerMetrics;

using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;
using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// Limits and shared state every connection of a server reads.
struct HttpLimits {
  double header_timeout_s = 10;
  double request_timeout_s = 60;
  double idle_timeout_s = 60;
  double write_timeout_s = 60;
  size_t header_limit = 16 << 10;
  size_t body_limit = 8 << 20;
  size_t buffer_limit = 9 << 20;  // bytes read ahead (pipelined requests) per connection
};

// The server side a connection calls into.
class HttpApplication {
 public:
  virtual ~HttpApplication() = default;
  // One complete request; reply through conn.respond() or conn.begin_stream(), now or
  // later (from any thread, through conn.post()).
  virtual void handle(const std::shared_ptr<HttpConnection>& conn, HttpRequest request) = 0;
  virtual bool draining() const = 0;
  virtual ServerMetrics& metrics() = 0;
  virtual void connection_closed() = 0;
};

class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(boost::asio::ip::tcp::socket socket, HttpApplication& app,
                 const HttpLimits& limits);
  ~HttpConnection();

  void start();
  // Runs `fn` on this connection's strand (safe from any thread).
  void post(std::function<void()> fn);

  // Replies (on the strand). A whole response; `close` ends the connection after it.
  void respond(int status, const std::string& content_type, std::string body,
               const HttpHeaders& extra = {}, bool close = false);
  // A streamed response: the head now, then stream_write() per piece and stream_end().
  void begin_stream(const std::string& content_type);
  void stream_write(std::string data);
  void stream_end();
  // Called (on the strand) if the client disconnects before the reply is complete.
  void set_cancel_hook(std::function<void()> hook) { cancel_hook_ = std::move(hook); }
  // Drain: an idle connection closes now, a busy one after its current reply.
  void close_when_idle();
  bool closed() const { return closed_; }

 private:
  void wait_for_request();
  void read_header();
  void on_header(boost::beast::error_code ec);
  void on_body(boost::beast::error_code ec);
  void protocol_error(int status, const std::string& message);
  void send(std::string bytes);
  void flush();
  void on_written(boost::beast::error_code ec);
  void reply_complete();
  void watch_disconnect();
  void on_watch(boost::beast::error_code ec, size_t n);
  void probe_closed_client();
  void arm_probe();
  bool peer_reset();
  void close();

  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  HttpApplication& app_;
  const HttpLimits& limits_;

  bool keep_alive_ = true;
  bool http10_ = false;       // HTTP/1.0 client: no chunked encoding, close after the reply
  bool busy_ = false;         // a request is being answered
  bool chunked_ = false;      // the current reply is a chunked stream
  bool last_queued_ = false;  // the current reply's last bytes are queued
  bool writing_ = false;
  bool watching_ = false;  // a disconnect watch read is pending
  bool resume_after_watch_ = false;
  bool peer_eof_ = false;  // the client has shut its sending side: nothing more will come
  bool closed_ = false;
  bool reply_begun_ = false;  // the current reply's head is queued (respond, begin_stream)
  bool prefix_sent_ = false;  // its first bytes went out early, as a probe
  bool probing_ = false;
  std::chrono::milliseconds probe_delay_{0};
  boost::asio::steady_timer probe_timer_;
  std::deque<std::string> out_;
  std::function<void()> cancel_hook_;
};

}  // namespace hyperion::serve
