// LoRA through the trainer: a base fine-tuned in full on chat data, then adapters trained
// on it (lora_rank) with the base frozen. The checkpoints are PEFT adapter directories
// (adapter_config.json, adapter_model.safetensors under PEFT's names) that load back
// into a LoraAdapter; the run's held-out loss is the merged model's; a run split in two
// (stop and resume) equals one run bit for bit, adapter dropout included; bad keys and
// adapters are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "convert/peft_adapter.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "model/forward_model.h"
#include "model/lora.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "../cli/cli_test_util.h"
#include "../cli/server_process.h"
#include "chat_data_test_util.h"
#include "train_test_util.h"

namespace hyperion {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> repeat_lines() {
  const std::vector<std::string> words = {"apple", "river", "stone", "cloud", "green", "seven", "table", "light"};
  std::vector<std::string> lines;
  for (int i = 0; i < 96; ++i) {
    const std::string& w = words[static_cast<size_t>(i * 5 % 8)];
    const std::string& v = words[static_cast<size_t>(i * 3 % 8)];
    lines.push_back(R"({"messages": [{"role": "user", "content": "Repeat )" + w + " " + v +
                    R"("}, {"role": "assistant", "content": ")" + w + " " + v + " " + w + " " + v + R"("}]})");
  }
  return lines;
}

class LoraTraining : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing_util::llama_tokenizer()) return;
    root_ = testing_util::process_temp_root("hyperion_lora_test");
    data_ = testing_util::write_jsonl("hyperion_lora_test", "repeat.jsonl", repeat_lines());
    TrainOptions opts;
    opts.quiet = true;
    // The base: a full fine-tune of a tiny model, 20 steps.
    std::vector<std::string> keys = common({"run_name=base", "steps=20"});
    keys.insert(keys.end(), {"vocab_size=128256", "base_emb_dim=64", "base_num_decoder_layers=2",
                             "base_num_query_heads=4", "base_num_kv_heads=2", "base_mlp_dim=128"});
    const TrainResult r = run_training(load_train_config("tiny", keys), "test", opts);
    base_ = r.checkpoint;
  }
  static std::vector<std::string> common(std::vector<std::string> extra) {
    // (The model's shape keys are the base's alone; LoRA runs take it from its config.json.)
    std::vector<std::string> o = {"use_sft=true", "dataset_path=" + data_, "tokenizer_path=" + testing_util::llama_tokenizer_dir(),
                                  "max_target_length=48", "per_device_batch_size=8", "learning_rate=1e-2",
                                  "dtype=float32", "eval_interval=0", "eval_fraction=0.1", "eval_batches=1",
                                  "sample_count=0", "log_period=1000", "peak_tflops=1", "base_output_directory=" + root_};
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
  }
  void SetUp() override {
    if (!testing_util::llama_tokenizer()) GTEST_SKIP() << "tokenizer-llama3_1 is not installed";
    ASSERT_FALSE(base_.empty());
  }
  static TrainResult lora_run(const std::string& name, std::vector<std::string> extra, const TrainOptions& o = quiet()) {
    std::vector<std::string> keys = {"load_parameters_path=" + base_, "lora_rank=4", "lora_alpha=8", "run_name=" + name};
    keys.insert(keys.end(), extra.begin(), extra.end());
    return run_training(load_train_config("tiny", common(keys)), "test", o);
  }
  static TrainOptions quiet() {
    TrainOptions o;
    o.quiet = true;
    return o;
  }
  static inline std::string root_, data_, base_;
};

// `hyperion plan` of a LoRA run: the adapters' gradients and moments under 5% of a full
// fine-tune's, and a bf16 base without the f32 masters of its matrices (kept with a
// quantised base, which is quantised from them).
TEST(LoraPlan, ShowsTheSavingAndTheDroppedMasters) {
  auto plan = [](const std::string& keys) {
    const auto r = testing_util::run_cli("plan llama3.2-1b dtype=bfloat16 " + keys + " --json", false);
    EXPECT_EQ(r.code, 0) << r.out;
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json full = plan(""), lora = plan("lora_rank=16"), qlora = plan("lora_rank=16 quantization=int8");
  const int64_t adapters = lora["lora"]["trainable_params"].get<int64_t>();
  EXPECT_GT(adapters, 10'000'000);
  EXPECT_LT(lora["lora"]["gradients_and_optimizer"].get<double>(),
            0.05 * lora["lora"]["full_finetune_gradients_and_optimizer"].get<double>());
  const int64_t w_full = full["memory"]["weights"].get<int64_t>(), w_lora = lora["memory"]["weights"].get<int64_t>(),
                w_q = qlora["memory"]["weights"].get<int64_t>();
  EXPECT_EQ(w_q, w_full + 4 * adapters);  // quantised: every master kept
  // bf16: the dense matrices' masters (all but the embedding and norms: ~0.97 B of 1.24 B) go.
  EXPECT_LT(w_lora, w_full / 4);
}

TEST_F(LoraTraining, AdaptersTrainOnAFrozenBaseAndSaveAsPeft) {
  const TrainResult r = lora_run("lora", {"steps=12"});
  ASSERT_EQ(r.history.size(), 12u);
  EXPECT_LT(r.history.back().loss, r.history.front().loss);
  ASSERT_FALSE(r.checkpoint.empty());
  // PEFT's directory: the config and the adapters, no model weights.
  EXPECT_TRUE(fs::exists(r.checkpoint + "/adapter_config.json"));
  EXPECT_TRUE(fs::exists(r.checkpoint + "/adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(r.checkpoint + "/model.safetensors"));
  const nlohmann::json cfg = nlohmann::json::parse(io::read_file(r.checkpoint + "/adapter_config.json"));
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["r"], 4);
  EXPECT_EQ(cfg["lora_alpha"], 8.0);
  EXPECT_EQ(cfg["target_modules"].size(), 7u);
  const io::SafetensorsFile f = io::SafetensorsFile::open(r.checkpoint + "/adapter_model.safetensors");
  EXPECT_EQ(f.tensors().size(), 2u * 7 * 2);
  const io::SafetensorsTensor& b = f.get("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
  EXPECT_EQ(b.shape, (Shape{64, 4}));

  // Loaded back onto the base: the trained values (B moved off zero).
  const DecoderConfig c = read_checkpoint_config(base_);
  ParamStore base(c, false, false);
  load_model_weights(base_, base);
  const auto adapter = convert::load_peft_adapter(r.checkpoint, base);
  EXPECT_FLOAT_EQ(adapter->scale(), 2.0f);
  const ParamInfo* bi = adapter->store().find("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
  ASSERT_NE(bi, nullptr);
  double norm = 0;
  for (int64_t i = 0; i < bi->numel; ++i) norm += std::fabs(adapter->store().params()[bi->offset + i]);
  EXPECT_GT(norm, 0.0);
  EXPECT_GT(r.eval_tokens, 0);

  // The adapter directory is not a model: loading it as one names the way out.
  ParamStore other(c, false, false);
  const std::string e = testing_util::error_message_of([&] { load_model_weights(r.checkpoint, other); });
  EXPECT_NE(e.find("--adapter"), std::string::npos) << e;
}

// With adapter dropout on: its masks derive from the seed and the step, so a resumed run
// repeats them; dropout changes the run (from step 2, once B has moved off zero) and
// PEFT's config records it. In bf16: the base loaded (and reloaded on resume) without the
// f32 masters of its matrices.
TEST_F(LoraTraining, ASplitRunEqualsOneRun) {
  const std::vector<std::string> keys = {"steps=6", "lora_dropout=0.1", "dtype=bfloat16"};
  const TrainResult whole = lora_run("whole", keys);
  TrainOptions stop = quiet();
  stop.stop_at = 3;
  const TrainResult first = lora_run("split", keys, stop);
  ASSERT_EQ(first.history.size(), 3u);
  const TrainResult second = lora_run("split", keys);
  EXPECT_EQ(second.start_step, 3);
  ASSERT_EQ(second.history.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first.history[i].loss, whole.history[i].loss) << i;
    EXPECT_EQ(second.history[i].loss, whole.history[3 + i].loss) << i;
  }
  const TrainResult plain = lora_run("whole_no_dropout", {"steps=6", "dtype=bfloat16"});
  ASSERT_EQ(plain.history.size(), 6u);
  EXPECT_EQ(plain.history[0].loss, whole.history[0].loss);  // B = 0: the adapters add nothing yet
  EXPECT_NE(plain.history[2].loss, whole.history[2].loss);
  EXPECT_LT(whole.history.back().loss, whole.history.front().loss);
  const nlohmann::json cfg = nlohmann::json::parse(io::read_file(second.checkpoint + "/adapter_config.json"));
  EXPECT_NEAR(cfg["lora_dropout"].get<double>(), 0.1, 1e-12);
}

TEST_F(LoraTraining, BadKeysAndAdaptersAreRefusedByName) {
  auto error = [&](std::vector<std::string> extra) {
    return testing_util::error_message_of([&] { lora_run("bad", std::move(extra)); });
  };
  EXPECT_NE(error({"lora_target_modules=q_proj,lm_head"}).find("'lm_head'"), std::string::npos);
  EXPECT_NE(error({"lora_dropout=1"}).find("lora_dropout"), std::string::npos);
  EXPECT_NE(error({"lora_rank=-1"}).find("lora_rank"), std::string::npos);
  EXPECT_NE(testing_util::error_message_of([&] {
              parse_train_config(load_train_config("tiny", {"lora_alpha=32"}), "x");
            }).find("applies with lora_rank"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(root_ + "/bad"));

  // PEFT options hyperion does not implement, by key; an adapter of another shape, by tensor.
  const TrainResult r = lora_run("lora_src", {"steps=1"});
  const std::string dir = testing_util::process_temp_root("hyperion_lora_test") + "/peft_bad";
  fs::create_directories(dir);
  fs::copy_file(r.checkpoint + "/adapter_model.safetensors", dir + "/adapter_model.safetensors",
                fs::copy_options::overwrite_existing);
  nlohmann::json cfg = nlohmann::json::parse(io::read_file(r.checkpoint + "/adapter_config.json"));
  const DecoderConfig c = read_checkpoint_config(base_);
  ParamStore base(c, false, false);
  auto refused = [&](const nlohmann::json& j, const std::string& what) {
    io::write_file_atomic(dir + "/adapter_config.json", j.dump());
    const std::string e = testing_util::error_message_of([&] { convert::load_peft_adapter(dir, base); });
    EXPECT_NE(e.find(what), std::string::npos) << e;
  };
  nlohmann::json j = cfg;
  j["use_dora"] = true;
  refused(j, "use_dora");
  j = cfg;
  j["modules_to_save"] = {"lm_head"};
  refused(j, "modules_to_save");
  j = cfg;
  j["target_modules"] = ".*proj";
  refused(j, "regular expression");
  j = cfg;
  j["r"] = 8;  // the tensors are rank 4
  refused(j, "has shape [4, 64], this model needs [8, 64]");
  j = cfg;
  j["target_modules"] = {"q_proj"};  // the file holds more
  refused(j, "does not belong");
  DecoderConfig wider = c;
  wider.dim = 32;
  wider.head_dim = 8;
  ParamStore wide(wider, false, false);
  io::write_file_atomic(dir + "/adapter_config.json", cfg.dump());
  const std::string e = testing_util::error_message_of([&] { convert::load_peft_adapter(dir, wide); });
  EXPECT_NE(e.find("has shape"), std::string::npos) << e;
}

// The CLI: generate and eval take --adapter (merged into the base), a LoRA checkpoint alone
// finds its base through adapter_config.json, and convert --merge-lora writes the merged
// model: all three give the same tokens and losses.
TEST_F(LoraTraining, CliAdapterFlagsAndMergeAgree) {
  const TrainResult r = lora_run("lora_cli", {"steps=8"});
  const std::string merged = testing_util::process_temp_root("hyperion_lora_test") + "/merged";
  const auto conv = testing_util::run_cli("convert --checkpoint " + base_ + " --merge-lora " + r.checkpoint +
                                          " --to safetensors --output " + merged);
  ASSERT_EQ(conv.code, 0) << conv.out;
  EXPECT_NE(conv.out.find("merged"), std::string::npos) << conv.out;
  EXPECT_TRUE(fs::exists(merged + "/tokenizer.json"));
  const std::string prompt = " --prompt 'Repeat apple river' --temperature 0 --max-tokens 6 --json";
  const auto with_flag = testing_util::run_cli("generate --checkpoint " + base_ + " --adapter " + r.checkpoint + prompt, false);
  const auto alone = testing_util::run_cli("generate --checkpoint " + r.checkpoint + prompt, false);
  const auto from_merged = testing_util::run_cli("generate --checkpoint " + merged + prompt, false);
  const auto plain = testing_util::run_cli("generate --checkpoint " + base_ + prompt, false);
  ASSERT_EQ(with_flag.code, 0) << with_flag.out;
  ASSERT_EQ(alone.code, 0) << alone.out;
  ASSERT_EQ(from_merged.code, 0) << from_merged.out;
  const auto tokens = [](const std::string& out) { return nlohmann::json::parse(out)["tokens"]; };
  EXPECT_EQ(tokens(with_flag.out), tokens(from_merged.out));
  EXPECT_EQ(tokens(alone.out), tokens(from_merged.out));
  (void)plain;
  const std::string text = testing_util::write_jsonl("hyperion_lora_test", "eval.txt", {"Repeat apple river apple river"});
  const auto ev = testing_util::run_cli("eval --checkpoint " + base_ + " --adapter " + r.checkpoint + " --text " + text +
                                        " --seq-len 8 --json", false);
  const auto ev_merged = testing_util::run_cli("eval --checkpoint " + merged + " --text " + text + " --seq-len 8 --json", false);
  ASSERT_EQ(ev.code, 0) << ev.out;
  ASSERT_EQ(ev_merged.code, 0) << ev_merged.out;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(ev.out)["loss"].get<double>(),
                   nlohmann::json::parse(ev_merged.out)["loss"].get<double>());
  EXPECT_EQ(nlohmann::json::parse(ev.out)["adapter"], r.checkpoint);
  // Refusals: exit 2, named.
  const auto missing = testing_util::run_cli("generate --checkpoint " + base_ + " --adapter " + base_ + prompt);
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_NE(missing.out.find("adapter_config.json"), std::string::npos) << missing.out;
  const auto gguf = testing_util::run_cli("convert --checkpoint " + base_ + " --merge-lora " + r.checkpoint + " --to gguf");
  EXPECT_EQ(gguf.code, 2) << gguf.out;
}

// `serve BASE --lora NAME=DIR`: the adapter is a model of the server's, whose greedy text
// is generate --adapter's; the base's stays the base's; bad --lora values exit 2 by name.
TEST_F(LoraTraining, ServeTakesLoraAdapters) {
  const TrainResult r = lora_run("lora_serve", {"steps=8"});
  const std::string root = testing_util::process_temp_root("hyperion_lora_test");
  testing_util::ServerProcess server(base_, {"--lora", "repeat=" + r.checkpoint, "max_concurrent_decodes=2"},
                                     root + "/serve.log");
  ASSERT_GT(server.port(), 0);
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(60, 0);
  const auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const nlohmann::json list = nlohmann::json::parse(models->body)["data"];
  ASSERT_EQ(list.size(), 2u) << models->body;
  EXPECT_EQ(list[1]["id"], "repeat");
  auto complete = [&](const std::string& model) {
    const nlohmann::json body = {{"model", model}, {"prompt", "Repeat apple river"}, {"max_tokens", 6},
                                 {"temperature", 0}, {"ignore_eos", true}};
    const auto res = c.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(res);
    if (!res) return std::string();
    EXPECT_EQ(res->status, 200) << res->body;
    return nlohmann::json::parse(res->body)["choices"][0]["text"].get<std::string>();
  };
  const std::string prompt = " --prompt 'Repeat apple river' --temperature 0 --max-tokens 6 --json";
  const auto with_flag = testing_util::run_cli("generate --checkpoint " + base_ + " --adapter " + r.checkpoint + prompt, false);
  const auto plain = testing_util::run_cli("generate --checkpoint " + base_ + prompt, false);
  ASSERT_EQ(with_flag.code, 0) << with_flag.out;
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(complete("repeat"), nlohmann::json::parse(with_flag.out)["text"]);
  EXPECT_EQ(complete(fs::path(base_).filename().string()), nlohmann::json::parse(plain.out)["text"]);
  EXPECT_EQ(server.stop(), 0);

  for (const std::string& bad : {std::string("repeat"), "=" + r.checkpoint, "x=" + base_}) {
    const auto out = testing_util::run_cli("serve " + base_ + " --port 0 --lora " + bad);
    EXPECT_EQ(out.code, 2) << bad << ": " << out.out;
    EXPECT_NE(out.out.find("--lora"), std::string::npos) << out.out;
  }
}

}  // namespace
}  // namespace hyperion
