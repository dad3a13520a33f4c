// `hyperion bench embedding`: the JSON a CI job or a comparison script reads.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace hyperion {
namespace {

using namespace testing_util;

TEST(BenchEmbeddingCli, JsonHasEveryPhase) {
  const CliResult r =
      run_cli("bench embedding --cases small-d64-bag1 --seconds 0.05 --id-sets 2 --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["mem_gbps"].get<double>(), 0);
  ASSERT_EQ(j["cases"].size(), 1u);
  const nlohmann::json& c = j["cases"][0];
  EXPECT_EQ(c["name"], "small-d64-bag1");
  for (const char* phase : {"forward", "adagrad", "rowwise_adagrad", "sgd"}) {
    EXPECT_GT(c[phase]["lookups_per_s"].get<double>(), 0) << phase;
    EXPECT_GT(c[phase]["gbps"].get<double>(), 0) << phase;
    EXPECT_GT(c[phase]["of_memory_bandwidth"].get<double>(), 0) << phase;
  }
  EXPECT_GT(c["adagrad"]["distinct_rows_per_call"].get<double>(), 1000);
}

TEST(BenchEmbeddingCli, RejectsBadFlags) {
  CliResult r = run_cli("bench embedding --cases nope");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--cases 'nope' names no case"), std::string::npos) << r.out;
  r = run_cli("bench embedding --dtype f16");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--dtype must be f32, bf16 or int8"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace hyperion
