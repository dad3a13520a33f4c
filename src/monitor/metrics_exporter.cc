#include "monitor/metrics_exporter.h"

#include <httplib.h>

#include <sys/socket.h>

#include <chrono>

#include "base/error.h"

namespace hyperion::monitor {

struct MetricsExporter::Server {
  httplib::Server http;
};

MetricsExporter::MetricsExporter(const MetricsRegistry& registry, const std::string& host, int port,
                                 const std::string& who)
    : server_(std::make_unique<Server>()) {
  HYP_CHECK(port >= 0 && port <= 65535, "metrics exporter for {}: port {} is outside [0, 65535]",
            who, port);
  httplib::Server& http = server_->http;
  // One worker: scrapes are rare and small, and the process's cores belong to training.
  http.new_task_queue = [] { return new httplib::ThreadPool(1); };
  http.set_read_timeout(5, 0);
  http.set_write_timeout(5, 0);
  http.set_keep_alive_max_count(1);
  // SO_REUSEADDR only: cpp-httplib's default also sets SO_REUSEPORT, which would let a
  // second rank bind a port already in use instead of failing by name.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  http.Get("/metrics", [&registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry.render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  if (port == 0) {
    port_ = http.bind_to_any_port(host);
    HYP_CHECK(port_ > 0, "metrics exporter for {}: cannot bind any port on {}", who, host);
  } else {
    HYP_CHECK(http.bind_to_port(host, port),
              "metrics exporter for {}: cannot listen on {}:{} (port in use? set metrics_port to "
              "a free range, or 0 to turn the exporter off)",
              who, host, port);
    port_ = port;
  }
  thread_ = std::thread([this] { server_->http.listen_after_bind(); });
  // stop() only stops a server that is already running: wait for it, so a destructor
  // right after construction cannot miss it and hang in join().
  for (int i = 0; i < 5000 && !http.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

MetricsExporter::~MetricsExporter() {
  server_->http.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace hyperion::monitor
