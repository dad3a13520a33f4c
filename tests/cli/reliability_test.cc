// docs/RELIABILITY.md's promises about files, through the hyperion binary: a run
// directory is never guessed from a path, an output is never one of its inputs, prepared
// data is keyed by its inputs, flags are checked before any work, and what was not
// measured is null, not 0.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "../test_files.h"
#include "cli_test_util.h"
#include "io/atomic_file.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Result = hyperion::testing_util::CliResult;

Result run(const std::string& args, bool with_stderr = true) {
  return hyperion::testing_util::run_cli(args, with_stderr);
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The bundled corpus's first 256 KB (test_files.h): what these runs prepare and train on.
std::string corpus() { return hyperion::testing_util::small_corpus(); }

std::string model_args() {
  return "vocab_size=512 base_emb_dim=64 base_num_decoder_layers=2 base_num_query_heads=4 "
         "base_num_kv_heads=2 base_mlp_dim=192 max_target_length=64 per_device_batch_size=4 "
         "peak_tflops=1 sample_count=0 eval_batches=1";
}

std::string train_args(const std::string& root, const std::string& run_name,
                       const std::string& data = corpus()) {
  return "dataset_path=" + data + " " + model_args() + " base_output_directory=" + root +
         " run_name=" + run_name;
}

// The JSON object a `--json` command printed after its log lines.
json json_of(const Result& r) {
  const size_t at = r.out.find("{\n");
  return at == std::string::npos ? json() : json::parse(r.out.substr(at), nullptr, false);
}

// Every file under `dir` with its size and modification time: to prove nothing changed.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    // fmt::format rather than `" " + string` chains: GCC 12 -Wrestrict misfires on those.
    out[fs::relative(e.path(), dir).string()] =
        e.is_directory() ? std::string("dir")
                         : fmt::format("{} {}", e.file_size(),
                                       fs::last_write_time(e.path()).time_since_epoch().count());
  }
  return out;
}

class Reliability : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = testing::TempDir() + "hyperion_reliability_" + std::to_string(::getpid());
    fs::remove_all(root_);
    fs::create_directories(root_);
    const Result r = run("train --json " + train_args(root_, "base") + " steps=4", false);
    ASSERT_EQ(r.code, 0) << r.out;
    checkpoint_ = json::parse(r.out)["checkpoint"];
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::string copy_checkpoint(const std::string& to) {
    fs::remove_all(to);
    fs::create_directories(fs::path(to).parent_path());
    fs::copy(checkpoint_, to, fs::copy_options::recursive);
    return to;
  }

  static inline std::string root_, checkpoint_;
};

// A checkpoint copied into another run's directory (not at RUN/checkpoints/STEP): the
// resume starts a run directory of its own; the other run's checkpoints and metrics are
// untouched.
TEST_F(Reliability, ResumeFromACopiedCheckpointNeverAdoptsTheRunAroundIt) {
  const std::string victim = root_ + "/base";
  const std::string saved = copy_checkpoint(victim + "/saved/best");
  const auto before = snapshot(victim);
  const Result r = run("train --json --resume " + saved + " steps=6 max_num_checkpoints_to_keep=1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(snapshot(victim), before) << r.out;
  const json j = json_of(r);
  ASSERT_TRUE(j.is_object()) << r.out;
  const std::string run_dir = j["run_dir"];
  EXPECT_NE(fs::weakly_canonical(run_dir), fs::weakly_canonical(victim)) << r.out;
  EXPECT_EQ(j["start_step"], 4);
  EXPECT_TRUE(fs::exists(run_dir + "/.hyperion-run")) << run_dir;
  EXPECT_TRUE(contains(r.out, "is not a checkpoint of a hyperion run directory")) << r.out;
  fs::remove_all(victim + "/saved");
}

// A checkpoint outside any run (/tmp/x/ck/base): nothing is written beside it.
TEST_F(Reliability, ResumeFromACheckpointOutsideAnyRunWritesNothingBesideIt) {
  const std::string outside = root_ + "/x";
  const std::string ck = copy_checkpoint(outside + "/ck/base");
  const auto before = snapshot(outside);
  const Result r = run("train --json --resume " + ck + " steps=5 run_name=from-outside");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(snapshot(outside), before) << r.out;
  EXPECT_EQ(json_of(r)["run_dir"], root_ + "/from-outside") << r.out;
}

// A resumed run's own checkpoints go on as before: RUN/checkpoints/STEP continues in RUN.
TEST_F(Reliability, ResumeFromARunsOwnCheckpointContinuesThatRun) {
  const Result first = run("train --json " + train_args(root_, "own") + " steps=2", false);
  ASSERT_EQ(first.code, 0) << first.out;
  const Result r = run("train --json --resume " + root_ + "/own/checkpoints/2 steps=3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(json_of(r)["run_dir"], root_ + "/own") << r.out;
}

TEST_F(Reliability, ADirectoryHyperionDidNotMakeIsNeverARunDirectory) {
  const std::string foreign = root_ + "/foreign";
  fs::create_directories(foreign);
  hyperion::io::write_file_atomic(foreign + "/thesis.tex", "mine");
  const auto before = snapshot(foreign);
  const Result named = run("train " + train_args(root_, "foreign") + " steps=1");
  EXPECT_EQ(named.code, 1) << named.out;
  EXPECT_TRUE(contains(named.out, "was not made by hyperion train")) << named.out;
  const Result resumed = run("train --resume " + foreign);
  EXPECT_EQ(resumed.code, 1) << resumed.out;
  EXPECT_TRUE(contains(resumed.out, "neither a checkpoint")) << resumed.out;
  EXPECT_EQ(snapshot(foreign), before);
}

TEST_F(Reliability, ConvertNeverWritesOverItsInput) {
  const std::string ck = copy_checkpoint(root_ + "/convert/ck");
  const auto before = snapshot(ck);
  // The checkpoint's own weights, spelled another way.
  const Result over = run("convert --checkpoint " + ck + " --to gguf --output " + ck +
                          "/../ck/./model.safetensors");
  EXPECT_EQ(over.code, 1) << over.out;
  EXPECT_TRUE(contains(over.out, "(the same file)")) << over.out;
  const Result into = run("convert --checkpoint " + ck + " --to safetensors --output " + ck + "/.");
  EXPECT_EQ(into.code, 1) << into.out;
  EXPECT_TRUE(contains(into.out, "is the checkpoint")) << into.out;
  EXPECT_EQ(snapshot(ck), before);
  // The default output sits beside the checkpoint directory, not in it.
  const Result def = run("convert --checkpoint " + ck + " --to gguf --type q8_0");
  ASSERT_EQ(def.code, 0) << def.out;
  EXPECT_TRUE(fs::exists(root_ + "/convert/ck-q8_0.gguf")) << def.out;
  EXPECT_EQ(snapshot(ck), before);
}

// Two corpora with the same file name and vocabulary get a prepared dataset each; the
// same input again reuses its own.
TEST_F(Reliability, PreparedDataIsKeyedByItsInputs) {
  const std::string a = root_ + "/data-a/corpus.txt", b = root_ + "/data-b/corpus.txt";
  fs::create_directories(fs::path(a).parent_path());
  fs::create_directories(fs::path(b).parent_path());
  const std::string text = hyperion::io::read_file(corpus());
  hyperion::io::write_file_atomic(a, text.substr(0, text.size() / 2));
  hyperion::io::write_file_atomic(b, text.substr(text.size() / 2));
  const std::string datasets = root_ + "/keyed";
  auto datasets_made = [&] {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(datasets + "/datasets"))
      out.insert(e.path().filename().string());
    return out;
  };
  const Result ra = run("train --json " + train_args(datasets, "a", a) + " steps=1");
  ASSERT_EQ(ra.code, 0) << ra.out;
  const Result rb = run("train --json " + train_args(datasets, "b", b) + " steps=1");
  ASSERT_EQ(rb.code, 0) << rb.out;
  EXPECT_EQ(datasets_made().size(), 2u);
  EXPECT_NE(json_of(ra)["eval_loss"], json_of(rb)["eval_loss"]);
  const Result again = run("train --json " + train_args(datasets, "a2", a) + " steps=1");
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(contains(again.out, "data: reusing")) << again.out;
  EXPECT_EQ(datasets_made().size(), 2u);
  // A prepare killed half-way (meta.json still says "complete": false) is prepared again.
  {
    std::string reused;
    for (const auto& e : fs::directory_iterator(datasets + "/datasets"))
      if (contains(again.out, e.path().filename().string())) reused = e.path().string();
    ASSERT_FALSE(reused.empty()) << again.out;
    hyperion::io::write_file_atomic(reused + "/meta.json",
                                    R"({"format": "hyperion-token-shards", "complete": false})");
    const Result redo = run("train --json " + train_args(datasets, "a4", a) + " steps=1");
    ASSERT_EQ(redo.code, 0) << redo.out;
    EXPECT_TRUE(contains(redo.out, "data: preparing")) << redo.out;
    EXPECT_EQ(datasets_made().size(), 2u);
  }
  // The same file changed is new data.
  hyperion::io::write_file_atomic(a, text.substr(0, text.size() / 3));
  const Result changed = run("train --json " + train_args(datasets, "a3", a) + " steps=1");
  ASSERT_EQ(changed.code, 0) << changed.out;
  EXPECT_TRUE(contains(changed.out, "data: preparing")) << changed.out;
  EXPECT_EQ(datasets_made().size(), 3u);
}

TEST_F(Reliability, DataPrepareNeverWritesOverWhatIsNotItsOwn) {
  const std::string foreign = root_ + "/model-dir";
  fs::create_directories(foreign);
  hyperion::io::write_file_atomic(foreign + "/tokenizer.model", "someone's tokenizer");
  const Result r = run("data prepare --input " + corpus() + " --output " + foreign +
                       " --vocab-size 512");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "not a prepared dataset")) << r.out;
  EXPECT_EQ(hyperion::io::read_file(foreign + "/tokenizer.model"), "someone's tokenizer");
  // Its own earlier output may be prepared again, but not from one of its own files.
  const std::string own = root_ + "/prepared";
  ASSERT_EQ(run("data prepare --input " + corpus() + " --output " + own + " --vocab-size 512").code,
            0);
  const std::string train_bin = hyperion::io::read_file(own + "/train.bin");
  const Result self = run("data prepare --input " + own + "/train.bin --output " + own);
  EXPECT_EQ(self.code, 1) << self.out;
  EXPECT_TRUE(contains(self.out, "(the same file)")) << self.out;
  EXPECT_EQ(hyperion::io::read_file(own + "/train.bin"), train_bin);
  const Result twice =
      run("data prepare --input " + corpus() + " --input " + corpus() + " --output " + own);
  EXPECT_EQ(twice.code, 2) << twice.out;
}

// Sampling flags and the prompt are checked before the checkpoint is even looked at (a
// missing one would be exit 1), with the server's meanings: top_k -1 is "off".
TEST_F(Reliability, GenerateChecksItsFlagsBeforeAnyWork) {
  const std::string missing = " --checkpoint " + root_ + "/no-such-checkpoint";
  for (const char* bad : {"--top-p 0", "--top-p 1.5", "--top-k -2", "--temperature -1",
                          "--temperature 3", "--seed -1", "--max-tokens -1",
                          "--prompt \"$(printf 'caf\\351')\""}) {
    const Result r = run(std::string("generate ") + bad + missing);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.out;
  }
  const Result utf8 = run("generate --json --prompt \"$(printf '\\377\\376')\"" + missing);
  EXPECT_TRUE(contains(utf8.out, "--prompt is not valid UTF-8 (byte 0 of 2)")) << utf8.out;
  for (const char* fine : {"--top-k -1", "--top-k 0", "--temperature 0", "--top-p 1"}) {
    const Result r = run(std::string("generate ") + fine + missing);
    EXPECT_EQ(r.code, 1) << fine << "\n" << r.out;  // past the flags: the checkpoint
    EXPECT_TRUE(contains(r.out, "no-such-checkpoint")) << r.out;
  }
}

TEST_F(Reliability, WhatWasNotMeasuredIsNullNotZero) {
  const std::string data = root_ + "/no-held-out";
  ASSERT_EQ(run("data prepare --input " + corpus() + " --output " + data +
                " --vocab-size 512 --val-fraction 0")
                .code,
            0);
  const Result r = run("train --json " + train_args(root_, "no-eval", data) + " steps=2");
  ASSERT_EQ(r.code, 0) << r.out;
  const json j = json_of(r);
  EXPECT_TRUE(j["eval_loss"].is_null()) << r.out;
  EXPECT_TRUE(j["eval_perplexity"].is_null()) << r.out;
  EXPECT_EQ(j["eval_tokens"], 0);
  EXPECT_TRUE(j["final_loss"].is_number()) << r.out;
}

// A shape change on the command line is named with its key and source on an implicit
// resume (the same command run again), as on --resume.
TEST_F(Reliability, ImplicitResumeNamesTheShapeKeyAndItsSource) {
  ASSERT_EQ(run("train " + train_args(root_, "shape") + " steps=2").code, 0);
  const Result r = run("train " + train_args(root_, "shape") + " steps=4 base_emb_dim=128");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "base_emb_dim cannot change on resume (the checkpoint's model has "
                              "64, the command line asks 128)"))
      << r.out;
}

TEST_F(Reliability, ARecommenderCheckpointIsNamedAsOne) {
  const std::string dlrm = root_ + "/dlrm-ck";
  fs::create_directories(dlrm);
  fs::copy_file(checkpoint_ + "/model.safetensors", dlrm + "/model.safetensors");
  hyperion::io::write_file_atomic(dlrm + "/trainer_state.json", R"({"model_type": "dlrm", "step": 3})");
  for (const std::string& cmd : {"eval --checkpoint " + dlrm + " --text " + corpus(),
                                 "generate --checkpoint " + dlrm,
                                 "convert --checkpoint " + dlrm + " --to gguf --output " + root_ +
                                     "/d.gguf"}) {
    const Result r = run(cmd);
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, "is a recommender (DLRM) checkpoint")) << cmd << "\n" << r.out;
  }
}

TEST_F(Reliability, ServeRefusesAContextBeyondTheModels) {
  const Result r = run("serve " + checkpoint_ + " max_seq_len=4096 --port 0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "max_seq_len=4096 is beyond the model's context")) << r.out;
}

// `hyperion goodput` on an event log with a 256 MiB line: an error naming the line, in
// bounded memory (the child's peak RSS, read from wait4, stays far below the line).
TEST_F(Reliability, GoodputStreamsItsLogInBoundedMemory) {
  const std::string log = root_ + "/huge-events.jsonl";
  {
    std::ofstream out(log, std::ios::binary);
    out << R"({"time": 1.0, "event": "job_start"})" << "\n";
    const std::string chunk(1 << 20, 'x');
    out << "{\"time\": 2.0, \"event\": \"process_start\", \"pad\": \"";
    for (int i = 0; i < 256; ++i) out << chunk;
    out << "\"}\n";
  }
  // The child's exit status and peak RSS (KiB) for `hyperion goodput FILE`.
  auto goodput_peak = [](const std::string& file, int* code) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      ::execl(HYPERION_CLI_PATH, HYPERION_CLI_PATH, "goodput", file.c_str(), nullptr);
      ::_exit(127);
    }
    int status = 0;
    rusage usage{};
    EXPECT_EQ(::wait4(pid, &status, 0, &usage), pid);
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return static_cast<int64_t>(usage.ru_maxrss);
  };
  // The same binary on a one-line log: its baseline (a sanitizer build's is far larger).
  const std::string small = root_ + "/small-events.jsonl";
  std::ofstream(small) << R"({"time": 1.0, "event": "job_start"})" << "\n";
  int code = 0;
  const int64_t base = goodput_peak(small, &code);
  const int64_t peak = goodput_peak(log, &code);
  EXPECT_EQ(code, 1);
  // The line alone is 256 MiB: holding it, or a copy, would add at least that.
  EXPECT_LT(peak, base + 64 * 1024) << "KiB, baseline " << base << " KiB";
  fs::remove(small);
  const Result r = run("goodput " + log);
  EXPECT_TRUE(contains(r.out, "line 2: longer than 1048576 bytes")) << r.out.substr(0, 400);
  fs::remove(log);
}

}  // namespace
