// `hyperion monitor` as a user runs it: a server process on a run directory (and on a
// rank's Prometheus endpoint), its /api/data over a real socket, and the page loaded in
// headless Chromium, which must draw every chart.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_test_util.h"
#include "monitor/metrics_exporter.h"
#include "monitor/metrics_registry.h"

namespace {

namespace fs = std::filesystem;
using hyperion::testing_util::CliResult;
using hyperion::testing_util::run_cli;
using hyperion::testing_util::run_shell;
using nlohmann::json;

constexpr const char* kChromium = "/usr/bin/chromium";
// metrics.jsonl's keys besides step, and ranks.jsonl's per-rank metrics: one chart each.
const std::vector<std::string> kStepMetrics = {"loss",        "grad_norm",      "lr",
                                               "step_s",      "tokens_per_s",   "mfu",
                                               "data_wait_s", "comm_exposed_s", "tokens_seen"};
const std::vector<std::string> kRankMetrics = {"step_s", "compute_s", "tokens_per_s"};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void append(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::app) << text;
}

// A run directory as a 2-rank job leaves it: 20 steps of metrics.jsonl ending in a torn
// line (the writer mid-line), two ranks.jsonl periods whose second flags rank 1 as a
// compute straggler, and the event log of one process that finished (with_events).
void write_run(const std::string& dir, bool with_events) {
  fs::create_directories(dir);
  std::string metrics;
  for (int s = 1; s <= 20; ++s) {
    json row = {{"step", s},
                {"loss", 5.0 - 0.1 * s},
                {"grad_norm", 1.0 / s},
                {"lr", 1e-3},
                {"step_s", 0.5},
                {"tokens_per_s", 1000 + s},
                {"mfu", 0.3},
                {"data_wait_s", 0.01},
                {"comm_exposed_s", 0.02},
                {"tokens_seen", 512 * s}};
    metrics += row.dump() + "\n";
  }
  std::ofstream(dir + "/metrics.jsonl") << metrics << R"({"step": 21, "lo)";
  std::string ranks;
  for (int period = 1; period <= 2; ++period) {
    json row = {{"step", 10 * period}, {"time", 1000.0 + 5 * period}, {"steps", 10}};
    for (int r = 0; r < 2; ++r) {
      const double slow = r == 1 && period == 2 ? 0.5 : 0.0;
      row["ranks"].push_back({{"rank", r},
                              {"host", "host" + std::to_string(r)},
                              {"step_s_mean", 0.5 + slow},
                              {"step_s_max", 0.6 + slow},
                              {"compute_s_mean", 0.4 + slow},
                              {"compute_s_max", 0.45 + slow},
                              {"tokens_per_s_mean", 1000 - 400 * slow},
                              {"tokens_per_s_max", 1100 - 400 * slow}});
    }
    for (const std::string& m : kRankMetrics)
      row["summary"][m] = {
          {"mean", 0.5}, {"max", 1.0}, {"top_by_mean", {1, 0}}, {"top_by_max", {1, 0}}};
    row["stragglers"] = json::array();
    if (period == 2)
      row["stragglers"].push_back({{"rank", 1},
                                   {"metric", "compute_s"},
                                   {"value", 0.9},
                                   {"median", 0.4},
                                   {"threshold", 0.6},
                                   {"periods", 2}});
    ranks += row.dump() + "\n";
  }
  std::ofstream(dir + "/ranks.jsonl") << ranks;
  if (!with_events) return;
  double t = 1000;
  std::string events = json{{"time", t}, {"event", "job_start"}, {"pid", 7}}.dump() + "\n" +
                       json{{"time", t},
                            {"event", "process_start"},
                            {"pid", 7},
                            {"attempt", 1},
                            {"launch_time", t - 2}}
                           .dump() +
                       "\n" + json{{"time", t + 1}, {"event", "init_done"}, {"pid", 7}}.dump() +
                       "\n";
  t += 1;
  for (int s = 1; s <= 20; ++s) {
    events += json{{"time", t}, {"event", "step_start"}, {"pid", 7}, {"step", s}}.dump() + "\n";
    t += 0.5;
    events +=
        json{{"time", t}, {"event", "step_end"}, {"pid", 7}, {"step", s}, {"data_wait_s", 0.01}}
            .dump() +
        "\n";
  }
  events += json{{"time", t + 0.1}, {"event", "job_end"}, {"pid", 7}, {"step", 20}}.dump() + "\n";
  std::ofstream(dir + "/events.jsonl") << events;
}

// `hyperion monitor ARGS --port 0` in its own process; SIGTERM at the end.
class MonitorProcess {
 public:
  MonitorProcess(const std::vector<std::string>& args, const std::string& out_dir) {
    const std::string out = out_dir + "/monitor.out", err = out_dir + "/monitor.err";
    pid_ = fork();
    if (pid_ == 0) {
      if (std::freopen(out.c_str(), "w", stdout) == nullptr ||
          std::freopen(err.c_str(), "w", stderr) == nullptr)
        _exit(126);
      std::vector<std::string> argv_s = {HYPERION_CLI_PATH, "--threads", "1", "monitor"};
      argv_s.insert(argv_s.end(), args.begin(), args.end());
      argv_s.insert(argv_s.end(), {"--port", "0"});
      std::vector<char*> argv;
      for (auto& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    // The one stdout line names the URL once the server listens (bounded wait).
    // (No std::regex: GCC 12 warns inside it under the sanitizers, and -Werror.)
    const std::string serving = "monitor: serving http://127.0.0.1:";
    for (int i = 0; i < 400 && port_ == 0; ++i) {
      const std::string text = read_file(out);
      if (text.rfind(serving, 0) == 0 && text.find(" for ") != std::string::npos) {
        port_ = std::atoi(text.c_str() + serving.size());
        url_ = "http://127.0.0.1:" + std::to_string(port_) + "/";
        EXPECT_EQ(text.substr(serving.size() - 17, url_.size() + 5), url_ + " for ") << text;
        break;
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        ADD_FAILURE() << "monitor exited: " << text << read_file(err);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~MonitorProcess() {
    if (pid_ > 0) stop();
  }
  MonitorProcess(const MonitorProcess&) = delete;
  MonitorProcess& operator=(const MonitorProcess&) = delete;
  // SIGTERM and the exit code.
  int stop() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  int port() const { return port_; }
  const std::string& url() const { return url_; }

  json data() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(10, 0);
    auto res = c.Get("/api/data");
    EXPECT_TRUE(res && res->status == 200);
    return res ? json::parse(res->body) : json();
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string url_;
};

class MonitorCli : public testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::TempDir() + "hyperion_monitor_cli_" + std::to_string(::getpid()) + "_" +
            testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

TEST_F(MonitorCli, HelpAndUsageErrors) {
  const CliResult help = run_cli("monitor --help");
  EXPECT_EQ(help.code, 0) << help.out;
  for (const char* s :
       {"usage: hyperion monitor RUN_DIR|URL...", "--port P", "--poll-seconds", "example:"})
    EXPECT_NE(help.out.find(s), std::string::npos) << s << "\n" << help.out;

  struct Case {
    std::string args, names;
  };
  const std::string missing = root_ + "/no_such_run";
  for (const Case& c : {Case{"", "expected one or more sources"},
                        Case{missing, "no such run directory '" + missing + "'"},
                        Case{"ftp://x", "'ftp://x' is not an http:// or https:// URL"},
                        Case{"http://", "'http://' is not an http:// or https:// URL"},
                        Case{root_ + " --port 70000", "--port must be in [0, 65535]"},
                        Case{root_ + " --poll-seconds 0", "--poll-seconds must be in"},
                        Case{root_ + " --poll-seconds x", "--poll-seconds: expected a number"},
                        Case{root_ + " --bogus", "unknown flag --bogus"}}) {
    const CliResult r = run_cli("monitor " + c.args);
    EXPECT_EQ(r.code, 2) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.names), std::string::npos) << c.args << ": " << r.out;
  }
  // A file is no run directory.
  std::ofstream(root_ + "/file") << "x";
  const CliResult file = run_cli("monitor " + root_ + "/file");
  EXPECT_EQ(file.code, 2) << file.out;
  EXPECT_NE(file.out.find("is not a directory"), std::string::npos) << file.out;
}

// /api/data: every row of both runs (a torn last line skipped until it is whole), the
// straggler, goodput, and goodput unavailable, with the reason, for a run without an
// event log. The files are re-read as they grow.
TEST_F(MonitorCli, ServesRunDataAndRereadsItAsItGrows) {
  write_run(root_ + "/a", true);
  write_run(root_ + "/b", false);
  MonitorProcess m({root_ + "/a", root_ + "/b"}, root_);
  ASSERT_GT(m.port(), 0);
  json d = m.data();
  EXPECT_EQ(d["sources"], json({root_ + "/a", root_ + "/b"}));
  ASSERT_EQ(d["runs"].size(), 2u);
  const json& a = d["runs"][0];
  EXPECT_EQ(a["dir"], root_ + "/a");
  ASSERT_EQ(a["metrics"].size(), 20u);
  EXPECT_EQ(a["metrics"][19]["step"], 20);
  EXPECT_EQ(a["metrics_rows"], 20);
  EXPECT_TRUE(a["problems"].empty()) << a["problems"];
  ASSERT_EQ(a["ranks"].size(), 2u);
  EXPECT_EQ(a["ranks"][1]["stragglers"][0]["rank"], 1);
  ASSERT_TRUE(a["goodput"].is_object()) << a["goodput_error"];
  EXPECT_GT(a["goodput"]["goodput"].get<double>(), 0.5);
  EXPECT_LT(a["goodput"]["goodput"].get<double>(), 1.0);
  EXPECT_EQ(a["goodput"]["steps_kept"], 20);
  EXPECT_TRUE(a["goodput_error"].is_null());
  const json& b = d["runs"][1];
  EXPECT_TRUE(b["goodput"].is_null());
  EXPECT_NE(b["goodput_error"].get<std::string>().find("events.jsonl"), std::string::npos)
      << b["goodput_error"];
  EXPECT_TRUE(d["series"].empty());

  // The writer finishes the torn line and adds one; a line of garbage is named, skipped.
  append(root_ + "/a/metrics.jsonl", "ss\": 2.9}\nnot json\n{\"step\": 22, \"loss\": 2.8}\n");
  d = m.data();
  const json& grown = d["runs"][0];
  ASSERT_EQ(grown["metrics"].size(), 22u);
  EXPECT_EQ(grown["metrics"][20]["loss"], 2.9);
  EXPECT_EQ(grown["metrics"][21]["step"], 22);
  ASSERT_EQ(grown["problems"].size(), 1u);
  EXPECT_NE(grown["problems"][0].get<std::string>().find("metrics.jsonl line 22"),
            std::string::npos)
      << grown["problems"];

  // The page and uPlot are served from the binary.
  httplib::Client c("127.0.0.1", m.port());
  for (const char* path : {"/", "/monitor.js", "/uPlot.iife.min.js", "/uPlot.min.css"}) {
    auto res = c.Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 200) << path;
    EXPECT_GT(res->body.size(), 500u) << path;
  }
  EXPECT_NE(c.Get("/")->body.find("/uPlot.iife.min.js"), std::string::npos);
  EXPECT_EQ(c.Get("/nothing.js")->status, 404);
  // A second monitor on the same port fails at once, naming it.
  const CliResult taken = run_cli("monitor " + root_ + "/a --port " + std::to_string(m.port()));
  EXPECT_EQ(taken.code, 1) << taken.out;
  EXPECT_NE(taken.out.find("cannot listen on 127.0.0.1:" + std::to_string(m.port())),
            std::string::npos)
      << taken.out;
  EXPECT_EQ(m.stop(), 0);  // SIGTERM stops it cleanly
}

// The page in headless Chromium: every chart drawn (a canvas each), the straggler named,
// goodput shown.
TEST_F(MonitorCli, HeadlessBrowserDrawsEveryChart) {
  if (!fs::exists(kChromium))
    GTEST_SKIP() << kChromium << " is missing: run scripts/setup.sh (it installs chromium)";
  write_run(root_ + "/run", true);
  MonitorProcess m({root_ + "/run"}, root_);
  ASSERT_GT(m.port(), 0);
  // Its own profile directory: parallel tests and the user's profile stay apart.
  const CliResult r =
      run_shell("timeout -k 5 60 " + std::string(kChromium) +
                " --headless=new --no-sandbox --disable-gpu --user-data-dir=" + root_ +
                "/chromium --virtual-time-budget=8000 --dump-dom " + m.url() + " 2>" + root_ +
                "/chromium.err");
  ASSERT_EQ(r.code, 0) << read_file(root_ + "/chromium.err");
  const std::string& dom = r.out;
  EXPECT_NE(dom.find("data-ready=\"1\""), std::string::npos) << dom;
  const size_t plots_at = dom.find("data-plots=\"");
  ASSERT_NE(plots_at, std::string::npos) << dom;
  const size_t charts = kStepMetrics.size() + kRankMetrics.size();
  EXPECT_GE(std::atoi(dom.c_str() + plots_at + 12), static_cast<int>(charts)) << dom;
  size_t canvases = 0;
  for (size_t at = dom.find("<canvas"); at != std::string::npos; at = dom.find("<canvas", at + 1))
    ++canvases;
  EXPECT_GE(canvases, charts);
  EXPECT_NE(dom.find("straggler: rank 1 (compute_s 0.9 s vs median 0.4 s"), std::string::npos)
      << dom;
  EXPECT_NE(dom.find("goodput 74.8%"), std::string::npos) << dom;
  for (const std::string& metric : kStepMetrics)
    EXPECT_NE(dom.find(">" + metric + "<"), std::string::npos) << metric;
  EXPECT_EQ(m.stop(), 0);
}

// A rank's Prometheus endpoint: each hyperion_* gauge with a rank label becomes a series
// over the rank's step; a scrape at the same step adds nothing; an endpoint that does
// not answer is reported, not fatal.
TEST_F(MonitorCli, ScrapesRankEndpointsByStep) {
  using hyperion::monitor::Labels;
  hyperion::monitor::MetricsRegistry reg;
  const Labels l = {{"job", "j"}, {"rank", "3"}, {"host", "h"}};
  auto& step = reg.gauge("hyperion_train_step", "Last step.", l);
  auto& loss = reg.gauge("hyperion_train_loss", "Loss.", l);
  reg.gauge("hyperion_host_memory_available_bytes", "Bytes.", l).set(1e9);
  reg.counter("hyperion_train_tokens_total", "Tokens.", l).inc(5);  // a counter: not drawn
  reg.gauge("hyperion_unranked", "No rank label.").set(1);
  step.set(1);
  loss.set(4.0);
  hyperion::monitor::MetricsExporter exporter(reg, "127.0.0.1", 0, "rank 3");
  // A port nothing listens on: one the kernel picks, bound without listen() and closed.
  int dead_port = 0;
  {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    dead_port = ntohs(addr.sin_port);
    close(fd);
  }
  const std::string url = "http://127.0.0.1:" + std::to_string(exporter.port());
  const std::string dead = "http://127.0.0.1:" + std::to_string(dead_port) + "/metrics";
  MonitorProcess m({url, dead, "--poll-seconds", "0.1"}, root_);
  ASSERT_GT(m.port(), 0);
  auto points = [&](const json& d) {
    const json& s = d["series"];
    return s.contains("hyperion_train_loss") && s["hyperion_train_loss"].contains("3")
               ? s["hyperion_train_loss"]["3"].size()
               : 0u;
  };
  json d = m.data();
  for (int i = 0; i < 100 && points(d) < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    d = m.data();
  }
  ASSERT_EQ(points(d), 1u) << d.dump();
  step.set(2);
  loss.set(3.5);
  for (int i = 0; i < 100 && points(d) < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    d = m.data();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // scrapes at step 2 again
  d = m.data();
  ASSERT_EQ(points(d), 2u) << d.dump();
  EXPECT_EQ(d["series"]["hyperion_train_loss"]["3"][1], json({2.0, 3.5}));
  EXPECT_EQ(d["series"]["hyperion_host_memory_available_bytes"]["3"][0], json({1.0, 1e9}));
  EXPECT_FALSE(d["series"].contains("hyperion_train_step"));
  EXPECT_FALSE(d["series"].contains("hyperion_train_tokens_total"));
  EXPECT_FALSE(d["series"].contains("hyperion_unranked"));
  EXPECT_EQ(d["series_ranks"]["3"]["host"], "h");
  ASSERT_EQ(d["scrapes"].size(), 2u);
  EXPECT_TRUE(d["scrapes"][0]["error"].is_null());
  EXPECT_GT(d["scrapes"][1]["failed"].get<int>(), 0);
  EXPECT_NE(d["scrapes"][1]["error"].get<std::string>().find("no answer"), std::string::npos);
  EXPECT_EQ(m.stop(), 0);
}

}  // namespace
