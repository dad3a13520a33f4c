// Serves a MetricsRegistry in the Prometheus text format on `GET /metrics` (any other
// path: 404), from one background thread: what a training rank exposes on
// metrics_port + rank for Prometheus to scrape. A scrape renders the registry under its
// own lock, so a slow or dead scraper never blocks the thread updating the metrics.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "monitor/metrics_registry.h"

namespace hyperion::monitor {

class MetricsExporter {
 public:
  // Binds host:port (port 0: any free port) before returning; a port in use is a
  // hyperion::Error naming it and `who` ("rank 3"). The registry must outlive this.
  MetricsExporter(const MetricsRegistry& registry, const std::string& host, int port,
                  const std::string& who);
  ~MetricsExporter();  // stops serving and joins the thread
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  int port() const { return port_; }

 private:
  struct Server;
  std::unique_ptr<Server> server_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace hyperion::monitor
