#include "monitor/dashboard_data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace hyperion::monitor {
namespace {

namespace fs = std::filesystem;

class DashboardData : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "hyperion_dashboard_" + std::to_string(::getpid()) + "_" +
           testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

// Appended rows are read as they come; a torn last line waits for its newline; a file
// replaced (a resumed run rewrites metrics.jsonl) or shortened is read anew.
TEST_F(DashboardData, TailFollowsAppendsReplacementAndTruncation) {
  const std::string path = dir_ + "/metrics.jsonl";
  JsonlTail tail(path);
  tail.update();
  EXPECT_TRUE(tail.rows().empty());  // not written yet: no rows, no problem
  EXPECT_TRUE(tail.problems().empty());
  std::ofstream(path) << "{\"step\": 1}\n{\"step\": 2}\n{\"st";
  tail.update();
  ASSERT_EQ(tail.rows().size(), 2u);
  std::ofstream(path, std::ios::app) << "ep\": 3}\n";
  tail.update();
  ASSERT_EQ(tail.rows().size(), 3u);
  EXPECT_EQ(tail.rows()[2]["step"], 3);

  std::ofstream(dir_ + "/new") << "{\"step\": 1}\n{\"step\": 9}\n[1]\n{\"step\": 10}\n";
  fs::rename(dir_ + "/new", path);
  tail.update();
  ASSERT_EQ(tail.rows().size(), 3u);
  EXPECT_EQ(tail.rows()[1]["step"], 9);
  ASSERT_EQ(tail.problems().size(), 1u);
  EXPECT_EQ(tail.problems()[0], "metrics.jsonl line 3: not a JSON object (skipped)");

  std::ofstream(path) << "{\"step\": 5}\n";  // truncated in place
  tail.update();
  ASSERT_EQ(tail.rows().size(), 1u);
  EXPECT_EQ(tail.rows()[0]["step"], 5);
  EXPECT_TRUE(tail.problems().empty());
}

// A line over 1 MiB is skipped as a problem, never held; the rows around it are read.
TEST_F(DashboardData, AHugeLineIsSkippedNotHeld) {
  const std::string path = dir_ + "/metrics.jsonl";
  {
    std::ofstream out(path);
    out << "{\"step\": 1}\n{\"pad\": \"" << std::string(3 << 20, 'x') << "\"}\n{\"step\": 2}\n";
  }
  JsonlTail tail(path);
  tail.update();
  ASSERT_EQ(tail.rows().size(), 2u);
  EXPECT_EQ(tail.rows()[1]["step"], 2);
  ASSERT_EQ(tail.problems().size(), 1u);
  EXPECT_EQ(tail.problems()[0], "metrics.jsonl line 2: longer than 1 MiB (skipped)");
}

// A long run is thinned evenly for the page, its last row kept; goodput without an
// event log says why.
TEST_F(DashboardData, RunDirThinsRowsAndExplainsMissingGoodput) {
  {
    std::ofstream out(dir_ + "/metrics.jsonl");
    for (int s = 1; s <= 1001; ++s) out << "{\"step\": " << s << "}\n";
  }
  RunDirReader reader(dir_);
  const nlohmann::json d = reader.read(100);
  EXPECT_EQ(d["metrics_rows"], 1001);
  EXPECT_LE(d["metrics"].size(), 100u);
  EXPECT_GE(d["metrics"].size(), 50u);
  EXPECT_EQ(d["metrics"][0]["step"], 1);
  EXPECT_EQ(d["metrics"].back()["step"], 1001);
  EXPECT_TRUE(d["ranks"].empty());
  EXPECT_TRUE(d["goodput"].is_null());
  EXPECT_NE(d["goodput_error"].get<std::string>().find("events.jsonl"), std::string::npos);
  EXPECT_FALSE(d["badput_kinds"].empty());
}

TEST(SplitHttpUrl, OriginAndPath) {
  std::string origin, path;
  ASSERT_TRUE(split_http_url("http://h:9400", origin, path));
  EXPECT_EQ(origin, "http://h:9400");
  EXPECT_EQ(path, "/metrics");
  ASSERT_TRUE(split_http_url("https://h/x/metrics?a=1", origin, path));
  EXPECT_EQ(origin, "https://h");
  EXPECT_EQ(path, "/x/metrics?a=1");
  for (const char* bad : {"ftp://h", "http://", "https:///metrics", "h:9400", ""})
    EXPECT_FALSE(split_http_url(bad, origin, path)) << bad;
}

}  // namespace
}  // namespace hyperion::monitor
