// End-to-end tests of the hyperion binary: exit codes, error messages and --json output.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_test_util.h"
#include "kernels/amx_int8_gemm.h"

namespace {

using Result = hyperion::testing_util::CliResult;

// Without run_cli's --threads 1: these tests exercise the thread flag and environment.
Result run(const std::string& args, const std::string& env = "") {
  return hyperion::testing_util::run_shell(env + " " + HYPERION_CLI_PATH + " " + args + " 2>&1");
}

TEST(Cli, HelpAndUnknownCommand) {
  Result help = run("--help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("bench peak"), std::string::npos);
  Result bad = run("frobnicate");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("unknown command 'frobnicate'"), std::string::npos) << bad.out;
}

TEST(Cli, ThreadsFlagAndEnvironment) {
  auto info = run("--threads 1 info --json");
  ASSERT_EQ(info.code, 0) << info.out;
  const nlohmann::json ij = nlohmann::json::parse(info.out);
  EXPECT_EQ(ij["threads"], 1);
  // The GPU line: whether this binary has CUDA, and the device or why there is none.
  EXPECT_TRUE(ij["cuda_built"].is_boolean());
  EXPECT_TRUE(ij["gpu_available"].is_boolean());
  EXPECT_FALSE(ij["gpu"].get<std::string>().empty());
  auto env = run("info --json", "HYPERION_THREADS=2");
  ASSERT_EQ(env.code, 0) << env.out;
  EXPECT_EQ(nlohmann::json::parse(env.out)["threads"], 2);
  auto bad = run("--threads 0 info");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--threads"), std::string::npos) << bad.out;
  auto bad_env = run("info", "HYPERION_THREADS=lots");
  EXPECT_EQ(bad_env.code, 1);
  EXPECT_NE(bad_env.out.find("HYPERION_THREADS"), std::string::npos) << bad_env.out;
}

TEST(Cli, BenchPeakJsonHasStableKeys) {
  auto r = run("bench peak --json --seconds 0.02");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"f32_gflops", "bf16_gflops", "int8_gops", "mem_gbps", "threads"}) {
    ASSERT_TRUE(j.contains(key)) << key;
  }
  EXPECT_GT(j["f32_gflops"].get<double>(), 0.0);
  EXPECT_GT(j["mem_gbps"].get<double>(), 0.0);
  EXPECT_GE(j["bf16_gflops"].get<double>(), j["f32_gflops"].get<double>());
  // int8 runs widened to f32 where the CPU has no VNNI/AMX: never a zero ceiling.
  EXPECT_GE(j["int8_gops"].get<double>(), j["f32_gflops"].get<double>());
  EXPECT_FALSE(j["int8_isa"].get<std::string>().empty());
}

TEST(Cli, BenchKernelsFilterAndJson) {
  auto r = run("bench kernels --json --filter rmsnorm_fwd_f32 --seconds 0.01");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["kernels"].size(), 1u);
  auto k = j["kernels"][0];
  EXPECT_EQ(k["name"], "rmsnorm_fwd_f32_8192x4096");
  EXPECT_EQ(k["bound"], "memory");
  EXPECT_GT(k["achieved"].get<double>(), 0.0);
  EXPECT_GT(k["ratio"].get<double>(), 0.0);
  auto none = run("bench kernels --filter no_such_kernel --seconds 0.01");
  EXPECT_EQ(none.code, 2);  // a filter matching nothing is a usage error
  EXPECT_NE(none.out.find("no_such_kernel"), std::string::npos) << none.out;
  auto nan_seconds = run("bench peak --seconds abc");
  EXPECT_EQ(nan_seconds.code, 2);
  EXPECT_NE(nan_seconds.out.find("--seconds: expected a number, got 'abc'"), std::string::npos)
      << nan_seconds.out;
  auto bad = run("bench kernels --bogus");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--bogus"), std::string::npos) << bad.out;
}

// A case this CPU has no instructions for (AMX int8 on Zen 5) is listed as not run, in
// text and JSON, and the command still succeeds; on a CPU with AMX it is timed.
TEST(Cli, BenchKernelsMarksWhatThisCpuCannotRun) {
  const std::string filter = "--filter gemm_train_dx_amx_int8_4096x512x512 --seconds 0.01";
  auto r = run("bench kernels --json " + filter);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["kernels"].size(), 1u) << r.out;
  auto k = j["kernels"][0];
  EXPECT_EQ(k["name"], "gemm_train_dx_amx_int8_4096x512x512");
  auto text = run("bench kernels " + filter);
  ASSERT_EQ(text.code, 0) << text.out;
  if (hyperion::amx_int8_available()) {
    EXPECT_FALSE(k.contains("skipped")) << k;
    EXPECT_GT(k["achieved"].get<double>(), 0.0) << k;
    EXPECT_EQ(text.out.find("not run"), std::string::npos) << text.out;
  } else {
    EXPECT_EQ(k["skipped"], true) << k;
    EXPECT_FALSE(k.contains("achieved")) << k;
    EXPECT_NE(text.out.find("not run: this CPU lacks it"), std::string::npos) << text.out;
  }
}

}  // namespace
