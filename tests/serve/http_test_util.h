// Shared by the HTTP server tests: a served stack (engine, async engine, server on a
// free port), a raw TCP client for the cases an HTTP library will not send, and helpers
// for server-sent events.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "serve/async_engine.h"
#include "serve/engine.h"
#include "serve/http_server.h"

namespace hyperion::testing_util {

inline std::vector<std::string> corpus_lines(size_t n) {
  std::ifstream in(std::string(HYPERION_SOURCE_DIR) + "/data/corpus/fortunes.txt");
  std::vector<std::string> lines;
  std::string line;
  while (lines.size() < n && std::getline(in, line))
    if (line.size() > 20) lines.push_back(line);
  return lines;
}

// An engine, its async runner and an HTTP server on a free loopback port, serving until
// destroyed.
struct ServedStack {
  // `configure` may add to the API context (LoRA adapters) before the server starts.
  ServedStack(const text::Tokenizer& tok, const ParamStore& params, serve::EngineConfig ec,
              serve::HttpOptions http = {}, const std::string& model = "test-model",
              const std::function<void(serve::ApiContext&, serve::Engine&)>& configure = {})
      : engine(params, &tok, ec), async(engine) {
    serve::ApiContext ctx;
    ctx.tokenizer = &tok;
    ctx.model_name = model;
    ctx.chat_template = engine.config().chat_template;
    ctx.context_tokens = engine.config().max_seq_len;
    ctx.max_prompt_bytes = serve::prompt_byte_bound(tok, engine.config().max_seq_len);
    ctx.grammars = std::make_shared<text::GrammarCache>(
        text::TokenVocabulary::from_tokenizer(tok, engine.runner().config().vocab_size));
    if (configure) configure(ctx, engine);
    server = std::make_unique<serve::HttpServer>(async, ctx, http);
    port = server->bind("127.0.0.1", 0);
    thread = std::thread([this] { server->run(); });
  }
  ~ServedStack() {
    server->stop();
    thread.join();
    async.stop();
  }
  serve::Engine engine;
  serve::AsyncEngine async;
  std::unique_ptr<serve::HttpServer> server;
  int port = 0;
  std::thread thread;
};

// A plain TCP connection to 127.0.0.1:port with a receive timeout (a test that waits
// for bytes that never come fails instead of hanging). `connect_now` false: the socket
// only, connected by connect().
class RawClient {
 public:
  explicit RawClient(int port, double timeout_s = 20, bool connect_now = true) : port_(port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout_s);
    tv.tv_usec = static_cast<suseconds_t>((timeout_s - double(tv.tv_sec)) * 1e6);
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect_now) connect();
  }
  bool connect() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    return connected_;
  }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return connected_; }
  bool send(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads until the peer closes, the timeout passes, or `until` appears `count` times.
  std::string read(const std::string& until = "", int count = 1) {
    std::string out;
    char buf[4096];
    for (;;) {
      if (!until.empty() && occurrences(out, until) >= count) return out;
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        eof_ = n == 0;
        return out;
      }
      out.append(buf, static_cast<size_t>(n));
    }
  }
  bool saw_eof() const { return eof_; }
  int fd() const { return fd_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  static int occurrences(const std::string& text, const std::string& part) {
    int n = 0;
    for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
    return n;
  }

 private:
  int port_ = 0;
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
};

// The JSON payloads of a server-sent event stream ("data: ..." lines), and whether it
// ended with [DONE].
inline std::vector<nlohmann::json> sse_events(const std::string& body, bool* done) {
  std::vector<nlohmann::json> out;
  *done = false;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string payload = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      *done = true;
      continue;
    }
    out.push_back(nlohmann::json::parse(payload));
  }
  return out;
}

inline nlohmann::json greedy_body(const std::string& prompt, int max_tokens) {
  return {{"model", "test-model"},
          {"prompt", prompt},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}};
}

}  // namespace hyperion::testing_util
