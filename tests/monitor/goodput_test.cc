// Goodput from hand-written event logs, where every figure can be computed by hand.
#include "monitor/goodput.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "base/error.h"

namespace hyperion::monitor {
namespace {

std::string write_log(const std::string& name, const std::string& text) {
  const std::string dir = testing::TempDir() + "goodput_" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/events.jsonl") << text;
  return dir;
}

std::string ev(double t, const std::string& kind, const std::string& extra = "") {
  return "{\"time\":" + std::to_string(t) + ",\"event\":\"" + kind + "\",\"pid\":1" +
         (extra.empty() ? "" : "," + extra) + "}\n";
}

std::string step(double start, double end, int n, double wait = 0) {
  return ev(start, "step_start", "\"step\":" + std::to_string(n)) +
         ev(end, "step_end",
            "\"step\":" + std::to_string(n) + ",\"data_wait_s\":" + std::to_string(wait));
}

// One clean process: launch at 99, start 100, init to 110, three 10 s steps (1 s data
// wait each), a 2 s save, 3 s of evaluation, job_end at 148.
TEST(Goodput, OneCleanProcess) {
  std::string log = ev(100, "job_start") +
                    ev(100, "process_start", "\"attempt\":1,\"launch_time\":99") +
                    ev(110, "init_done") + step(110, 120, 1, 1) + step(120, 130, 2, 1) +
                    step(130, 140, 3, 1) + ev(140, "checkpoint_save_start", "\"step\":3") +
                    ev(142, "checkpoint_save_end", "\"step\":3") + ev(142, "eval_start") +
                    ev(145, "eval_end") + ev(148, "job_end", "\"step\":3");
  const GoodputReport r = compute_goodput(write_log("clean", log));
  EXPECT_DOUBLE_EQ(r.total_s, 49);  // 99 .. 148
  EXPECT_DOUBLE_EQ(r.productive_s, 27);
  EXPECT_DOUBLE_EQ(r.goodput, 27.0 / 49.0);
  EXPECT_DOUBLE_EQ(r.badput.at("program_startup"), 1);
  EXPECT_DOUBLE_EQ(r.badput.at("initialization"), 10);
  EXPECT_DOUBLE_EQ(r.badput.at("data_loading"), 3);
  EXPECT_DOUBLE_EQ(r.badput.at("checkpoint_save"), 2);
  EXPECT_DOUBLE_EQ(r.badput.at("other"), 6);  // eval 3 + the 3 s before job_end
  EXPECT_EQ(r.processes, 1);
  EXPECT_EQ(r.disruptions, 0);
  EXPECT_EQ(r.steps_kept, 3);
  EXPECT_TRUE(r.finished);
}

// The crash-and-resume case of docs/MONITORING.md: the first process saves at step 2,
// runs step 3, dies 4 s into step 4 (its crash line at 146); the second launches at 150,
// restores step 2 in 3 s, and runs steps 3 and 4 again.
TEST(Goodput, CrashAndResumeAcrossProcesses) {
  std::string log =
      ev(100, "job_start") + ev(100, "process_start", "\"attempt\":1,\"launch_time\":100") +
      ev(110, "init_done") + step(110, 120, 1) + step(120, 130, 2) +
      ev(130, "checkpoint_save_start", "\"step\":2") +
      ev(132, "checkpoint_save_end", "\"step\":2") + step(132, 142, 3) +
      ev(142, "step_start", "\"step\":4") + ev(146, "crash", "\"rank\":0,\"signal\":\"SIGABRT\"") +
      ev(151, "process_start", "\"attempt\":2,\"launch_time\":150") + ev(152, "restore_start") +
      ev(155, "restore_end", "\"step\":2") + ev(160, "init_done") + step(160, 170, 3) +
      step(170, 180, 4, 2) + ev(180, "job_end", "\"step\":4");
  const GoodputReport r = compute_goodput(write_log("crash", log));
  EXPECT_DOUBLE_EQ(r.total_s, 80);
  EXPECT_DOUBLE_EQ(r.productive_s, 10 + 10 + 10 + 8);  // steps 1, 2 (first), 3, 4 (second)
  EXPECT_DOUBLE_EQ(r.badput.at("program_startup"), 1);
  EXPECT_DOUBLE_EQ(r.badput.at("initialization"), 10 + (9 - 3));
  EXPECT_DOUBLE_EQ(r.badput.at("checkpoint_restore"), 3);
  EXPECT_DOUBLE_EQ(r.badput.at("checkpoint_save"), 2);
  EXPECT_DOUBLE_EQ(r.badput.at("data_loading"), 2);
  EXPECT_DOUBLE_EQ(r.badput.at("wasted_progress"), 10 + 4);  // step 3, and 4 s of step 4
  EXPECT_DOUBLE_EQ(r.badput.at("recovery"), 4);              // 146 .. 150
  EXPECT_NEAR(r.badput.at("other"), 0, 1e-9);
  EXPECT_EQ(r.processes, 2);
  EXPECT_EQ(r.disruptions, 1);
  EXPECT_EQ(r.steps_kept, 4);
  EXPECT_EQ(r.steps_lost, 1);
  // Productive plus every kind is the whole job.
  double sum = r.productive_s;
  for (const auto& [k, v] : r.badput) sum += v;
  EXPECT_NEAR(sum, r.total_s, 1e-9);
  const auto j = nlohmann::json::parse(goodput_json(r));
  EXPECT_DOUBLE_EQ(j["goodput"].get<double>(), 38.0 / 80.0);
  EXPECT_DOUBLE_EQ(j["badput"]["recovery"]["seconds"].get<double>(), 4);
  EXPECT_DOUBLE_EQ(j["badput"]["recovery"]["fraction"].get<double>(), 4.0 / 80.0);
  for (const std::string& k : badput_kinds()) EXPECT_TRUE(j["badput"].contains(k)) << k;
}

// A process that restored nothing after a crash starts over: all earlier steps are lost.
TEST(Goodput, RestartWithoutCheckpointLosesEverything) {
  std::string log = ev(0, "job_start") + ev(0, "process_start", "\"attempt\":1") +
                    ev(1, "init_done") + step(1, 2, 1) + step(2, 3, 2) +
                    ev(5, "process_start", "\"attempt\":2") + ev(6, "init_done") + step(6, 7, 1) +
                    step(7, 8, 2) + ev(8, "job_end", "\"step\":2");
  const GoodputReport r = compute_goodput(write_log("restart", log));
  EXPECT_EQ(r.steps_lost, 2);
  EXPECT_DOUBLE_EQ(r.badput.at("wasted_progress"), 2);
  EXPECT_DOUBLE_EQ(r.badput.at("recovery"), 2);
  EXPECT_DOUBLE_EQ(r.productive_s, 2);
}

std::string error_of(const std::string& dir) {
  try {
    compute_goodput(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Goodput, BadLogsNameTheLine) {
  const std::string good = ev(0, "job_start") + ev(0, "process_start");
  std::string msg = error_of(write_log("truncated", good + "{\"time\":1,\"ev"));
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  msg = error_of(write_log("foreign", "step,loss\n1,2.5\n"));
  EXPECT_NE(msg.find("line 1"), std::string::npos) << msg;
  msg = error_of(write_log("noevent", good + "{\"step\": 3, \"loss\": 1.5}\n"));
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  msg = error_of(write_log("kind", good + ev(1, "teleport")));
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("teleport"), std::string::npos) << msg;
  msg = error_of(write_log("backwards", good + ev(1, "init_done") + ev(-5, "step_start")));
  EXPECT_NE(msg.find("line 4"), std::string::npos) << msg;
  msg = error_of(write_log("huge", good + "{\"time\": 1, \"event\": \"step_start\", \"pad\": \"" +
                                          std::string(2 << 20, 'x') + "\"}\n"));
  EXPECT_NE(msg.find("line 3: longer than 1048576 bytes"), std::string::npos) << msg.substr(0, 300);
  msg = error_of(write_log("empty", ""));
  EXPECT_NE(msg.find("no job_start"), std::string::npos) << msg;
  msg = error_of(testing::TempDir() + "goodput_does_not_exist");
  EXPECT_NE(msg.find("cannot read"), std::string::npos) << msg;
}

}  // namespace
}  // namespace hyperion::monitor
