// The ranks' status files of a multi-host job and the launcher's report from them.
#include "train/rank_heartbeat.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "dist/communicator.h"

namespace hyperion {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const std::string d = testing::TempDir() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(RankHeartbeat, WritesRunningThenExitedOrAborting) {
  const std::string dir = fresh_dir("heartbeat");
  {
    RankHeartbeat a(dir, 0, "h1");
    auto st = read_rank_status(dir);
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st[0].rank, 0);
    EXPECT_EQ(st[0].host, "h1");
    EXPECT_EQ(st[0].state, "running");
    EXPECT_GT(st[0].time, 1.7e9);
    RankHeartbeat b(dir, 1, "h2");
    dist::notify_abort_observer();  // the communicator ending the job: the live one is b
    st = read_rank_status(dir);
    ASSERT_EQ(st.size(), 2u);
    EXPECT_EQ(st[1].state, "aborting");
    EXPECT_TRUE(fs::exists(dir + "/" + kAbortedMarker));  // what the launcher waits on
  }
  const auto st = read_rank_status(dir);
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].state, "exited");
  EXPECT_EQ(st[1].state, "aborting");  // not overwritten by the destructor
}

TEST(RankHeartbeat, TheLostRanksAreTheOnesStillRunning) {
  std::vector<RankStatus> st = {{0, "h1", 10, 100.0, "signal 15"},
                                {1, "h1", 11, 100.0, "signal 15"},
                                {2, "h2", 12, 98.0, "running"},
                                {3, "h2", 13, 98.1, "running"}};
  EXPECT_EQ(diagnose_lost_ranks(st, 4, 100.5),
            "lost without a word (host down, killed or cut off): host h2: rank 2 (last heard "
            "2.5 s before the job ended), rank 3 (last heard 2.4 s before the job ended)");
  // Every rank accounted for (finished, signalled or aborting): nothing to add.
  st[2].state = "aborting";
  st[3].state = "exited";
  EXPECT_EQ(diagnose_lost_ranks(st, 4, 100.5), "");
  // A rank that never wrote a status (its host failed at start-up).
  st.pop_back();
  EXPECT_EQ(diagnose_lost_ranks(st, 4, 100.5), "rank 3 never reported (did not start)");
  EXPECT_EQ(diagnose_lost_ranks({}, 4, 100.5), "");
}

TEST(RankHeartbeat, UnreadableFilesAreSkipped) {
  const std::string dir = fresh_dir("heartbeat-bad");
  std::ofstream(dir + "/rank-0") << "garbage\n";
  std::ofstream(dir + "/rank-1") << "1 h2 42 123.5 signal 15\n";
  std::ofstream(dir + "/other") << "0 h1 1 1 running\n";
  const auto st = read_rank_status(dir);
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].rank, 1);
  EXPECT_EQ(st[0].pid, 42);
  EXPECT_EQ(st[0].state, "signal 15");
  EXPECT_TRUE(read_rank_status(dir + "/missing").empty());
}

}  // namespace
}  // namespace hyperion
