// A training rank's monitoring: its Prometheus endpoint (labels job, rank, host; step,
// collective and host metrics), ranks.jsonl, the event log of a crash and resume and the
// goodput the CLI computes from it, and a port in use.
#include "train/training_monitor.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include "../cli/cli_test_util.h"
#include "train_test_util.h"

#include "monitor/goodput.h"

namespace hyperion {
namespace {

using testing_util::run_cli;

// A port free right now, picked below the kernel's ephemeral range: a port got by binding
// port 0 is handed to the next outgoing connection (another test's MPI ranks, a client) as
// soon as it is released, and a parallel test run then finds it taken.
int free_port() {
  static std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(10000, 32000);
  for (int tries = 0; tries < 500; ++tries) {
    const int port = pick(rng);
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) break;
    const int one = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(s);
    if (ok) return port;
  }
  ADD_FAILURE() << "no free loopback port in 10000-32000";
  return 0;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<nlohmann::json> json_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string l;
  while (std::getline(in, l)) out.push_back(nlohmann::json::parse(l));
  return out;
}

StepMetrics step_metrics(int64_t step) {
  StepMetrics m;
  m.step = step;
  m.loss = 5.0 - 0.1 * double(step);
  m.grad_norm = 0.5;
  m.lr = 1e-3;
  m.step_s = 0.2;
  m.data_wait_s = 0.01;
  m.comm_wait_s = 0.04;
  m.tokens_per_s = 1000;
  m.mfu = 0.25;
  return m;
}

TEST(TrainingMonitor, ServesLabelledStepAndHostMetrics) {
  const std::string dir = testing_util::process_temp_root("training_monitor") + "/serve";
  std::filesystem::create_directories(dir);
  TrainConfig t;
  t.run_name = "job-a";
  t.log_period = 2;
  t.monitor.metrics_port = free_port();
  t.monitor.metrics_host = "127.0.0.1";
  auto comm = dist::make_single_process_communicator();
  float x = 1;
  TrainingMonitor mon(t, *comm, dir, monitor::unix_time());
  ASSERT_EQ(mon.metrics_port(), t.monitor.metrics_port);
  mon.init_done();
  for (int64_t s = 1; s <= 4; ++s) {
    mon.step_started(s);
    comm->all_reduce(&x, 1, dist::ReduceOp::kSum);
    mon.step_done(step_metrics(s));
  }
  mon.save_started(4);
  mon.save_done(4, 0.125);

  httplib::Client c("127.0.0.1", mon.metrics_port());
  auto res = c.Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  const std::string& text = res->body;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const monitor::Labels l = {{"job", "job-a"}, {"rank", "0"}, {"host", host}};
  using monitor::parse_prometheus_value;
  EXPECT_EQ(parse_prometheus_value(text, "hyperion_train_step", l), 4);
  EXPECT_EQ(parse_prometheus_value(text, "hyperion_train_loss", l), 4.6);
  EXPECT_EQ(parse_prometheus_value(text, "hyperion_train_mfu", l), 0.25);
  EXPECT_NEAR(*parse_prometheus_value(text, "hyperion_train_compute_seconds", l), 0.15, 1e-12);
  EXPECT_NEAR(*parse_prometheus_value(text, "hyperion_train_data_wait_seconds_total", l), 0.04,
              1e-12);
  EXPECT_NEAR(
      *parse_prometheus_value(text, "hyperion_train_exposed_communication_seconds_total", l), 0.16,
      1e-12);
  EXPECT_EQ(parse_prometheus_value(text, "hyperion_train_step_duration_seconds_count", l), 4);
  EXPECT_EQ(parse_prometheus_value(text, "hyperion_train_checkpoint_save_seconds", l), 0.125);
  monitor::Labels ar = l;
  ar.emplace_back("collective", "all_reduce");
  EXPECT_EQ(parse_prometheus_value(text, "hyperion_train_collective_calls_total", ar), 4);
  EXPECT_EQ(parse_prometheus_value(text, "hyperion_train_collective_sent_bytes_total", ar), 16);
  EXPECT_GT(*parse_prometheus_value(text, "process_resident_memory_bytes", l), 1e6);
  EXPECT_GT(*parse_prometheus_value(text, "process_open_fds", l), 2);
  EXPECT_GT(*parse_prometheus_value(text, "hyperion_host_memory_available_bytes", l), 0);
  EXPECT_TRUE(parse_prometheus_value(text, "hyperion_process_cpu_cores", l).has_value());

  // Rank 0 gathered at steps 2 and 4.
  const auto ranks = json_lines(dir + "/ranks.jsonl");
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[1]["step"], 4);
  ASSERT_EQ(ranks[1]["ranks"].size(), 1u);
  EXPECT_EQ(ranks[1]["ranks"][0]["host"], host);
  EXPECT_NEAR(ranks[1]["ranks"][0]["compute_s_mean"].get<double>(), 0.15, 1e-12);
  EXPECT_TRUE(ranks[1]["stragglers"].empty());
  const auto events = json_lines(dir + "/events.jsonl");
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[0]["event"], "job_start");
  EXPECT_EQ(events[1]["event"], "process_start");
  EXPECT_EQ(events[1]["attempt"], 1);
  EXPECT_EQ(events.back()["event"], "checkpoint_save_end");
}

TEST(TrainingMonitor, DisabledWritesNothing) {
  const std::string dir = testing_util::process_temp_root("training_monitor") + "/off";
  std::filesystem::create_directories(dir);
  TrainConfig t;
  t.monitor.enabled = false;
  t.monitor.metrics_port = free_port();
  auto comm = dist::make_single_process_communicator();
  TrainingMonitor mon(t, *comm, dir, monitor::unix_time());
  mon.step_done(step_metrics(10));
  EXPECT_EQ(mon.metrics_port(), 0);
  EXPECT_FALSE(std::filesystem::exists(dir + "/events.jsonl"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/ranks.jsonl"));
}

std::string small_run(const std::string& root, const std::string& run) {
  std::string args;
  for (const std::string& o : testing_util::small_run_overrides(root, run, "float32", 6))
    args += " " + o;
  return args + " sample_count=0 eval_batches=1";
}

// The drill: a run dies after step 3 (checkpoint at step 2), the same command
// resumes it, and goodput accounts both processes.
TEST(TrainingMonitor, CrashAndResumeAreAccountedInGoodput) {
  const std::string root = testing_util::process_temp_root("training_monitor");
  // Synchronous saves: an abort right after an async save could beat its write.
  const std::string args =
      small_run(root, "crash") + " checkpoint_period=2 crash_at_step=3 async_checkpointing=false";
  const auto first = run_cli("train" + args);
  EXPECT_NE(first.code, 0) << first.out;
  EXPECT_NE(first.out.find("crash_at_step=3"), std::string::npos) << first.out;
  const auto second = run_cli("train" + args);
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_NE(second.out.find("resume: from"), std::string::npos) << second.out;
  // The abort left every thread's stack and a crash event.
  std::vector<std::string> dumps;
  for (const auto& e : std::filesystem::directory_iterator(root + "/crash/stacks"))
    dumps.push_back(e.path().string());
  ASSERT_EQ(dumps.size(), 1u);
  EXPECT_EQ(std::filesystem::path(dumps[0]).filename().string().rfind("rank-0-", 0), 0u);
  const std::string dump = read_text(dumps[0]);
  EXPECT_NE(dump.find("SIGABRT"), std::string::npos) << dump;
  EXPECT_NE(dump.find("TrainingMonitor::step_done"), std::string::npos) << dump;
  EXPECT_NE(first.out.find("stacks of"), std::string::npos) << first.out;
  int crashes = 0;
  for (const auto& e : json_lines(root + "/crash/events.jsonl"))
    if (e["event"] == "crash") {
      ++crashes;
      EXPECT_EQ(e["signal"], "SIGABRT");
      EXPECT_EQ(e["rank"], 0);
    }
  EXPECT_EQ(crashes, 1);

  const monitor::GoodputReport r = monitor::compute_goodput(root + "/crash");
  EXPECT_EQ(r.processes, 2);
  EXPECT_EQ(r.disruptions, 1);
  EXPECT_TRUE(r.finished);
  EXPECT_EQ(r.steps_kept, 6);
  EXPECT_EQ(r.steps_lost, 1);  // step 3 ran after the step-2 checkpoint
  EXPECT_GT(r.badput.at("wasted_progress"), 0);
  EXPECT_GT(r.badput.at("checkpoint_restore"), 0);
  EXPECT_GT(r.goodput, 0);
  EXPECT_LT(r.goodput, 1);

  const auto cli = run_cli("goodput " + root + "/crash --json", false);
  ASSERT_EQ(cli.code, 0) << cli.out;
  const auto j = nlohmann::json::parse(cli.out);
  EXPECT_DOUBLE_EQ(j["goodput"].get<double>(), r.goodput);
  EXPECT_EQ(j["steps_lost"], 1);
  const auto text = run_cli("goodput " + root + "/crash");
  EXPECT_NE(text.out.find("wasted_progress"), std::string::npos) << text.out;
}

// No step finishes within hang_timeout_s: every stack is dumped and a hang event logged,
// and the run goes on (abort_on_hang=false).
TEST(TrainingMonitor, HangDumpsStacksAndLogsAnEvent) {
  const std::string dir = testing_util::process_temp_root("training_monitor") + "/hang";
  std::filesystem::create_directories(dir);
  TrainConfig t;
  t.monitor.hang_timeout_s = 0.2;
  auto comm = dist::make_single_process_communicator();
  {
    TrainingMonitor mon(t, *comm, dir, monitor::unix_time());
    mon.step_done(step_metrics(1));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!std::filesystem::exists(dir + "/stacks") && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    // The event follows the dump; give it the same grace.
    auto hang_event = [&] {
      for (const auto& e : json_lines(dir + "/events.jsonl"))
        if (e["event"] == "hang") return e;
      return nlohmann::json();
    };
    while (hang_event().is_null() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const nlohmann::json e = hang_event();
    ASSERT_FALSE(e.is_null());
    EXPECT_EQ(e["rank"], 0);
    EXPECT_EQ(e["step"], 1);
    const std::string path = e["path"];
    EXPECT_EQ(path.rfind(dir + "/stacks/rank-0-", 0), 0u) << path;
    const std::string dump = read_text(path);
    EXPECT_NE(dump.find("hang: no step finished for "), std::string::npos) << dump;
    EXPECT_NE(dump.find("(last step 1)"), std::string::npos) << dump;
  }
  // goodput reads a log with a hang line.
  EXPECT_NO_THROW(monitor::compute_goodput(dir));
}

TEST(TrainingMonitor, GoodputCommandErrors) {
  EXPECT_EQ(run_cli("goodput").code, 2);
  const auto missing = run_cli("goodput /nonexistent/run");
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.out.find("/nonexistent/run"), std::string::npos) << missing.out;
  const std::string dir = testing_util::process_temp_root("training_monitor") + "/torn";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/events.jsonl")
      << "{\"time\":1,\"event\":\"job_start\",\"pid\":1}\n{\"time\":2,\"eve";
  const auto torn = run_cli("goodput " + dir);
  EXPECT_EQ(torn.code, 1);
  EXPECT_NE(torn.out.find("line 2"), std::string::npos) << torn.out;
  EXPECT_EQ(run_cli("goodput --help").code, 0);
}

// A port in use stops the run at set-up, naming the port and the rank.
TEST(TrainingMonitor, MetricsPortInUseNamesPortAndRank) {
  const std::string root = testing_util::process_temp_root("training_monitor");
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(s, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  const auto r = run_cli(fmt::format("train{} metrics_port={}", small_run(root, "port"), port));
  ::close(s);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find(std::to_string(port)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 0"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace hyperion
