// `hyperion monitor RUN_DIR|URL... [--port P]`: a live dashboard of training runs. One
// HTTP server (cpp-httplib) serves the page and uPlot, both compiled into the binary
// (cli/web_assets.h), and /api/data, which gathers every source afresh on each request
// (monitor/dashboard_data.h): the page polls it and redraws in place. Runs until SIGINT
// or SIGTERM.
#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/web_assets.h"
#include "monitor/dashboard_data.h"
#include "monitor/event_log.h"

namespace hyperion::cli {

const CommandSpec kMonitorSpec = {
    "monitor",
    "RUN_DIR|URL...",
    "live dashboard of training runs: metrics by step and rank, stragglers, goodput",
    {{"port", "P", "port to listen on (default 8090; 0 picks a free one)"},
     {"host", "H", "address to listen on (default 127.0.0.1)"},
     {"poll-seconds", "S", "seconds between scrapes of URL sources (default 2)"}},
    "Sources, one or more:\n"
    "  RUN_DIR  a training run directory: metrics.jsonl (one chart per metric),\n"
    "           ranks.jsonl (per-rank charts, one line per rank; outliers and stragglers\n"
    "           marked) and events.jsonl (goodput and badput as a bar), re-read as they\n"
    "           grow.\n"
    "  URL      a rank's Prometheus endpoint, http(s)://HOST:PORT[/PATH] (metrics_port +\n"
    "           rank; PATH defaults to /metrics), scraped every --poll-seconds: each\n"
    "           hyperion_* gauge with a rank label is plotted over that rank's\n"
    "           hyperion_train_step.\n"
    "Prints `monitor: serving http://HOST:PORT/ for SOURCES` once listening; the page\n"
    "updates every 2 s. Routes: GET / (the page), GET /api/data (JSON). SIGINT or SIGTERM\n"
    "stops it (exit status 0). The page embeds uPlot (web/package.json).",
    "monitor runs/tiny http://127.0.0.1:9400 --port 8090"};

namespace {

using nlohmann::json;

// Rows of each file sent to the page at most: a long job's metrics.jsonl is thinned
// evenly (the latest row always kept), so a refresh stays small.
constexpr size_t kMaxRows = 4000;

struct Sources {
  std::vector<std::string> all, run_dirs, urls;
};

// Run directories must exist and URLs be http(s): usage errors naming the source.
Sources classify_sources(const std::vector<std::string>& positional) {
  HYP_USAGE_CHECK(!positional.empty(),
                  "monitor: expected one or more sources: run directories or http(s) URLs of "
                  "rank metrics endpoints (see hyperion monitor --help)");
  Sources s;
  for (const std::string& src : positional) {
    s.all.push_back(src);
    if (src.find("://") != std::string::npos) {
      std::string origin, path;
      HYP_USAGE_CHECK(monitor::split_http_url(src, origin, path),
                      "monitor: '{}' is not an http:// or https:// URL with a host", src);
      s.urls.push_back(src);
      continue;
    }
    std::error_code ec;
    const auto status = std::filesystem::status(src, ec);
    HYP_USAGE_CHECK(std::filesystem::exists(status), "monitor: no such run directory '{}'{}", src,
                    src.find(':') != std::string::npos ? " (a URL starts with http://)" : "");
    HYP_USAGE_CHECK(std::filesystem::is_directory(status),
                    "monitor: '{}' is not a directory (expected a training run directory)", src);
    s.run_dirs.push_back(src);
  }
  return s;
}

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// The whole of /api/data: the sources, each run directory, the scraped series.
std::string api_data(const Sources& sources,
                     const std::vector<std::unique_ptr<monitor::RunDirReader>>& runs,
                     const monitor::RankScraper& scraper) {
  json runs_json = json::array();
  for (const auto& r : runs) runs_json.push_back(r->read(kMaxRows));
  json out = scraper.snapshot();
  out["sources"] = sources.all;
  out["runs"] = std::move(runs_json);
  out["time"] = monitor::unix_time();
  // NaN and infinities (a diverged loss) become null, which the page draws as a gap.
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

void add_routes(httplib::Server& http, const Sources& sources,
                const std::vector<std::unique_ptr<monitor::RunDirReader>>& runs,
                const monitor::RankScraper& scraper) {
  http.Get("/api/data", [&](const httplib::Request&, httplib::Response& res) {
    try {
      res.set_content(api_data(sources, runs, scraper), "application/json");
      res.set_header("Cache-Control", "no-store");
    } catch (const std::exception& e) {  // never take the server down: say what failed
      res.status = 500;
      res.set_content(json{{"error", e.what()}}.dump(), "application/json");
    }
  });
  // The embedded files, by exact path (routes are regular expressions: no '.' in them).
  http.Get("/.*", [](const httplib::Request& req, httplib::Response& res) {
    for (size_t i = 0; i < kWebAssetCount; ++i) {
      const WebAsset& a = kWebAssets[i];
      if (req.path != a.path) continue;
      res.set_content(reinterpret_cast<const char*>(a.data), a.size, a.content_type);
      return;
    }
    res.status = 404;
    res.set_content("not found: " + req.path + "\n", "text/plain");
  });
}

// Binds host:port (0: any free port) and returns the port; a port in use is named.
int bind_server(httplib::Server& http, const std::string& host, int port) {
  // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, which would let a second
  // monitor share a port already in use instead of failing by name.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  if (port == 0) {
    const int bound = http.bind_to_any_port(host);
    HYP_CHECK(bound > 0, "monitor: cannot listen on any port of {}", host);
    return bound;
  }
  HYP_CHECK(http.bind_to_port(host, port),
            "monitor: cannot listen on {}:{} (port in use, or not an address of this "
            "machine? --port 0 picks a free port)",
            host, port);
  return port;
}

}  // namespace

int cmd_monitor(const Args& args) {
  const Flags f(kMonitorSpec, args);
  const Sources sources = classify_sources(f.positional());
  const std::string host = f.get("host", "127.0.0.1");
  HYP_USAGE_CHECK(!host.empty(), "monitor: --host must not be empty");
  const int64_t port = f.integer("port", 8090);
  HYP_USAGE_CHECK(port >= 0 && port <= 65535, "monitor: --port must be in [0, 65535], got {}",
                  port);
  const double poll_s = f.number("poll-seconds", 2);
  HYP_USAGE_CHECK(poll_s > 0 && poll_s <= 86400,
                  "monitor: --poll-seconds must be in (0, 86400], got '{}'", f.get("poll-seconds"));

  // SIGINT/SIGTERM go to one thread (sigwait), blocked everywhere else before any thread
  // starts; SIGPIPE is ignored: a browser closing a connection mid-answer is no reason
  // to stop (cpp-httplib writes without MSG_NOSIGNAL).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<std::unique_ptr<monitor::RunDirReader>> runs;
  for (const std::string& d : sources.run_dirs)
    runs.push_back(std::make_unique<monitor::RunDirReader>(d));
  httplib::Server http;
  http.new_task_queue = [] { return new httplib::ThreadPool(4); };
  http.set_read_timeout(10, 0);
  http.set_write_timeout(10, 0);
  const int bound = bind_server(http, host, static_cast<int>(port));
  const monitor::RankScraper scraper(sources.urls, poll_s);
  add_routes(http, sources, runs, scraper);

  const std::string url_host = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  std::printf("monitor: serving http://%s:%d/ for %s\n", url_host.c_str(), bound,
              joined(sources.all, ", ").c_str());
  std::fflush(stdout);

  // stop() is a no-op until the server runs, so a signal that comes before
  // listen_after_bind() has started is retried until the server has stopped.
  std::atomic<bool> listening_done{false}, signalled{false};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    signalled = !listening_done;
    while (!listening_done) {
      http.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const bool clean = http.listen_after_bind();
  listening_done = true;
  pthread_kill(waiter.native_handle(), SIGTERM);  // wake the waiter if still in sigwait
  waiter.join();
  HYP_CHECK(clean || signalled, "monitor: the server on {}:{} stopped accepting connections", host,
            bound);
  return 0;
}

}  // namespace hyperion::cli
