// `hyperion cluster` and `hyperion workload` end to end on the local backend (issue 18):
// real supervisors, real processes, real 2-rank training under mpirun.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../train/train_test_util.h"
#include "cli_test_util.h"
#include "launch/process_session.h"

namespace hyperion {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing_util::CliResult;

template <typename Fn>
bool eventually(Fn&& fn, double seconds = 120) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (fn()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return fn();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Each test has its own state directory and deletes its clusters (and with them every
// supervisor and workload process) at the end.
class WorkloadCli : public ::testing::Test {
 protected:
  void SetUp() override {
    home_ = testing_util::process_temp_root("workload_cli") + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(home_);
    fs::create_directories(home_);
  }
  void TearDown() override {
    for (const std::string& c : clusters_) hy("cluster delete --cluster " + c);
  }
  CliResult hy(const std::string& args) {
    return testing_util::run_shell("cd " + home_ + " && HYPERION_HOME=" + home_ + " " +
                                   HYPERION_CLI_PATH + " " + args + " 2>&1");
  }
  void create_cluster(const std::string& name, int cores) {
    const CliResult r =
        hy("cluster create --cluster " + name + " --cores " + std::to_string(cores));
    ASSERT_EQ(r.code, 0) << r.out;
    clusters_.push_back(name);
  }
  json status(const std::string& cluster, const std::string& w) {
    const CliResult r = hy("workload status --json --cluster " + cluster + " --workload " + w);
    EXPECT_EQ(r.code, 0) << r.out;
    return json::parse(r.out, nullptr, false);
  }
  bool reaches(const std::string& cluster, const std::string& w, const std::string& state,
               double seconds = 180) {
    return eventually([&] { return status(cluster, w).value("state", "") == state; }, seconds);
  }
  std::string home_;
  std::vector<std::string> clusters_;
};

// Four creates of one name at once: exactly one makes the cluster; the others are told it
// exists (exit 2), never that its directory holds foreign files.
TEST_F(WorkloadCli, ConcurrentCreatesOfOneNameMakeOneCluster) {
  std::string cmd = "cd " + home_ + " && for i in 1 2 3 4; do (HYPERION_HOME=" + home_ + " " +
                    HYPERION_CLI_PATH + " cluster create --cluster race --cores 1 > out.$i " +
                    "2>&1; echo $? > rc.$i) & done; wait";
  ASSERT_EQ(testing_util::run_shell(cmd).code, 0);
  clusters_.push_back("race");
  int made = 0, exists = 0;
  for (int i = 1; i <= 4; ++i) {
    const std::string rc = slurp(home_ + "/rc." + std::to_string(i));
    const std::string out = slurp(home_ + "/out." + std::to_string(i));
    if (std::stoi(rc) == 0) ++made;
    if (std::stoi(rc) == 2 && out.find("cluster 'race' exists") != std::string::npos) ++exists;
    EXPECT_EQ(out.find("not a hyperion cluster"), std::string::npos) << out;
  }
  EXPECT_EQ(made, 1);
  EXPECT_EQ(exists, 3);
}

TEST_F(WorkloadCli, BadNamesAndRequestsAreUsageErrors) {
  CliResult r = hy("cluster create --cluster Bad_Name");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("cluster name 'Bad_Name' must start with a lowercase letter"),
            std::string::npos)
      << r.out;
  r = hy("cluster create --cluster dev --backend kubernetes");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("'kubernetes'"), std::string::npos) << r.out;
  r = hy("workload status --cluster nope --workload w");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("no cluster 'nope'"), std::string::npos) << r.out;
  create_cluster("dev", 1);
  r = hy("cluster create --cluster dev");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("cluster 'dev' exists"), std::string::npos) << r.out;
  r = hy("workload create --cluster dev --workload w --nproc 2 --command true");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("needs 2 cores (2 ranks x 1), but cluster dev has 1"), std::string::npos)
      << r.out;
  r = hy("workload create --cluster dev --workload " + std::string(41, 'w') + " --command true");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("at most 40"), std::string::npos) << r.out;
  r = hy("workload create --cluster dev --workload w --command true --priority urgent");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("'urgent'"), std::string::npos) << r.out;
  r = hy("workload create --cluster dev --workload w --command true --restart-on-exit-codes 1,x");
  EXPECT_EQ(r.code, 2);
  r = hy("workload create --cluster dev --workload w");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--command"), std::string::npos) << r.out;
  r = hy("workload logs --cluster dev --workload ghost");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("no workload 'ghost'"), std::string::npos) << r.out;
  for (const char* cmd : {"cluster create", "cluster describe", "workload create",
                          "workload status", "workload logs"}) {
    r = hy(std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_NE(r.out.find("--cluster"), std::string::npos) << r.out;
  }
}

// Values that would be read as something else are usage errors naming the flag: an empty
// or malformed --restart-on-exit-codes list (never "restart on no code"), an --env key
// given twice (which value would the workload see?) or one no shell could name. Nothing
// is submitted.
TEST_F(WorkloadCli, MalformedExitCodesAndEnvAreUsageErrors) {
  create_cluster("dev", 1);
  const std::string submit = "workload create --cluster dev --workload w ";
  const std::string create = submit + "--command true ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--restart-on-exit-codes ''", "--restart-on-exit-codes must not be empty"},
      {"--restart-on-exit-codes 1,,2", "--restart-on-exit-codes '1,,2': empty item"},
      {"--restart-on-exit-codes 1,", "--restart-on-exit-codes '1,': empty item"},
      {"--restart-on-exit-codes 3,3", "--restart-on-exit-codes '3,3': '3' is given twice"},
      {"--env A=1 --env A=2", "--env: A is given twice"},
      {"--env 'A B=1'", "--env 'A B=1': 'A B' is not a variable name"},
      {"--env 1A=1", "--env '1A=1': '1A' is not a variable name"},
  };
  for (const auto& [flags, message] : cases) {
    const CliResult r = hy(create + flags);
    EXPECT_EQ(r.code, 2) << flags << "\n" << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << flags << "\n" << r.out;
  }
  CliResult r = hy("workload list --cluster dev --json");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(json::parse(r.out, nullptr, false), json::array()) << r.out;
  // Well-formed ones are kept as given; a workload's --env wins over the supervisor's
  // default of the same variable, which the workload sees once.
  r = hy(submit +
         "--restart-on-exit-codes ' 1, 7' --env OMP_NUM_THREADS=3 --env B=x=y "
         "--command 'env | grep -e ^OMP_NUM_THREADS= -e ^B='");
  ASSERT_EQ(r.code, 0) << r.out;
  const json spec = json::parse(slurp(home_ + "/clusters/dev/workloads/w/spec.json"));
  EXPECT_EQ(spec["restart_on_exit_codes"], json::array({1, 7})) << spec.dump();
  EXPECT_EQ(spec["env"], json::parse(R"([["OMP_NUM_THREADS", "3"], ["B", "x=y"]])"))
      << spec.dump();
  ASSERT_TRUE(reaches("dev", "w", "succeeded")) << status("dev", "w").dump();
  std::string log = slurp(home_ + "/clusters/dev/workloads/w/output.log");
  log.insert(0, 1, '\n');
  size_t seen = 0;
  for (size_t at = log.find("\nOMP_NUM_THREADS="); at != std::string::npos;
       at = log.find("\nOMP_NUM_THREADS=", at + 1))
    ++seen;
  EXPECT_EQ(seen, 1u) << log;
  EXPECT_NE(log.find("\nOMP_NUM_THREADS=3\n"), std::string::npos) << log;
  EXPECT_NE(log.find("\nB=x=y\n"), std::string::npos) << log;
}

// A directory where the cluster's state would go that holds something else is never
// adopted (cluster delete would remove it with the cluster): create refuses, touching
// nothing. An empty one is fine.
TEST_F(WorkloadCli, CreateRefusesADirectoryThatIsNotACluster) {
  const std::string dir = home_ + "/clusters/dev";
  fs::create_directories(dir);
  std::ofstream(dir + "/notes.txt") << "mine\n";
  const CliResult r = hy("cluster create --cluster dev --cores 1");
  if (r.code == 0) clusters_.push_back("dev");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("not a hyperion cluster (no cluster.json)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("clusters/dev"), std::string::npos) << r.out;
  EXPECT_EQ(slurp(dir + "/notes.txt"), "mine\n");
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"notes.txt"});
  const CliResult list = hy("cluster list --json");
  EXPECT_EQ(list.code, 0) << list.out;
  EXPECT_EQ(json::parse(list.out, nullptr, false), json::array()) << list.out;
  fs::create_directories(home_ + "/clusters/empty");
  create_cluster("empty", 1);
}

// A relative HYPERION_HOME names the same state for the supervisor (which runs in /) as
// for the command that started it.
TEST_F(WorkloadCli, RelativeHomeIsTheSameStateForTheSupervisor) {
  clusters_.push_back("rel");  // deleted at the end whatever happens
  const CliResult r = testing_util::run_shell("cd " + home_ + " && HYPERION_HOME=. " +
                                              HYPERION_CLI_PATH +
                                              " cluster create --cluster rel --cores 1 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(home_ + "/clusters/rel/cluster.json"));
  ASSERT_EQ(hy("workload create --cluster rel --workload w --command true").code, 0);
  EXPECT_TRUE(reaches("rel", "w", "succeeded")) << status("rel", "w").dump();
}

TEST_F(WorkloadCli, UserErrorIsNotRestartedAndStatusSaysWhy) {
  create_cluster("dev", 1);
  CliResult r =
      hy("workload create --cluster dev --workload oops --max-restarts 3 --command "
         "'echo loading the config; echo \"error: no such file\" >&2; exit 1'");
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(reaches("dev", "oops", "failed"));
  const json s = status("dev", "oops");
  EXPECT_EQ(s["workload"], "oops");
  EXPECT_EQ(s["cluster"], "dev");
  EXPECT_EQ(s["backend"], "local");
  EXPECT_EQ(s["restarts"], 0);
  EXPECT_EQ(s["last_exit_code"], 1);
  EXPECT_NE(s["reason"].get<std::string>().find("exit code 1: a user error, not restarted"),
            std::string::npos)
      << s.dump();
  const std::string lines = s["last_log_lines"].dump();
  EXPECT_NE(lines.find("error: no such file"), std::string::npos) << lines;
  r = hy("workload status --cluster dev --workload oops");
  EXPECT_NE(r.out.find("last output before it:"), std::string::npos) << r.out;
  // logs: the output and the supervisor's lines; --follow returns once it is final.
  r = hy("workload logs --follow --cluster dev --workload oops");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("loading the config"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("== hyperion workload oops: attempt 1 ended"), std::string::npos) << r.out;
  r = hy("workload list --cluster dev --json");
  const json list = json::parse(r.out);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["state"], "failed");
  // The same name again replaces a finished workload.
  r = hy("workload create --cluster dev --workload oops --command true");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(reaches("dev", "oops", "succeeded"));
}

TEST_F(WorkloadCli, QueuedWorkSaysWhatItWaitsFor) {
  create_cluster("one", 1);
  ASSERT_EQ(hy("workload create --cluster one --workload first --command 'sleep 300'").code, 0);
  ASSERT_TRUE(reaches("one", "first", "running"));
  ASSERT_EQ(hy("workload create --cluster one --workload second --command true").code, 0);
  ASSERT_TRUE(eventually([&] { return status("one", "second").value("queue_position", 0) == 1; }));
  const json s = status("one", "second");
  EXPECT_EQ(s["state"], "queued");
  EXPECT_NE(s["reason"].get<std::string>().find("waiting for 1 cores: 0 of 1 free; held by first"),
            std::string::npos)
      << s.dump();
  const CliResult d = hy("workload delete --cluster one --workload first --grace-seconds 5");
  EXPECT_EQ(d.code, 0) << d.out;
  EXPECT_TRUE(reaches("one", "second", "succeeded"));
  EXPECT_EQ(status("one", "first")["state"], "deleted");
  const CliResult describe = hy("cluster describe --cluster one --json");
  EXPECT_EQ(json::parse(describe.out)["cores_used"], 0) << describe.out;
}

// A workload whose processes ignore SIGTERM, one in a process group of its own: delete
// stops them all (SIGKILL after the grace period) and leaves nothing behind.
TEST_F(WorkloadCli, DeleteLeavesNoProcessBehind) {
  create_cluster("dev", 1);
  ASSERT_EQ(hy("workload create --cluster dev --workload stubborn --command "
               "\"trap '' TERM; python3 -c 'import os, time; os.setpgid(0, 0); time.sleep(300)' "
               "& sleep 300 & wait\"")
                .code,
            0);
  ASSERT_TRUE(reaches("dev", "stubborn", "running"));
  const pid_t sid = status("dev", "stubborn")["pid"].get<pid_t>();
  ASSERT_TRUE(eventually([&] { return launch::session_processes(sid).size() >= 3; }));
  const std::vector<pid_t> members = launch::session_processes(sid);
  const auto start = std::chrono::steady_clock::now();
  const CliResult r = hy("workload delete --cluster dev --workload stubborn --grace-seconds 1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("deleted"), std::string::npos) << r.out;
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.9);
  EXPECT_TRUE(eventually([&] {
    for (pid_t p : members)
      if (::kill(p, 0) == 0) return false;
    return true;
  }));
  EXPECT_TRUE(launch::session_processes(sid).empty());
  const std::string log = slurp(home_ + "/clusters/dev/workloads/stubborn/output.log");
  EXPECT_NE(log.find("grace period over: SIGKILL"), std::string::npos) << log;
}

// The training command both tests below run: small, float32, a checkpoint every 25 steps.
std::string train_command(const std::string& root, const std::string& run, int steps,
                          int checkpoint_period = 25) {
  std::string cmd = HYPERION_CLI_PATH + std::string(" train");
  for (const std::string& o : testing_util::small_run_overrides(root, run, "float32", steps))
    cmd += " " + o;
  return cmd + " checkpoint_period=" + std::to_string(checkpoint_period) +
         " sample_count=0 eval_batches=1";
}

json last_metrics(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return json::parse(last, nullptr, false);
}

// Rank R's hyperion process in a workload's session (from its MPI environment).
pid_t rank_process(pid_t sid, int rank) {
  for (pid_t p : launch::session_processes(sid)) {
    if (slurp("/proc/" + std::to_string(p) + "/comm") != "hyperion\n") continue;
    const std::string env = slurp("/proc/" + std::to_string(p) + "/environ");
    if (env.find("OMPI_COMM_WORLD_RANK=" + std::to_string(rank) + '\0') != std::string::npos)
      return p;
  }
  return 0;
}

// The issue's drill: rank 1 of a 2-rank training workload is SIGKILLed after the step-50
// checkpoint; the workload restarts, resumes and ends with the unbroken run's loss.
TEST_F(WorkloadCli, KilledRankRestartsAndEndsWithTheUnbrokenLoss) {
  create_cluster("dev", 2);
  const std::string root = home_ + "/runs";
  const int steps = 600;  // a few seconds: time to kill a rank mid-run
  ASSERT_EQ(hy("workload create --cluster dev --workload ref --nproc 2 --command '" +
               train_command(root, "ref", steps) + "'")
                .code,
            0);
  ASSERT_TRUE(reaches("dev", "ref", "succeeded", 600)) << status("dev", "ref").dump();
  ASSERT_EQ(hy("workload create --cluster dev --workload drill --nproc 2 --max-restarts 2 "
               "--command '" +
               train_command(root, "drill", steps) + "'")
                .code,
            0);
  ASSERT_TRUE(eventually([&] { return fs::exists(root + "/drill/checkpoints/50"); }, 600));
  const pid_t sid = status("dev", "drill")["pid"].get<pid_t>();
  const pid_t victim = rank_process(sid, 1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_TRUE(reaches("dev", "drill", "succeeded", 600)) << status("dev", "drill").dump();
  const json s = status("dev", "drill");
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["attempts"], 2);
  const std::string log = slurp(home_ + "/clusters/dev/workloads/drill/output.log");
  EXPECT_NE(log.find("a system failure; restart 1 of 2"), std::string::npos) << log;
  EXPECT_NE(log.find("resume: from"), std::string::npos) << log;
  const json ref = last_metrics(root + "/ref"), drill = last_metrics(root + "/drill");
  EXPECT_EQ(ref["step"], steps);
  EXPECT_EQ(drill["step"], steps);
  EXPECT_EQ(drill["loss"], ref["loss"]) << "ref " << ref.dump() << "\ndrill " << drill.dump();
}

// A high-priority workload that does not fit preempts a low-priority training, which is
// requeued, resumes from its checkpoint and finishes.
TEST_F(WorkloadCli, HighPriorityPreemptsLowWhichResumes) {
  create_cluster("dev", 2);
  const std::string root = home_ + "/runs";
  ASSERT_EQ(hy("workload create --cluster dev --workload background --priority low --nproc 2 "
               "--grace-seconds 5 --command '" +
               train_command(root, "background", 2000, 100) + "'")
                .code,
            0);
  ASSERT_TRUE(eventually([&] { return fs::exists(root + "/background/checkpoints/100"); }, 600));
  ASSERT_EQ(hy("workload create --cluster dev --workload urgent --priority high --nproc 2 "
               "--command 'sleep 1'")
                .code,
            0);
  ASSERT_TRUE(reaches("dev", "background", "preempted", 60)) << status("dev", "background").dump();
  const json p = status("dev", "background");
  EXPECT_NE(p["reason"].get<std::string>().find("preempted by higher-priority urgent"),
            std::string::npos)
      << p.dump();
  EXPECT_EQ(p["restarts"], 0);
  EXPECT_TRUE(reaches("dev", "urgent", "succeeded", 120));
  ASSERT_TRUE(reaches("dev", "background", "succeeded", 600)) << status("dev", "background").dump();
  const json s = status("dev", "background");
  EXPECT_EQ(s["preemptions"], 1);
  EXPECT_EQ(s["restarts"], 0);
  const std::string log = slurp(home_ + "/clusters/dev/workloads/background/output.log");
  EXPECT_NE(log.find("resume: from"), std::string::npos) << log;
  // SIGTERM reached the ranks (not mpirun first): they saved where they stopped.
  EXPECT_NE(log.find("saving a checkpoint; the same command resumes from it"), std::string::npos)
      << log;
  EXPECT_EQ(last_metrics(root + "/background")["step"], 2000);
}

}  // namespace
}  // namespace hyperion
