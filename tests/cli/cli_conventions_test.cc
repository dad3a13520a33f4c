// The command line's conventions, for every command: --help, --version, exit status 2
// for usage errors and 1 for failures at run time, environment problems named as such.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "../test_files.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli_test_util.h"

namespace {

using hyperion::testing_util::run_cli;
using hyperion::testing_util::TempDir;
namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CliConventions, EveryCommandAnswersHelpWithUsageFlagsAndAnExample) {
  for (const hyperion::cli::Command& c : hyperion::cli::all_commands()) {
    const std::string& name = c.spec->name;
    for (const char* flag : {"--help", "-h"}) {
      auto r = run_cli(name + " " + flag, /*with_stderr=*/false);
      EXPECT_EQ(r.code, 0) << name << " " << flag << ": " << r.out;
      EXPECT_TRUE(contains(r.out, "usage: hyperion " + name)) << r.out;
      EXPECT_TRUE(contains(r.out, "example:\n  hyperion " + name)) << r.out;
      for (const hyperion::cli::FlagSpec& f : c.spec->flags)
        EXPECT_TRUE(contains(r.out, "--" + f.name)) << name << " help misses --" << f.name;
    }
    // --help wins over anything else on the line, a wrong flag included.
    EXPECT_EQ(run_cli(name + " --no-such-flag --help").code, 0) << name;
    // An unknown flag is a usage error naming it.
    auto bad = run_cli(name + " --no-such-flag");
    EXPECT_EQ(bad.code, 2) << name << ": " << bad.out;
    EXPECT_TRUE(contains(bad.out, "unknown flag --no-such-flag")) << bad.out;
  }
}

TEST(CliConventions, HelpListsConfigKeys) {
  auto train = run_cli("train --help");
  EXPECT_TRUE(contains(train.out, "learning_rate")) << train.out;
  EXPECT_TRUE(contains(train.out, "per_device_batch_size")) << train.out;
  auto serve = run_cli("serve --help");
  EXPECT_TRUE(contains(serve.out, "max_concurrent_decodes")) << serve.out;
  EXPECT_TRUE(contains(serve.out, "kv_dtype")) << serve.out;
}

TEST(CliConventions, GroupsTopLevelHelpAndVersion) {
  auto top = run_cli("--help", false);
  EXPECT_EQ(top.code, 0);
  for (const hyperion::cli::Command& c : hyperion::cli::all_commands())
    EXPECT_TRUE(contains(top.out, c.spec->name)) << c.spec->name;
  auto bench = run_cli("bench --help", false);
  EXPECT_EQ(bench.code, 0);
  EXPECT_TRUE(contains(bench.out, "bench serve")) << bench.out;
  EXPECT_TRUE(contains(bench.out, "example:\n  hyperion bench ")) << bench.out;
  EXPECT_TRUE(contains(top.out, "example:\n  hyperion ")) << top.out;
  EXPECT_EQ(run_cli("bench").code, 2);
  auto unknown = run_cli("bench nosuch");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_TRUE(contains(unknown.out, "unknown name 'nosuch'")) << unknown.out;
  EXPECT_EQ(run_cli("data").code, 2);
  EXPECT_EQ(run_cli("data --help").code, 0);
  EXPECT_EQ(run_cli("").code, 2);
  EXPECT_EQ(run_cli("--bogus info").code, 2);

  auto v = run_cli("--version", false);
  EXPECT_EQ(v.code, 0);
  for (const char* part : {"hyperion 0.", "commit ", "build:", "simd:", "compiled:", "oneDNN",
                           "Highway", "MPI", "yaml-cpp", "SentencePiece"})
    EXPECT_TRUE(contains(v.out, part)) << part << " missing from:\n" << v.out;
}

TEST(CliConventions, UsageErrorsExitTwoAndRunTimeFailuresOne) {
  // Usage: unknown command, unknown config key, malformed value, missing argument.
  EXPECT_EQ(run_cli("frobnicate").code, 2);
  auto key = run_cli("plan tiny no_such_key=1");
  EXPECT_EQ(key.code, 2) << key.out;
  EXPECT_TRUE(contains(key.out, "unknown config key 'no_such_key'")) << key.out;
  EXPECT_EQ(run_cli("plan tiny steps=many").code, 2);
  EXPECT_EQ(run_cli("plan").code, 2);
  auto missing = run_cli("eval --text x.txt");
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_TRUE(contains(missing.out, "missing required flag --checkpoint")) << missing.out;
  EXPECT_EQ(run_cli("generate --checkpoint x --max-tokens lots").code, 2);
  EXPECT_EQ(run_cli("serve").code, 2);
  EXPECT_EQ(run_cli("bench peak --seconds abc").code, 2);
  EXPECT_EQ(run_cli("data prepare --input a.txt").code, 2);  // --output missing
  // Run time: the input does not exist.
  auto absent = run_cli("eval --checkpoint /nonexistent/run --text x.txt");
  EXPECT_EQ(absent.code, 1) << absent.out;
  EXPECT_TRUE(contains(absent.out, "/nonexistent/run")) << absent.out;
  EXPECT_FALSE(contains(absent.out, "internal error")) << absent.out;
}

TEST(CliConventions, OutOfRangeFlagValuesAndSingleDashFlagsAreUsageErrors) {
  // Values that parse but make no sense are usage errors too, found before any file is
  // read (the checkpoints named here do not exist: a run-time check would exit 1).
  for (const char* line :
       {"train tiny --stop-at -1", "bench decode /nonexistent/run --batch 0",
        "bench decode /nonexistent/run --steps 0", "bench decode /nonexistent/run --context-min 0",
        "bench moe --steps 0", "convert --checkpoint /nonexistent/run --to gguf --type q3_k",
        "convert --checkpoint /nonexistent/run --to safetensors",
        "convert --checkpoint /nonexistent/run --to safetensors --type f16 --output o",
        "bench kernels --filter no_such_kernel_name"}) {
    auto r = run_cli(line);
    EXPECT_EQ(r.code, 2) << line << ": " << r.out;
    EXPECT_TRUE(contains(r.out, "usage error")) << line << ": " << r.out;
  }
  EXPECT_TRUE(contains(run_cli("convert --checkpoint /x --to safetensors").out,
                       "missing required flag --output"));
  // `-q` is an unknown flag (exit 2), not a config file named "-q" that is missing.
  auto dash = run_cli("train -q");
  EXPECT_EQ(dash.code, 2) << dash.out;
  EXPECT_TRUE(contains(dash.out, "unknown flag -q")) << dash.out;
  EXPECT_EQ(run_cli("generate --checkpoint x -n 5").code, 2);
}

TEST(CliConventions, DuplicateYamlKeyIsAUsageError) {
  TempDir dir;
  const std::string yml = dir.write("dup.yml", "steps: 5\nsteps: 7\n");
  auto r = run_cli("plan " + yml);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "key 'steps' is given twice")) << r.out;
}

TEST(CliConventions, NprocReportsABadConfigBeforeStartingMpi) {
  auto path = run_cli("train /nonexistent/cfg.yml --nproc 2 --allow-run-as-root");
  EXPECT_EQ(path.code, 1) << path.out;
  EXPECT_TRUE(contains(path.out, "/nonexistent/cfg.yml")) << path.out;
  // One error from this process, not one per rank from mpirun.
  EXPECT_FALSE(contains(path.out, "mpirun")) << path.out;
  EXPECT_FALSE(contains(path.out, "rank")) << path.out;
  auto key = run_cli("train tiny no_such_key=1 --nproc 2 --allow-run-as-root");
  EXPECT_EQ(key.code, 2) << key.out;
  EXPECT_FALSE(contains(key.out, "mpirun")) << key.out;
}

// A tmpfs mounted for one test (needs root, as CI has; skipped otherwise).
struct TmpfsMount {
  std::string dir;
  bool mounted = false;
  TmpfsMount(const std::string& d, const char* options) : dir(d) {
    fs::create_directories(dir);
    mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, options) == 0;
  }
  void remount_read_only() {
    ASSERT_EQ(::mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, "size=1m"), 0);
  }
  ~TmpfsMount() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
  }
};

TEST(CliConventions, ReadOnlyOutputAndDiskFullAreNamed) {
  TempDir dir;
  const std::string& corpus = hyperion::testing_util::small_corpus();
  {
    TmpfsMount ro(dir.file("ro"), "size=1m");
    if (!ro.mounted) GTEST_SKIP() << "needs root to mount a tmpfs";
    ro.remount_read_only();
    auto r = run_cli("data prepare --input " + corpus + " --output " + ro.dir + "/out");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(contains(r.out, "read-only file system")) << r.out;
    EXPECT_TRUE(contains(r.out, ro.dir + "/out")) << r.out;
    EXPECT_FALSE(contains(r.out, "internal error")) << r.out;
  }
  {
    TmpfsMount full(dir.file("full"), "size=64k");
    ASSERT_TRUE(full.mounted);
    auto r = run_cli("data prepare --vocab-size 512 --input " + corpus + " --output " + full.dir);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(contains(r.out, "disk full")) << r.out;
    EXPECT_FALSE(contains(r.out, "internal error")) << r.out;
    // Nothing half-written is left behind under the final names.
    for (const auto& e : fs::directory_iterator(full.dir))
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
}

}  // namespace
