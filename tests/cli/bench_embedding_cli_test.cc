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
  EXPECT_NE(r.out.find("--cases: no case 'nope'"), std::string::npos) << r.out;
  // An empty list is not "all" (gigabytes of tables), an unknown name next to a known one
  // is not dropped, and an empty item is a mistake: each a usage error naming the flag.
  for (const char* list : {"''", "' '", "small-d64-bag1,nope", "small-d64-bag1,,small-d128-bag20",
                           "small-d64-bag1,", "small-d64-bag1,small-d64-bag1"}) {
    r = run_cli(std::string("bench embedding --cases ") + list);
    EXPECT_EQ(r.code, 2) << list << "\n" << r.out;
    EXPECT_NE(r.out.find("--cases"), std::string::npos) << list << "\n" << r.out;
  }
  r = run_cli("bench embedding --dtype f16");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--dtype must be f32, bf16 or int8"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace hyperion
