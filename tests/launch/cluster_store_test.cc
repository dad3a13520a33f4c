#include "launch/cluster_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../test_files.h"
#include "base/error.h"

namespace hyperion::launch {
namespace {

using testing_util::TempDir;

TEST(WorkloadNames, RulesAreNamedInTheError) {
  check_name("workload", "llama-7b-run2");
  const auto expect_usage = [](const std::string& name, const std::string& words) {
    try {
      check_name("workload", name);
      FAIL() << "accepted '" << name << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_usage("", "--workload is required");
  expect_usage(std::string(41, 'a'), "41 characters long; at most 40");
  expect_usage("7b", "must start with a lowercase letter");
  expect_usage("Llama", "must start with a lowercase letter");
  expect_usage("llama_7b", "has '_'");
  expect_usage("a/../b", "has '/'");
  expect_usage("llama-", "must not end with '-'");
}

TEST(ClusterStore, SpecsAndStatusesRoundTrip) {
  TempDir tmp;
  ClusterStore store(tmp.file("clusters"));
  ClusterSpec c;
  c.name = "dev";
  c.cores = 2;
  c.created = 1.5;
  store.save_cluster(c);
  EXPECT_EQ(store.clusters(), std::vector<std::string>{"dev"});
  EXPECT_EQ(store.load_cluster("dev").cores, 2);
  WorkloadSpec w;
  w.name = "job";
  w.cluster = "dev";
  w.command = "echo 'a b'";
  w.nproc = 2;
  w.priority = Priority::kHigh;
  w.max_restarts = 3;
  w.restart_on_exit_codes = {1, 7};
  w.env = {{"A", "x=y"}};
  w.sequence = store.next_sequence("dev");
  EXPECT_EQ(w.sequence, 1);
  store.save_spec(w);
  EXPECT_EQ(store.next_sequence("dev"), 2);
  const WorkloadSpec back = store.load_spec("dev", "job");
  EXPECT_EQ(back.command, w.command);
  EXPECT_EQ(back.priority, Priority::kHigh);
  EXPECT_EQ(back.restart_on_exit_codes, w.restart_on_exit_codes);
  EXPECT_EQ(back.env, w.env);
  EXPECT_EQ(store.load_status("dev", "job").state, WorkloadState::kQueued);
  WorkloadStatus s;
  s.state = WorkloadState::kFailed;
  s.has_exit = true;
  s.last_exit_code = 1;
  s.reason = "r";
  s.session_token = "0123456789abcdef0123456789abcdef";
  store.save_status("dev", "job", s);
  EXPECT_EQ(store.load_status("dev", "job").session_token, s.session_token);
  const nlohmann::json j = status_json(back, Backend::kLocal, store.load_status("dev", "job"));
  for (const char* key :
       {"workload", "cluster", "backend", "state", "restarts", "last_exit_code", "reason"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["state"], "failed");
  EXPECT_EQ(j["last_exit_code"], 1);
  EXPECT_FALSE(store.delete_requested("dev", "job").has_value());
  store.request_delete("dev", "job", 2.5);
  EXPECT_EQ(store.delete_requested("dev", "job"), 2.5);
}

TEST(ClusterStore, MissingAndDamagedFilesAreNamed) {
  TempDir tmp;
  ClusterStore store(tmp.file("clusters"));
  testing_util::expect_error([&] { store.load_cluster("nope"); }, {"no cluster 'nope'", "none"});
  ClusterSpec c;
  c.name = "dev";
  c.cores = 1;
  store.save_cluster(c);
  testing_util::expect_error([&] { store.load_spec("dev", "ghost"); },
                             {"no workload 'ghost' in cluster 'dev'"});
  std::filesystem::create_directories(store.workload_dir("dev", "bad"));
  std::ofstream(store.workload_dir("dev", "bad") + "/spec.json") << "{\"name\": ";
  testing_util::expect_error([&] { store.load_spec("dev", "bad"); }, {"bad/spec.json", "JSON"});
}

TEST(ClusterStore, TailLinesKeepsTheLastOnes) {
  TempDir tmp;
  const std::string path = tmp.write("log", "a\nb\n\nc\nd");
  EXPECT_EQ(tail_lines(path, 2), (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(tail_lines(path, 10), (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_TRUE(tail_lines(tmp.file("missing"), 3).empty());
}

}  // namespace
}  // namespace hyperion::launch
