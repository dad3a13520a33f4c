// Checkpoints, configs and runs that must be refused, through the hyperion binary: a
// config.json that disagrees with its weights, absurd sizes, a foreign tokenizer,
// non-finite weights, outputs that are not regular files, resumes that would silently
// change the run, and two trainings in one run directory.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../test_files.h"
#include "cli_test_util.h"
#include "io/atomic_file.h"
#include "io/directory_lock.h"
#include "io/safetensors.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Result = hyperion::testing_util::CliResult;

Result run(const std::string& args, bool with_stderr = true) {
  return hyperion::testing_util::run_cli(args, with_stderr);
}

// The bundled corpus's first 256 KB (test_files.h): what these runs prepare and train on.
std::string corpus() { return hyperion::testing_util::small_corpus(); }

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string train_args(const std::string& root, const std::string& run_name) {
  return "dataset_path=" + corpus() +
         " vocab_size=512 base_emb_dim=64 base_num_decoder_layers=2"
         " base_num_query_heads=4 base_num_kv_heads=2 base_mlp_dim=192 max_target_length=64"
         " per_device_batch_size=4 peak_tflops=1 sample_count=0 eval_batches=1"
         " base_output_directory=" +
         root + " run_name=" + run_name;
}

class CheckpointRefusals : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = testing::TempDir() + "hyperion_refusals_" + std::to_string(::getpid());
    fs::remove_all(root_);
    fs::create_directories(root_);
    const Result r = run("train --json " + train_args(root_, "base") + " steps=4", false);
    ASSERT_EQ(r.code, 0) << r.out;
    checkpoint_ = json::parse(r.out)["checkpoint"];
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // A copy of the trained checkpoint to tamper with.
  static std::string copy(const std::string& name) {
    const std::string dir = root_ + "/" + name;
    fs::remove_all(dir);
    fs::copy(checkpoint_, dir, fs::copy_options::recursive);
    return dir;
  }
  static void edit_config(const std::string& dir, const std::function<void(json&)>& edit) {
    json c = json::parse(hyperion::io::read_file(dir + "/config.json"));
    edit(c);
    hyperion::io::write_file_atomic(dir + "/config.json", c.dump(2));
  }
  // Every command that loads a checkpoint refuses it as bad input (exit status 2, as a bad
  // flag or tokenizer file) with `message`, and writes nothing.
  static void expect_refused(const std::string& dir, const std::string& message) {
    for (const std::string& cmd :
         {"eval --checkpoint " + dir + " --text " + corpus(),
          "generate --checkpoint " + dir + " --prompt hi",
          "convert --checkpoint " + dir + " --to gguf --output " + dir + "/m.gguf"}) {
      const Result r = run(cmd);
      EXPECT_EQ(r.code, 2) << cmd << "\n" << r.out;
      EXPECT_TRUE(contains(r.out, message)) << cmd << "\n" << r.out;
      EXPECT_FALSE(contains(r.out, "internal error")) << r.out;
    }
    EXPECT_FALSE(fs::exists(dir + "/m.gguf"));
  }

  static inline std::string root_, checkpoint_;
};

// A Hugging Face directory in the sharded layout (the checkpoint's tensors split over two
// files with an index): loads as the checkpoint does; an index naming a missing shard, a
// shard that lacks a tensor mapped to it, a tensor in a dtype the loader does not read, and
// a config.json key this decoder does not implement are each refused naming the file and
// the tensor or key.
TEST_F(CheckpointRefusals, ShardedHuggingFaceDirectories) {
  auto shard = [&](const std::string& name, hyperion::DType odd_dtype_for_first = hyperion::DType::kF32) {
    const std::string dir = copy(name);
    const auto st = hyperion::io::SafetensorsFile::open(dir + "/model.safetensors");
    hyperion::io::SafetensorsWriter a, b;
    json map;
    std::vector<std::vector<int32_t>> odd;
    int i = 0;
    for (const auto& t : st.tensors()) {
      hyperion::io::SafetensorsWriter& w = i % 2 == 0 ? a : b;
      const std::string file = i % 2 == 0 ? "model-00001-of-00002.safetensors"
                                          : "model-00002-of-00002.safetensors";
      if (i == 0 && odd_dtype_for_first == hyperion::DType::kI32) {
        odd.emplace_back(size_t(t.shape.numel()), 1);
        w.add(t.name, hyperion::DType::kI32, t.shape, odd.back().data());
      } else {
        w.add(t.name, t.dtype, t.shape, t.data);
      }
      map[t.name] = file;
      ++i;
    }
    a.write(dir + "/model-00001-of-00002.safetensors");
    b.write(dir + "/model-00002-of-00002.safetensors");
    fs::remove(dir + "/model.safetensors");
    hyperion::io::write_file_atomic(dir + "/model.safetensors.index.json",
                                    json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump());
    return dir;
  };
  const std::string good = shard("hf_good");
  const Result ok = run("eval --checkpoint " + good + " --text " + corpus() +
                        " --json");
  EXPECT_EQ(ok.code, 0) << ok.out;
  const Result base = run("eval --checkpoint " + checkpoint_ + " --text " +
                          corpus() + " --json");
  EXPECT_EQ(json::parse(ok.out)["loss"], json::parse(base.out)["loss"]);

  std::string dir = shard("hf_missing_shard");
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  expect_refused(dir, "model.safetensors.index.json: tensor ");
  expect_refused(dir, "maps to shard 'model-00002-of-00002.safetensors', which is not in the directory");

  dir = shard("hf_wrong_file");
  json index = json::parse(hyperion::io::read_file(dir + "/model.safetensors.index.json"));
  json& norm = index["weight_map"]["model.norm.weight"];
  norm = norm == "model-00001-of-00002.safetensors" ? "model-00002-of-00002.safetensors"
                                                    : "model-00001-of-00002.safetensors";
  hyperion::io::write_file_atomic(dir + "/model.safetensors.index.json", index.dump());
  expect_refused(dir, "tensor model.norm.weight is mapped to");

  dir = shard("hf_int32", hyperion::DType::kI32);
  expect_refused(dir, "tensor 'model.embed_tokens.weight': cannot convert int32[512, 64]");

  dir = shard("hf_rope");
  edit_config(dir, [](json& c) { c["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}}; });
  expect_refused(dir, "config.json: rope_scaling.rope_type 'longrope' is not supported");
  dir = shard("hf_softcap");
  edit_config(dir, [](json& c) { c["final_logit_softcapping"] = 30.0; });
  expect_refused(dir, "final_logit_softcapping");
}

TEST_F(CheckpointRefusals, ConfigThatDisagreesWithTheWeights) {
  std::string dir = copy("fewer_layers");
  edit_config(dir, [](json& c) { c["num_hidden_layers"] = 1; });
  expect_refused(dir, "num_hidden_layers is 1 but the weights hold 2 layers");

  dir = copy("tied");
  edit_config(dir, [](json& c) { c["tie_word_embeddings"] = true; });
  expect_refused(dir, "tie_word_embeddings is true but");
  expect_refused(dir, "lm_head.weight [512, 64]");

  dir = copy("wider");
  edit_config(dir, [](json& c) { c["intermediate_size"] = 256; });
  expect_refused(dir, "mlp.gate_proj.weight is [192, 64]");
  expect_refused(dir, "gives [256, 64] (intermediate_size 256, hidden_size 64)");

  dir = copy("act");
  edit_config(dir, [](json& c) { c["hidden_act"] = "gelu"; });
  expect_refused(dir, "hidden_act 'gelu' is not supported");
  dir = copy("type");
  edit_config(dir, [](json& c) { c["model_type"] = "gpt2"; });
  expect_refused(dir, "'model_type' = 'gpt2' is not supported");
  dir = copy("scaling");
  edit_config(dir, [](json& c) { c["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}}; });
  expect_refused(dir, "rope_scaling.rope_type 'dynamic' is not supported");
}

TEST_F(CheckpointRefusals, AbsurdSizesAreNamedBeforeAnyAllocation) {
  std::string dir = copy("vocab");
  edit_config(dir, [](json& c) { c["vocab_size"] = 1000000000000; });
  expect_refused(dir, "vocab_size = 1000000000000 is out of range");
  dir = copy("layers");
  edit_config(dir, [](json& c) { c["num_hidden_layers"] = 1000000; });
  expect_refused(dir, "num_hidden_layers = 1000000 is out of range");
  dir = copy("positions");
  edit_config(dir, [](json& c) { c["max_position_embeddings"] = 1000000000; });
  expect_refused(dir, "max_position_embeddings = 1000000000 is out of range");
  dir = copy("hidden");
  edit_config(dir, [](json& c) { c["hidden_size"] = 1000000000; });
  expect_refused(dir, "hidden_size = 1000000000 is out of range");

  // More than the machine has: the error names the bytes and the keys that size them.
  const Result small =
      run("eval --checkpoint " + checkpoint_ + " --text x.txt", true);  // (file checked later)
  EXPECT_FALSE(contains(small.out, "needs"));
  const Result limited = hyperion::testing_util::run_shell(
      "HYPERION_MEMORY_LIMIT=64K " + std::string(HYPERION_CLI_PATH) + " --threads 1 eval " +
      "--checkpoint " + checkpoint_ + " --text x.txt 2>&1");
  EXPECT_EQ(limited.code, 1) << limited.out;
  EXPECT_TRUE(contains(limited.out, "needs")) << limited.out;
  EXPECT_TRUE(contains(limited.out, "this machine has 64.0 KiB")) << limited.out;
  EXPECT_TRUE(contains(limited.out, "vocab_size 512, hidden_size 64")) << limited.out;

  // A YAML with only `steps: 5` is a 7B Llama by default: refused up front, saying so.
  // (The limit makes it so on any host: the 7B plan needs far more than 16 GiB.)
  const std::string yml = root_ + "/steps_only.yml";
  hyperion::io::write_file_atomic(yml, "steps: 5\n");
  const Result seven = hyperion::testing_util::run_shell(
      "HYPERION_MEMORY_LIMIT=16G " + std::string(HYPERION_CLI_PATH) + " --threads 1 train " + yml +
      " base_output_directory=" + root_ + " 2>&1");
  EXPECT_EQ(seven.code, 1) << seven.out;
  EXPECT_TRUE(contains(seven.out, "needs")) << seven.out;
  EXPECT_TRUE(contains(seven.out, "at their defaults")) << seven.out;
  EXPECT_TRUE(contains(seven.out, "base_emb_dim")) << seven.out;

  // Serving: a KV cache past the machine's memory names the keys that size it. (The
  // limits make these refusals deterministic: on a large host the 64 GiB cache of
  // max_seq_len=16777216 would fit, and the server would start.)
  auto serve = [&](const std::string& limit, const std::string& args) {
    return hyperion::testing_util::run_shell(
        "HYPERION_MEMORY_LIMIT=" + limit + " timeout 120 " + std::string(HYPERION_CLI_PATH) +
        " --threads 1 serve " + checkpoint_ + " --port 0 " + args + " 2>&1");
  };
  // A context past the model's positions is refused by name before anything is sized.
  const Result kv = serve("16G", "max_seq_len=16777216 max_concurrent_decodes=16");
  EXPECT_EQ(kv.code, 2) << kv.out;
  EXPECT_TRUE(contains(kv.out, "max_seq_len=16777216 is beyond the model's context")) << kv.out;
  const Result pages = serve("16G", "kv_pages=2000000000");
  EXPECT_EQ(pages.code, 1) << pages.out;
  EXPECT_TRUE(contains(pages.out, "kv_pages")) << pages.out;
  // The weights (164160 parameters, f32 + bf16: 962 KiB) fit 1100 KiB, and so does the
  // KV cache alone (16 slots x 64 positions x 256 bytes: 256 KiB); together they do not,
  // which is refused before the weights are loaded, naming both and the keys. (16 slots
  // asked for: the automatic count would size itself to fit.)
  const Result both = serve("1100K", "max_concurrent_decodes=16");
  EXPECT_EQ(both.code, 1) << both.out;
  EXPECT_TRUE(contains(both.out,
                       "serve: the weights (961.9 KiB) plus the KV cache (64 pages x "
                       "16 tokens, bf16: 256.0 KiB) needs 1.2 MiB"))
      << both.out;
  EXPECT_TRUE(contains(both.out, "max_seq_len=64 (the model's)")) << both.out;
  EXPECT_TRUE(contains(both.out, "max_concurrent_decodes=16")) << both.out;
  EXPECT_TRUE(contains(both.out, "kv_pages=")) << both.out;
}

TEST_F(CheckpointRefusals, AbsurdBatchIsNamedAndNeverWrapsPastTheMemoryCheck) {
  // 10^12 sequences would overflow the plan's byte counts (and wrap to a size that
  // passes); the key is capped and named instead.
  const Result huge =
      run("train tiny per_device_batch_size=1000000000000 base_output_directory=" + root_);
  EXPECT_EQ(huge.code, 1) << huge.out;
  EXPECT_TRUE(contains(huge.out,
                       "per_device_batch_size (command line) = 1000000000000 is out "
                       "of range (at most 65536)"))
      << huge.out;
  EXPECT_FALSE(contains(huge.out, "bad_alloc")) << huge.out;
  // Within the cap, the memory check refuses it naming the batch.
  const Result big = hyperion::testing_util::run_shell(
      "HYPERION_MEMORY_LIMIT=16G " + std::string(HYPERION_CLI_PATH) +
      " --threads 1 train tiny per_device_batch_size=65536 base_output_directory=" + root_ +
      " 2>&1");
  EXPECT_EQ(big.code, 1) << big.out;
  EXPECT_TRUE(contains(big.out, "needs")) << big.out;
  EXPECT_TRUE(contains(big.out, "per_device_batch_size=65536 x max_target_length=256")) << big.out;
  EXPECT_FALSE(contains(big.out, "bad_alloc")) << big.out;
  // Training keys name themselves, not the model's fields.
  const Result layers = run("train tiny base_num_decoder_layers=100000");
  EXPECT_EQ(layers.code, 1) << layers.out;
  EXPECT_TRUE(contains(layers.out, "base_num_decoder_layers = 100000 is out of range"))
      << layers.out;
  const Result dim = run("train tiny base_emb_dim=1000000");
  EXPECT_TRUE(contains(dim.out, "base_emb_dim = 1000000 is out of range")) << dim.out;
  const Result length = run("train tiny max_target_length=100000000");
  EXPECT_TRUE(contains(length.out, "max_target_length (command line) = 100000000 is out of range"))
      << length.out;
}

TEST_F(CheckpointRefusals, ATokenizerOfAnotherModel) {
  const std::string other = root_ + "/other_tokenizer";
  const Result p = run("data prepare --vocab-size 600 --input " + corpus() +
                       " --output " + other);
  ASSERT_EQ(p.code, 0) << p.out;
  const std::string dir = copy("foreign_tokenizer");
  fs::copy_file(other + "/tokenizer.model", dir + "/tokenizer.model",
                fs::copy_options::overwrite_existing);
  for (const std::string& cmd :
       {"eval --checkpoint " + dir + " --text " + corpus(),
        "generate --checkpoint " + dir + " --prompt hi", "serve " + dir + " --port 0",
        "convert --checkpoint " + dir + " --to safetensors --output " + dir + "/merged",
        "convert --checkpoint " + dir + " --to gguf --output " + dir + "/m.gguf"}) {
    const Result r = run(cmd);
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, dir + "/tokenizer.model has 600 tokens")) << r.out;
    EXPECT_TRUE(contains(r.out, dir + "/config.json has vocab_size 512")) << r.out;
  }
  EXPECT_FALSE(fs::exists(dir + "/m.gguf"));
  // Training refuses a tokenizer whose piece count differs from vocab_size, larger or
  // smaller: the checkpoints it wrote would be refused by every command above.
  for (const std::string vocab : {"512", "700"}) {
    const Result r = run("train " + train_args(root_, "tok_" + vocab) + " tokenizer_path=" + other +
                         "/tokenizer.model vocab_size=" + vocab + " steps=1");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(contains(r.out, "tokenizer " + other +
                                    "/tokenizer.model has 600 tokens but "
                                    "config key vocab_size (command line) is " +
                                    vocab))
        << r.out;
    // Refused before the run directory or the dataset is made.
    EXPECT_FALSE(fs::exists(root_ + "/tok_" + vocab)) << vocab;
  }
}

TEST_F(CheckpointRefusals, NonFiniteWeights) {
  const std::string dir = copy("nan");
  {
    // Rewrite model.safetensors with one NaN in layer 1's v_proj.
    const auto in = hyperion::io::SafetensorsFile::open(dir + "/model.safetensors");
    std::vector<std::vector<float>> data;
    hyperion::io::SafetensorsWriter w;
    for (const auto& t : in.tensors()) {
      data.emplace_back(static_cast<size_t>(t.shape.numel()));
      in.read_into(t.name,
                   hyperion::TensorView(data.back().data(), hyperion::DType::kF32, t.shape));
      if (t.name == "model.layers.1.self_attn.v_proj.weight")
        data.back()[7] = std::numeric_limits<float>::quiet_NaN();
      w.add(t.name, hyperion::DType::kF32, t.shape, data.back().data());
    }
    w.write(dir + "/model.safetensors");
  }
  expect_refused(dir, "model.layers.1.self_attn.v_proj.weight");
  const Result r = run("eval --checkpoint " + dir + " --text x.txt");
  EXPECT_TRUE(contains(r.out, "NaN at element 7")) << r.out;
}

TEST_F(CheckpointRefusals, OutputsThatAreNotRegularFiles) {
  const Result dev = run("convert --checkpoint " + checkpoint_ + " --to gguf --output /dev/null");
  EXPECT_EQ(dev.code, 1) << dev.out;
  EXPECT_TRUE(contains(dev.out, "'/dev/null': it exists and is a character device")) << dev.out;
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  const std::string dir_out = root_ + "/a_directory.gguf";
  fs::create_directories(dir_out);
  const Result d = run("convert --checkpoint " + checkpoint_ + " --to gguf --output " + dir_out);
  EXPECT_EQ(d.code, 1) << d.out;
  EXPECT_TRUE(contains(d.out, "is a directory")) << d.out;
  EXPECT_TRUE(fs::is_directory(dir_out));
}

TEST_F(CheckpointRefusals, ResumeRestoresTheSavedConfigAndNamesChanges) {
  const std::string run_dir = root_ + "/resumed";
  const Result first = run(
      "train --json " + train_args(root_, "resumed") + " steps=6 dtype=float32 --stop-at 3", false);
  ASSERT_EQ(first.code, 0) << first.out;
  // No CONFIG: the run's own settings (6 steps, float32), not the tiny preset's.
  const Result again = run("train --resume " + run_dir + " --json");
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(contains(again.out, "dtype f32")) << again.out;
  const std::string js = again.out.substr(again.out.find("{\n"));
  EXPECT_EQ(json::parse(js)["steps"], 6);
  EXPECT_EQ(json::parse(js)["start_step"], 3);
  // An override is an explicit, logged change.
  const Result more = run("train --resume " + run_dir + " steps=8 --json");
  ASSERT_EQ(more.code, 0) << more.out;
  EXPECT_TRUE(contains(more.out, "resume: changed steps: 6 -> 8")) << more.out;
  EXPECT_EQ(json::parse(more.out.substr(more.out.find("{\n")))["steps"], 8);
  // The model's shape cannot change, and a CONFIG cannot replace the saved one.
  const Result shape = run("train --resume " + run_dir + " base_emb_dim=128");
  EXPECT_EQ(shape.code, 2) << shape.out;
  EXPECT_TRUE(contains(shape.out, "base_emb_dim cannot change on resume")) << shape.out;
  const Result config = run("train tiny --resume " + run_dir);
  EXPECT_EQ(config.code, 2) << config.out;
}

TEST_F(CheckpointRefusals, OneTrainingPerRunDirectory) {
  const std::string run_dir = root_ + "/locked";
  fs::create_directories(run_dir);
  {
    hyperion::io::DirectoryLock held(run_dir, "run directory");
    const Result second = run("train " + train_args(root_, "locked") + " steps=2");
    EXPECT_EQ(second.code, 1) << second.out;
    EXPECT_TRUE(contains(second.out, "run directory " + run_dir + " is in use")) << second.out;
    EXPECT_TRUE(contains(second.out, "pid " + std::to_string(::getpid()))) << second.out;
  }
  // A lock left by a process that died (its record, no flock) is taken over.
  hyperion::io::write_file_atomic(run_dir + "/.lock", "pid 99999 on host gone since then\n");
  const Result after = run("train " + train_args(root_, "locked") + " steps=2");
  EXPECT_EQ(after.code, 0) << after.out;
  EXPECT_TRUE(contains(after.out, "took over the lock of pid 99999")) << after.out;
}

}  // namespace

namespace {

// Fine-tuning (load_parameters_path) on a dataset prepared with another tokenizer of the
// same size is refused naming both tokenizers, before any run directory exists; on data
// prepared with the checkpoint's own tokenizer it runs.
TEST_F(CheckpointRefusals, FineTuningOnDataOfAnotherTokenizer) {
  const std::string text = root_ + "/other.txt";
  {
    const std::string whole = hyperion::io::read_file(corpus());
    std::ofstream(text) << whole.substr(whole.size() / 2);
  }
  const Result prep = run("data prepare --input " + text + " --output " + root_ +
                          "/other-data --vocab-size 512");
  ASSERT_EQ(prep.code, 0) << prep.out;
  const std::string tune = "train load_parameters_path=" + checkpoint_ +
                           " max_target_length=64 per_device_batch_size=4 sample_count=0"
                           " eval_batches=1 steps=1 base_output_directory=" + root_;
  const Result r = run(tune + " dataset_path=" + root_ + "/other-data run_name=tuned-other");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "dataset_path '" + root_ + "/other-data' was prepared with "
                              "tokenizer " + root_ + "/other-data/tokenizer.model")) << r.out;
  EXPECT_TRUE(contains(r.out, "uses tokenizer " + checkpoint_)) << r.out;
  EXPECT_FALSE(fs::exists(root_ + "/tuned-other"));

  const Result same = run("data prepare --input " + text + " --output " + root_ +
                          "/same-data --tokenizer " + checkpoint_ + "/tokenizer.model");
  ASSERT_EQ(same.code, 0) << same.out;
  const Result ok = run(tune + " dataset_path=" + root_ + "/same-data run_name=tuned-same");
  EXPECT_EQ(ok.code, 0) << ok.out;
}

// A fine-tune refused once its run directory exists (weights that do not load) removes
// the directory it made; a refused resume never removes the run it resumes.
TEST_F(CheckpointRefusals, ARefusedRunLeavesNoRunDirectoryBehind) {
  const std::string bad = copy("truncated");
  fs::resize_file(bad + "/model.safetensors", fs::file_size(bad + "/model.safetensors") - 1000);
  const Result r = run("train load_parameters_path=" + bad +
                       " max_target_length=64 steps=1 base_output_directory=" + root_ +
                       " run_name=refused dataset_path=" + corpus());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "truncated?")) << r.out;
  EXPECT_FALSE(fs::exists(root_ + "/refused")) << r.out;

  const std::string kept = copy("kept-run");
  fs::resize_file(kept + "/model.safetensors", 100);
  const Result resume = run("train " + train_args(root_, "x") + " steps=2 --resume " + kept);
  EXPECT_NE(resume.code, 0) << resume.out;
  EXPECT_TRUE(fs::exists(kept + "/config.json")) << resume.out;
  EXPECT_FALSE(fs::exists(root_ + "/x")) << resume.out;  // the new run it would have made
}

}  // namespace
