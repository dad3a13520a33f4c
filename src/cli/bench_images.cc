// `hyperion bench images`: load-tests a running image server (POST /v1/images/generations)
// at one or more concurrency levels: a closed loop of C clients, each sending its next
// request when its last one is answered, until --requests are done. Reports images per
// minute and request latency per level, and each level's throughput as a ratio to the
// first level's (the batching gain of `serve`'s step-by-step batching).
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <thread>

#include "base/error.h"
#include "base/timer.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "serve/load_generator.h"

namespace hyperion::cli {

const CommandSpec kBenchImagesSpec = {
    "bench images",
    "",
    "load-test a running image server (POST /v1/images/generations): images/minute and latency per concurrency",
    {{"url", "URL", "server (default http://127.0.0.1:8000)"},
     {"concurrency", "LIST", "clients in flight, comma-separated levels (default 1,4)"},
     {"requests", "N", "requests per level (default 8)"},
     {"prompt", "TEXT", "the prompt (default \"a photo of a bag\"); request i uses seed i"},
     {"size", "WxH", "image size (default: the server's)"},
     {"steps", "N", "denoising steps (default 20)"},
     {"n", "N", "images per request (default 1)"},
     {"json", "", "print the figures as one JSON object"}},
    "Each level's images_per_minute counts the images returned over the level's wall time; "
    "speedup is that over the first level's.",
    "bench images --url http://127.0.0.1:8000 --concurrency 1,4 --requests 8 --steps 20 --json"};

namespace {

struct Level {
  int64_t concurrency = 0, completed = 0, failed = 0, images = 0;
  double seconds = 0;
  std::vector<double> latencies;
  std::string first_error;
};

Level run_level(const serve::ServerAddress& server, int64_t concurrency, int64_t requests,
                const nlohmann::json& base) {
  Level level;
  level.concurrency = concurrency;
  std::atomic<int64_t> next{0};
  std::mutex mu;
  const Timer timer;
  std::vector<std::thread> clients;
  for (int64_t c = 0; c < concurrency; ++c)
    clients.emplace_back([&] {
      httplib::Client client(server.host, server.port);
      client.set_read_timeout(3600, 0);
      client.set_write_timeout(60, 0);
      for (int64_t i = next++; i < requests; i = next++) {
        nlohmann::json body = base;
        body["seed"] = i;
        const Timer t;
        const auto r = client.Post("/v1/images/generations", body.dump(), "application/json");
        const double s = t.seconds();
        std::lock_guard<std::mutex> lock(mu);
        if (r && r->status == 200) {
          ++level.completed;
          level.latencies.push_back(s);
          try {
            level.images += int64_t(nlohmann::json::parse(r->body)["data"].size());
          } catch (const std::exception&) {
            // Counted as completed; its images uncounted.
          }
        } else {
          ++level.failed;
          if (level.first_error.empty())
            level.first_error = r ? fmt::format("HTTP {}: {}", r->status, r->body.substr(0, 300))
                                  : "no response: " + httplib::to_string(r.error());
        }
      }
    });
  for (auto& t : clients) t.join();
  level.seconds = timer.seconds();
  std::sort(level.latencies.begin(), level.latencies.end());
  return level;
}

}  // namespace

int cmd_bench_images(const Args& args) {
  const Flags f(kBenchImagesSpec, args);
  HYP_USAGE_CHECK(f.positional().empty(), "bench images: unexpected argument '{}'", f.positional()[0]);
  serve::ServerAddress server;
  try {
    server = serve::parse_url(f.get("url", "http://127.0.0.1:8000"));
  } catch (const std::exception& e) {
    usage_fail("bench images: --url: {}", e.what());
  }
  std::vector<int64_t> levels;
  const std::string list = f.get("concurrency", "1,4");
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, comma - at);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    HYP_USAGE_CHECK(!item.empty() && *end == '\0' && v >= 1 && v <= 256,
                    "bench images: --concurrency must be comma-separated integers in [1, 256], got '{}'", list);
    levels.push_back(v);
    at = comma + 1;
  }
  const int64_t requests = f.integer("requests", 8), steps = f.integer("steps", 20), n = f.integer("n", 1);
  HYP_USAGE_CHECK(requests >= 1 && requests <= 100000, "bench images: --requests must be in [1, 100000]");
  HYP_USAGE_CHECK(steps >= 1 && steps <= 1000, "bench images: --steps must be in [1, 1000]");
  HYP_USAGE_CHECK(n >= 1 && n <= 10, "bench images: --n must be in [1, 10]");
  nlohmann::json base = {{"prompt", f.get("prompt", "a photo of a bag")},
                         {"steps", steps},
                         {"n", n},
                         {"response_format", "b64_json"}};
  if (f.has("size")) base["size"] = f.get("size");

  nlohmann::ordered_json out;
  out["url"] = fmt::format("http://{}:{}", server.host, server.port);
  out["requests_per_level"] = requests;
  out["steps"] = steps;
  out["n"] = n;
  out["levels"] = nlohmann::json::array();
  double first_rate = 0;
  int64_t failed = 0;
  std::string first_error;
  for (int64_t c : levels) {
    const Level l = run_level(server, c, requests, base);
    const double rate = l.seconds > 0 ? double(l.images) * 60.0 / l.seconds : 0;
    if (first_rate == 0) first_rate = rate;
    failed += l.failed;
    if (first_error.empty()) first_error = l.first_error;
    nlohmann::ordered_json j;
    j["concurrency"] = c;
    j["completed"] = l.completed;
    j["failed"] = l.failed;
    j["images"] = l.images;
    j["seconds"] = l.seconds;
    j["images_per_minute"] = rate;
    j["speedup"] = first_rate > 0 ? rate / first_rate : 0.0;
    j["latency_s"] = {{"mean", l.latencies.empty() ? 0.0
                                                   : std::accumulate(l.latencies.begin(), l.latencies.end(), 0.0) /
                                                         double(l.latencies.size())},
                      {"p50", serve::percentile_sorted(l.latencies, 50)},
                      {"p90", serve::percentile_sorted(l.latencies, 90)},
                      {"max", l.latencies.empty() ? 0.0 : l.latencies.back()}};
    out["levels"].push_back(j);
    if (!f.has("json"))
      std::printf("concurrency %3lld: %lld/%lld requests, %lld images in %.2f s = %.2f images/min (%.2fx), latency "
                  "p50 %.2f s p90 %.2f s\n",
                  (long long)c, (long long)l.completed, (long long)requests, (long long)l.images, l.seconds, rate,
                  first_rate > 0 ? rate / first_rate : 0.0, serve::percentile_sorted(l.latencies, 50),
                  serve::percentile_sorted(l.latencies, 90));
  }
  out["failed"] = failed;
  if (!first_error.empty()) out["first_error"] = first_error;
  if (f.has("json")) std::printf("%s\n", out.dump(2).c_str());
  if (failed > 0) std::fprintf(stderr, "bench images: %lld requests failed; the first: %s\n", (long long)failed,
                               first_error.c_str());
  return failed > 0 ? 1 : 0;
}

}  // namespace hyperion::cli
