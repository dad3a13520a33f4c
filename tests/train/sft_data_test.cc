// Supervised fine-tuning data: JSONL conversations read with the Llama 3.1 chat template
// and tokenizer (the package setup.sh --tests installs; skipped where missing), the rows
// the loader makes of them (assistant targets only, padding ignored), errors that name the
// line, and a short SFT run through the trainer whose held-out loss on the assistant's
// tokens falls.
#include "train/sft_data.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "../kernels/simulated_device.h"
#include "base/error.h"
#include "kernels/cross_entropy.h"
#include "train/trainer.h"
#include "chat_data_test_util.h"
#include "train_test_util.h"

namespace hyperion::train {
namespace {

namespace fs = std::filesystem;

std::string llama_dir() {
  return testing_util::llama_tokenizer_dir();
}

std::optional<text::Tokenizer> llama() {
  return testing_util::llama_tokenizer();
}

std::string write_lines(const std::string& name, const std::vector<std::string>& lines) {
  return testing_util::write_jsonl("hyperion_sft_test", name, lines);
}

std::string error_of(const std::function<void()>& f) {
  return testing_util::error_message_of(f);
}

TEST(SftData, ReadsBothFormsAndMasksTheAssistant) {
  const std::optional<text::Tokenizer> tok = llama();
  if (!tok) GTEST_SKIP() << "tokenizer-llama3_1 is not installed";
  const text::ChatTemplate chat = *text::ChatTemplate::of(*tok);
  const std::string path = write_lines(
      "forms.jsonl",
      {R"({"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]})", "",
       R"({"prompt": "Say bye", "completion": "bye"})",
       R"({"prompt": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Yo"}],)"
       R"( "completion": [{"role": "assistant", "content": "Hello there"}]})"});
  const SftData d = read_sft_jsonl(path, *tok, chat, {});
  ASSERT_EQ(d.examples.size(), 3u);
  EXPECT_EQ(d.lines, 3);
  EXPECT_EQ(d.examples[1].line, 3);  // the blank line is skipped, not renumbered
  auto trained_text = [&](const SftExample& e) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < e.tokens.size(); ++i)
      if (e.trained[i]) ids.push_back(e.tokens[i]);
    return tok->decode(ids, false);
  };
  EXPECT_EQ(trained_text(d.examples[0]), "hi<|eot_id|>");
  EXPECT_EQ(trained_text(d.examples[1]), "bye<|eot_id|>");
  EXPECT_EQ(trained_text(d.examples[2]), "Hello there<|eot_id|>");
  EXPECT_EQ(d.examples[0].tokens.front(), tok->bos_id());  // the template writes <|begin_of_text|>

  // The loader's rows: inputs are the tokens, targets the next token where it is trained,
  // padding ignored.
  auto shared = std::make_shared<const SftData>(d);
  const int64_t T = 40;
  SftLoader loader(shared, 0, 3, 3, T, 0, /*shuffle=*/false, /*pad_id=*/7);
  std::vector<int32_t> in(static_cast<size_t>(3 * T)), tg(in.size());
  loader.next(in.data(), tg.data());
  for (int64_t r = 0; r < 3; ++r) {
    const SftExample& e = d.examples[static_cast<size_t>(r)];
    const auto n = static_cast<int64_t>(e.tokens.size());
    ASSERT_LT(n, T);
    for (int64_t j = 0; j < T; ++j) {
      const size_t at = static_cast<size_t>(r * T + j);
      EXPECT_EQ(in[at], j < n ? e.tokens[static_cast<size_t>(j)] : 7) << r << "," << j;
      const int32_t want =
          j + 1 < n && e.trained[static_cast<size_t>(j + 1)] ? e.tokens[static_cast<size_t>(j + 1)] : kIgnoreIndex;
      EXPECT_EQ(tg[at], want) << r << "," << j;
    }
  }
}

// Packed: conversations fill each row in file order, positions restart at each, the last
// token of each has no target, and the tail is padding.
TEST(SftData, PackedRowsHoldWholeConversations) {
  const std::optional<text::Tokenizer> tok = llama();
  if (!tok) GTEST_SKIP() << "tokenizer-llama3_1 is not installed";
  const text::ChatTemplate chat = *text::ChatTemplate::of(*tok);
  std::vector<std::string> lines;
  for (const char* w : {"one", "two", "three", "four", "five"})
    lines.push_back(std::string(R"({"prompt": "Say )") + w + R"(", "completion": ")" + w + R"("})");
  const std::string path = write_lines("packed.jsonl", lines);
  auto d = std::make_shared<const SftData>(read_sft_jsonl(path, *tok, chat, {}));
  const auto len = static_cast<int64_t>(d->examples[0].tokens.size());
  for (const SftExample& e : d->examples) ASSERT_EQ(static_cast<int64_t>(e.tokens.size()), len);
  const int64_t T = 2 * len + 3;  // two conversations per row, 3 tokens of padding
  SftLoader loader(d, 0, 5, 1, T, 0, /*shuffle=*/false, /*pad_id=*/9, 0, 1, /*packing=*/true);
  EXPECT_TRUE(loader.packs());
  EXPECT_EQ(loader.sequences_per_epoch(), 3);  // 2 + 2 + 1
  Batch b = Batch::tokens(1, T);
  loader.next(b);
  ASSERT_EQ(b.positions.size(), static_cast<size_t>(T));
  for (int64_t c = 0; c < 2; ++c) {
    const SftExample& e = d->examples[static_cast<size_t>(c)];
    for (int64_t j = 0; j < len; ++j) {
      const size_t at = static_cast<size_t>(c * len + j);
      EXPECT_EQ(b.inputs[at], e.tokens[static_cast<size_t>(j)]);
      EXPECT_EQ(b.positions[at], j);
      const int32_t want =
          j + 1 < len && e.trained[static_cast<size_t>(j + 1)] ? e.tokens[static_cast<size_t>(j + 1)] : kIgnoreIndex;
      EXPECT_EQ(b.targets[at], want) << c << "," << j;
    }
  }
  for (int64_t j = 2 * len; j < T; ++j) {
    EXPECT_EQ(b.inputs[static_cast<size_t>(j)], 9);
    EXPECT_EQ(b.targets[static_cast<size_t>(j)], kIgnoreIndex);
    EXPECT_EQ(b.positions[static_cast<size_t>(j)], j - 2 * len);
  }
  // An unpacked loader leaves the positions empty.
  SftLoader rows(d, 0, 5, 1, T, 0, false, 9);
  rows.next(b);
  EXPECT_TRUE(b.positions.empty());
}

TEST(SftData, TruncationNeverLeavesAnUntrainedConversation) {
  const std::optional<text::Tokenizer> tok = llama();
  if (!tok) GTEST_SKIP() << "tokenizer-llama3_1 is not installed";
  const text::ChatTemplate chat = *text::ChatTemplate::of(*tok);
  const std::string long_prompt(400, 'x');
  const std::string path = write_lines(
      "truncate.jsonl", {R"({"prompt": "short", "completion": "a fairly long answer with many words in it"})",
                         R"({"prompt": ")" + long_prompt + R"(", "completion": "never seen"})"});
  SftReadOptions o;
  o.max_tokens = 16;
  const SftData d = read_sft_jsonl(path, *tok, chat, o);
  ASSERT_EQ(d.examples.size(), 1u);  // the second has no trained token within 16
  EXPECT_EQ(d.dropped, 1);
  EXPECT_EQ(d.truncated, 2);
  EXPECT_EQ(d.examples[0].tokens.size(), 16u);
  o.max_tokens = 4;  // not even the first conversation's answer: nothing left
  const std::string e = error_of([&] { read_sft_jsonl(path, *tok, chat, o); });
  EXPECT_NE(e.find("no conversation to train on"), std::string::npos) << e;
}

TEST(SftData, BadLinesAreRefusedByPathAndLine) {
  const std::optional<text::Tokenizer> tok = llama();
  if (!tok) GTEST_SKIP() << "tokenizer-llama3_1 is not installed";
  const text::ChatTemplate chat = *text::ChatTemplate::of(*tok);
  const std::string good = R"({"prompt": "a", "completion": "b"})";
  struct Bad {
    std::string line, words;
  };
  for (const Bad& b : {Bad{"{not json", "not JSON"}, Bad{"[1, 2]", "JSON object"},
                       Bad{R"({"text": "pretraining text"})", "\"messages\", or \"prompt\" and \"completion\""},
                       Bad{R"({"messages": [{"role": "user", "content": "no answer"}]})", "no assistant turn"},
                       Bad{R"({"prompt": 3, "completion": "x"})", "\"prompt\" must be a string"}}) {
    const std::string path = write_lines("bad.jsonl", {good, b.line});
    const std::string e = error_of([&] { read_sft_jsonl(path, *tok, chat, {}); });
    EXPECT_NE(e.find(path + ":2:"), std::string::npos) << e;
    EXPECT_NE(e.find(b.words), std::string::npos) << e;
  }
  const std::string missing = error_of([&] { read_sft_jsonl("/nonexistent/x.jsonl", *tok, chat, {}); });
  EXPECT_NE(missing.find("/nonexistent/x.jsonl"), std::string::npos) << missing;
  // Fewer conversations than one step's batch.
  const std::string path = write_lines("few.jsonl", {good, good});
  auto d = std::make_shared<const SftData>(read_sft_jsonl(path, *tok, chat, {}));
  const std::string e = error_of([&] { SftLoader(d, 0, 2, 4, 16, 0, true, 0); });
  EXPECT_NE(e.find("2 conversations"), std::string::npos) << e;
}

// Conversations the test generates: the assistant repeats the user's word twice. A tiny
// model trained from scratch on them for a few dozen steps: the loss (assistant tokens
// only) falls, the held-out loss is measured, and a checkpoint is written.
TEST(SftTraining, HeldOutLossOnTheAssistantsTokensFalls) {
  if (!llama()) GTEST_SKIP() << "tokenizer-llama3_1 is not installed";
  const std::vector<std::string> words = {"apple", "river", "stone", "cloud", "green", "seven", "table", "light"};
  std::vector<std::string> lines;
  for (int i = 0; i < 96; ++i) {
    const std::string& w = words[static_cast<size_t>(i * 5 % 8)];
    const std::string& v = words[static_cast<size_t>(i * 3 % 8)];
    lines.push_back(R"({"messages": [{"role": "user", "content": "Repeat )" + w + " " + v +
                    R"("}, {"role": "assistant", "content": ")" + w + " " + v + " " + w + " " + v + R"("}]})");
  }
  const std::string data = write_lines("repeat.jsonl", lines);
  const std::string root = testing_util::process_temp_root("hyperion_sft_test");
  TrainOptions opts;
  opts.quiet = true;
  const TrainResult r = run_training(
      load_train_config("tiny", {"use_sft=true", "dataset_path=" + data, "tokenizer_path=" + llama_dir(),
                                 "vocab_size=128256", "base_emb_dim=64", "base_num_decoder_layers=2",
                                 "base_num_query_heads=4", "base_num_kv_heads=2", "base_mlp_dim=128",
                                 "max_target_length=48", "per_device_batch_size=8", "steps=40",
                                 "learning_rate=1e-2", "dtype=float32", "eval_interval=0", "eval_fraction=0.1",
                                 "eval_batches=1", "sample_count=0", "log_period=1000", "peak_tflops=1",
                                 "base_output_directory=" + root, "run_name=sft"}),
      "test", opts);
  ASSERT_EQ(r.history.size(), 40u);
  const double first = r.history.front().loss, last = r.history.back().loss;
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;
  EXPECT_GT(r.eval_tokens, 0);
  EXPECT_LT(r.eval_loss, 0.5 * first);
  EXPECT_FALSE(r.checkpoint.empty());
  // Packed: several conversations per sequence, each attending to itself.
  const TrainResult p = run_training(
      load_train_config("tiny", {"use_sft=true", "packing=true", "dataset_path=" + data,
                                 "tokenizer_path=" + llama_dir(), "vocab_size=128256", "base_emb_dim=64",
                                 "base_num_decoder_layers=2", "base_num_query_heads=4", "base_num_kv_heads=2",
                                 "base_mlp_dim=128", "max_target_length=96", "per_device_batch_size=4", "steps=40",
                                 "learning_rate=1e-2", "dtype=float32", "eval_interval=0", "eval_fraction=0.1",
                                 "eval_batches=1", "sample_count=0", "log_period=1000", "peak_tflops=1",
                                 "base_output_directory=" + root, "run_name=sft_packed"}),
      "test", opts);
  ASSERT_EQ(p.history.size(), 40u);
  EXPECT_LT(p.history.back().loss, 0.5 * p.history.front().loss);
  EXPECT_LT(p.eval_loss, 0.5 * p.history.front().loss);
  // A short packed run on the host and on the device (the simulated one where no GPU is
  // usable: the same kernels, so the same losses bit for bit; a GPU's within its
  // tolerance).
  testing_util::simulated_device();
  auto short_run = [&](const char* hardware) {
    return run_training(
        load_train_config("tiny", {"use_sft=true", "packing=true", std::string("hardware=") + hardware,
                                   "dataset_path=" + data, "tokenizer_path=" + llama_dir(), "vocab_size=128256",
                                   "base_emb_dim=64", "base_num_decoder_layers=2", "base_num_query_heads=4",
                                   "base_num_kv_heads=2", "base_mlp_dim=128", "max_target_length=96",
                                   "per_device_batch_size=4", "steps=4", "learning_rate=1e-2", "dtype=float32",
                                   "eval_interval=0", "eval_fraction=0.1", "eval_batches=1", "sample_count=0",
                                   "log_period=1000", "peak_tflops=1", "base_output_directory=" + root,
                                   std::string("run_name=sft_packed_") + hardware}),
        "test", opts);
  };
  const TrainResult hc = short_run("cpu"), g = short_run("gpu");
  ASSERT_EQ(g.history.size(), 4u);
  const bool simulated = testing_util::simulated_device() != nullptr;
  for (size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(g.history[i].loss, hc.history[i].loss, simulated ? 0.0 : 1e-3 * hc.history[i].loss) << "step " << i;
  // A bad line: refused by path:line, and no run directory is left behind.
  const std::string bad = write_lines("repeat_bad.jsonl", {lines[0], R"({"messages": []})"});
  const std::string e = error_of([&] {
    run_training(load_train_config("tiny", {"use_sft=true", "dataset_path=" + bad, "tokenizer_path=" + llama_dir(),
                                            "vocab_size=128256", "base_output_directory=" + root,
                                            "run_name=sft_bad"}),
                 "test", opts);
  });
  EXPECT_NE(e.find(bad + ":2:"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(root + "/sft_bad"));
}

TEST(SftConfig, KeysAreCheckedByName) {
  auto error = [](std::vector<std::string> o) {
    return error_of([&] { parse_train_config(load_train_config("tiny", o), "x"); });
  };
  EXPECT_NE(error({"use_sft=true"}).find("dataset_path"), std::string::npos);
  EXPECT_NE(error({"use_sft=true", "dataset_path=x.jsonl"}).find("chat template"), std::string::npos);
  EXPECT_TRUE(parse_train_config(load_train_config("tiny", {"use_sft=true", "dataset_path=x.jsonl",
                                                              "tokenizer_path=t", "packing=true"}),
                                 "x")
                  .packing);
  EXPECT_NE(error({"packing=true"}).find("use_sft=true"), std::string::npos);
  EXPECT_NE(error({"sft_train_on_completion_only=false"}).find("use_sft=true"), std::string::npos);
  // At their defaults (a resumed run's saved config repeats every key) they pass.
  EXPECT_EQ(error({"packing=false", "sft_train_on_completion_only=true", "dpo_beta=0.1"}), "(no error)");
  const TrainConfig t =
      parse_train_config(load_train_config("tiny", {"use_sft=true", "dataset_path=x.jsonl", "tokenizer_path=t",
                                                    "sft_train_on_completion_only=false"}),
                         "x");
  EXPECT_TRUE(t.use_sft);
  EXPECT_FALSE(t.sft_completion_only);
}

}  // namespace
}  // namespace hyperion::train
