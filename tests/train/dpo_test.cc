// Direct preference optimisation: the per-pair loss, its derivatives and rewards against
// values PyTorch computed (TRL's sigmoid loss), the pair data read with the Llama 3.1
// template (the completions trained, the prompt not), the model gradient of a DPO step
// against finite differences, and a DPO run whose reward accuracy on synthetic
// preferences passes 0.9.
#include "train/dpo.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../model/model_test_util.h"
#include "base/error.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/fill.h"
#include "model/lora.h"
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
  return testing_util::write_jsonl("hyperion_dpo_test", name, lines);
}

std::string error_of(const std::function<void()>& f) {
  return testing_util::error_message_of(f);
}

// policy chosen, policy rejected, reference chosen, reference rejected, beta, label
// smoothing; then the loss, its derivatives by the two policy log-probabilities, and the
// two rewards, from torch 1.13 in float64:
//   logits = (pc - pr) - (rc - rr)
//   loss = -logsigmoid(beta logits) (1 - eps) - logsigmoid(-beta logits) eps
// with autograd for the derivatives.
struct TorchCase {
  double pc, pr, rc, rr, beta, eps, loss, dpc, dpr, reward_c, reward_r;
};
const TorchCase kTorch[] = {
    {-12.5, -14.0, -13.0, -13.5, 0.1, 0.0, 0.64439666007357088, -0.047502081252106004, 0.047502081252106004,
     0.050000000000000003, -0.050000000000000003},
    {-3.0, -2.0, -4.0, -1.0, 0.5, 0.0, 0.31326168751822286, -0.13447071068499755, 0.13447071068499755, 0.5, -0.5},
    {-20.0, -25.0, -22.0, -21.0, 0.1, 0.1, 0.49748795048588568, -0.025434369377420454, 0.025434369377420454,
     0.20000000000000001, -0.40000000000000002},
    {-7.25, -7.25, -7.25, -7.25, 1.0, 0.2, 0.69314718055994529, -0.30000000000000004, 0.30000000000000004, 0, 0},
    {-50.0, -10.0, -40.0, -30.0, 2.0, 0.0, 60, -2, 2, -20, 40},
};

TEST(Dpo, LossDerivativesAndRewardsEqualPyTorch) {
  for (const TorchCase& c : kTorch) {
    const DpoTerms t = dpo_terms(c.pc, c.pr, c.rc, c.rr, c.beta, c.eps);
    EXPECT_NEAR(t.loss, c.loss, 1e-12 * std::max(1.0, c.loss));
    EXPECT_NEAR(t.dchosen, c.dpc, 1e-12);
    EXPECT_NEAR(t.drejected, c.dpr, 1e-12);
    EXPECT_NEAR(t.reward_chosen, c.reward_c, 1e-12);
    EXPECT_NEAR(t.reward_rejected, c.reward_r, 1e-12);
  }
}

TEST(Dpo, PairsTrainTheirCompletionsOnly) {
  const std::optional<text::Tokenizer> tok = llama();
  if (!tok) GTEST_SKIP() << "tokenizer-llama3_1 is not installed";
  const text::ChatTemplate chat = *text::ChatTemplate::of(*tok);
  const std::string path = write_lines(
      "pairs.jsonl",
      {R"({"prompt": "Capital of France?", "chosen": "Paris", "rejected": "Lyon"})",
       // A prompt with an earlier assistant turn: only the completion trains.
       R"({"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},)"
       R"( {"role": "user", "content": "2+2?"}], "chosen": [{"role": "assistant", "content": "4"}],)"
       R"( "rejected": [{"role": "assistant", "content": "5"}]})"});
  const DpoData d = read_dpo_jsonl(path, *tok, chat, {});
  ASSERT_EQ(d.pairs.size(), 2u);
  auto trained = [&](const SftExample& e) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < e.tokens.size(); ++i)
      if (e.trained[i]) ids.push_back(e.tokens[i]);
    return tok->decode(ids, false);
  };
  EXPECT_EQ(trained(d.pairs[0].chosen), "Paris<|eot_id|>");
  EXPECT_EQ(trained(d.pairs[0].rejected), "Lyon<|eot_id|>");
  EXPECT_EQ(trained(d.pairs[1].chosen), "4<|eot_id|>");
  EXPECT_EQ(trained(d.pairs[1].rejected), "5<|eot_id|>");
  for (const std::string& bad : {std::string(R"({"prompt": "x", "chosen": "y"})"), std::string("{oops")}) {
    const std::string p = write_lines("bad_pairs.jsonl", {bad});
    const std::string e = error_of([&] { read_dpo_jsonl(p, *tok, chat, {}); });
    EXPECT_NE(e.find(p + ":1:"), std::string::npos) << e;
  }
}

// The gradient dpo_accumulate leaves in the model equals the finite differences of the
// pairs' summed loss, parameter by parameter (a sample of them), f32.
// `pairs` pairs of random rows of t tokens, each row's first 3 targets ignored (the prompt).
Batch random_pairs(int64_t pairs, int64_t t, int64_t vocab) {
  std::mt19937 rng(9);
  Batch b = Batch::tokens(pairs, 2 * t);
  for (size_t i = 0; i < b.inputs.size(); ++i) {
    b.inputs[i] = static_cast<int32_t>(rng() % vocab);
    b.targets[i] = static_cast<int64_t>(i) % (2 * t) % t < 3 ? kIgnoreIndex : static_cast<int32_t>(rng() % vocab);
  }
  return b;
}

// Central differences of `loss` at every `stride`-th element of p[0, n) whose gradient is
// not zero (zeros: padding between tensors, unused rows, dropped inputs) against `grad`;
// returns how many were checked.
int expect_fd_gradient(float* p, int64_t n, const std::vector<float>& grad, int64_t stride,
                       const std::function<double()>& loss) {
  int checked = 0;
  for (int64_t i = 0; i < n; i += stride) {
    if (grad[static_cast<size_t>(i)] == 0.0f) continue;
    const float keep = p[i], h = 1e-2f;
    p[i] = keep + h;
    const double up = loss();
    p[i] = keep - h;
    const double down = loss();
    p[i] = keep;
    const double fd = (up - down) / (2.0 * h);
    EXPECT_NEAR(grad[static_cast<size_t>(i)], fd, 2e-2 * std::fabs(fd) + 2e-4) << "element " << i;
    ++checked;
  }
  return checked;
}

TEST(Dpo, StepGradientMatchesFiniteDifferences) {
  const DecoderConfig cfg = testing_util::tiny_test_config();
  ParamStore ps(cfg, false, true);
  ps.init(3, 0.3);
  const int64_t t = 8, pairs = 2;
  CausalLM model(ps, ModelOptions(1, t, false));
  const Batch b = random_pairs(pairs, t, cfg.vocab_size);
  const std::vector<double> ref = {-20.0, -21.5, -19.0, -18.0};
  const double beta = 0.5, eps = 0.1;
  ps.zero_grads();
  dpo_accumulate(model, b, ref, beta, eps, 1.0);
  const std::vector<float> grad(ps.grads(), ps.grads() + ps.size());
  auto total_loss = [&] {
    double sum = 0;
    for (int64_t i = 0; i < pairs; ++i) {
      const int32_t* in = b.inputs.data() + i * 2 * t;
      const int32_t* tg = b.targets.data() + i * 2 * t;
      const double pc = row_logprob(model, in, tg), pr = row_logprob(model, in + t, tg + t);
      sum += dpo_terms(pc, pr, ref[static_cast<size_t>(2 * i)], ref[static_cast<size_t>(2 * i + 1)], beta, eps).loss;
    }
    return sum;
  };
  EXPECT_GT(expect_fd_gradient(ps.params(), ps.size(), grad, 97, total_loss), 20);
}

// With a LoRA adapter and its dropout on, each row's log-probability and backward see one
// mask (row r's key: dropout_key(key, r) | 1): the adapters' gradient is the gradient of
// the loss under those masks.
TEST(Dpo, LoraDropoutStepGradientMatchesFiniteDifferences) {
  const DecoderConfig cfg = testing_util::tiny_test_config();
  ParamStore ps(cfg, false, false);
  ps.init(3, 0.3);
  LoraConfig lc;
  lc.rank = 2;
  lc.alpha = 4;
  lc.dropout = 0.25;
  lc.targets = parse_lora_targets("all-linear", "test");
  LoraAdapter adapter(ps, lc, true, false);
  adapter.init(5);
  ParamStore& s = adapter.store();
  for (size_t i = 1; i < s.infos().size(); i += 2) fill_normal(s.param(static_cast<int>(i)), 40 + i, 0.0f, 0.3f);
  const int64_t t = 8, pairs = 2;
  CausalLM model(ps, ModelOptions(1, t, false));
  model.set_lora(&adapter);
  const Batch b = random_pairs(pairs, t, cfg.vocab_size);
  const std::vector<double> ref = {-20.0, -21.5, -19.0, -18.0};
  const double beta = 0.5;
  const uint64_t key = 0xd0d0;
  s.zero_grads();
  dpo_accumulate(model, b, ref, beta, 0.0, 1.0, key);
  const std::vector<float> grad(s.grads(), s.grads() + s.size());
  auto logprob = [&](int64_t r) {
    model.set_lora_dropout_key(dropout_key(key, static_cast<uint64_t>(r)) | 1);
    const double lp = row_logprob(model, b.inputs.data() + r * t, b.targets.data() + r * t);
    model.set_lora_dropout_key(0);
    return lp;
  };
  auto total_loss = [&] {
    double sum = 0;
    for (int64_t i = 0; i < pairs; ++i)
      sum += dpo_terms(logprob(2 * i), logprob(2 * i + 1), ref[static_cast<size_t>(2 * i)],
                       ref[static_cast<size_t>(2 * i + 1)], beta, 0.0)
                 .loss;
    return sum;
  };
  // Without the key the rows' log-probabilities differ: the dropout did something.
  EXPECT_NE(row_logprob(model, b.inputs.data(), b.targets.data()), logprob(0));
  EXPECT_GT(expect_fd_gradient(s.params(), s.size(), grad, 13, total_loss), 20);
}

// Synthetic preferences: the chosen answer takes up the prompt's words ("Gladly: the X and
// the Y."), the rejected one refuses. A small model trained from scratch with DPO for a
// few dozen steps ranks the chosen answer higher on nearly every pair.
// Synthetic preferences: the chosen answer takes up the prompt's words ("Gladly: the X and
// the Y."), the rejected one refuses.
std::string synthetic_preferences() {
  const std::vector<std::string> words = {"apple", "river", "stone", "cloud", "green", "seven", "table", "light"};
  std::vector<std::string> lines;
  for (int i = 0; i < 64; ++i) {
    const std::string& w = words[static_cast<size_t>(i * 5 % 8)];
    const std::string& v = words[static_cast<size_t>((i * 3 + 1) % 8)];
    lines.push_back(R"({"prompt": "Tell me about the )" + w + " and the " + v + R"(", "chosen": "Gladly: the )" + w +
                    " and the " + v + R"(.", "rejected": "No. Ask about something else."})");
  }
  return write_lines("prefs.jsonl", lines);
}

TrainResult dpo_run(const std::string& name, int64_t stop_at, std::vector<std::string> extra = {}) {
  TrainOptions opts;
  opts.quiet = true;
  opts.stop_at = stop_at;
  std::vector<std::string> keys = {"use_dpo=true", "dpo_beta=0.5", "dataset_path=" + synthetic_preferences(),
                                   "tokenizer_path=" + llama_dir(), "vocab_size=128256", "base_emb_dim=64",
                                   "base_num_decoder_layers=2", "base_num_query_heads=4", "base_num_kv_heads=2",
                                   "base_mlp_dim=128", "max_target_length=48", "per_device_batch_size=4",
                                   "steps=30", "learning_rate=2e-3", "dtype=float32", "eval_interval=0",
                                   "eval_fraction=0.1", "sample_count=0", "log_period=1000", "peak_tflops=1",
                                   "base_output_directory=" + testing_util::process_temp_root("hyperion_dpo_test"),
                                   "run_name=" + name};
  keys.insert(keys.end(), extra.begin(), extra.end());
  return run_training(load_train_config("tiny", keys), "test", opts);
}

double late_accuracy(const TrainResult& r) {
  double late = 0;
  for (size_t i = 20; i < 30; ++i) late += r.history[i].rewards_accuracies / 10.0;
  return late;
}

TEST(DpoTraining, RewardAccuracyPassesNinetyPercent) {
  if (!llama()) GTEST_SKIP() << "tokenizer-llama3_1 is not installed";
  auto run = [](const std::string& name, int64_t stop_at) { return dpo_run(name, stop_at); };
  const TrainResult r = run("dpo", 0);
  ASSERT_EQ(r.history.size(), 30u);
  EXPECT_TRUE(r.history.back().dpo);
  // The first step's policy is the reference: rewards 0, loss ln 2.
  EXPECT_NEAR(r.history.front().loss, std::log(2.0), 1e-4);
  EXPECT_GT(late_accuracy(r), 0.9);
  EXPECT_GT(r.history.back().rewards_margins, 0.0);
  EXPECT_LT(r.eval_loss, std::log(2.0));  // held-out pairs: better than chance
  EXPECT_TRUE(fs::exists(r.run_dir + "/dpo_reference.json"));
  // metrics.jsonl carries TRL's names.
  std::ifstream in(r.run_dir + "/metrics.jsonl");
  std::string last, line;
  while (std::getline(in, line)) last = line;
  for (const char* key : {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins"})
    EXPECT_NE(last.find(key), std::string::npos) << key;
  // Stopped at step 12 and resumed: the reference comes back from the run directory (not
  // from the weights at step 12) and the run continues exactly as the unbroken one.
  run("dpo_split", 12);
  const TrainResult second = run("dpo_split", 0);
  EXPECT_EQ(second.start_step, 12);
  ASSERT_EQ(second.history.size(), 18u);
  for (size_t i = 0; i < 18; ++i) {
    EXPECT_EQ(second.history[i].loss, r.history[12 + i].loss) << "step " << 13 + i;
    EXPECT_EQ(second.history[i].rewards_chosen, r.history[12 + i].rewards_chosen) << "step " << 13 + i;
  }
}

// The same preferences learnt by LoRA adapters on the frozen (random) base, the reference
// being the base with the adapters off: the first step's policy is the reference, and the
// adapters alone rank the chosen answer higher on nearly every pair.
TEST(DpoTraining, LoraAdaptersReachNinetyPercent) {
  if (!llama()) GTEST_SKIP() << "tokenizer-llama3_1 is not installed";
  const TrainResult r = dpo_run("dpo_lora", 0, {"lora_rank=8", "lora_alpha=16", "learning_rate=1e-2"});
  ASSERT_EQ(r.history.size(), 30u);
  EXPECT_NEAR(r.history.front().loss, std::log(2.0), 1e-4);
  std::printf("[ info ] DPO with LoRA: rewards/accuracies %.3f over steps 21-30, margin %.3f at 30\n",
              late_accuracy(r), r.history.back().rewards_margins);
  EXPECT_GT(late_accuracy(r), 0.9);
  EXPECT_GT(r.history.back().rewards_margins, 0.0);
  EXPECT_TRUE(fs::exists(r.checkpoint + "/adapter_model.safetensors"));
}

TEST(DpoConfig, KeysAreCheckedByName) {
  auto error = [](std::vector<std::string> o) {
    return error_of([&] { parse_train_config(load_train_config("tiny", o), "x"); });
  };
  const std::vector<std::string> base = {"use_dpo=true", "dataset_path=p.jsonl", "tokenizer_path=t"};
  auto with = [&](const char* extra) {
    std::vector<std::string> o = base;
    o.push_back(extra);
    return o;
  };
  EXPECT_NE(error(with("dpo_beta=0")).find("dpo_beta"), std::string::npos);
  EXPECT_NE(error(with("dpo_label_smoothing=0.5")).find("dpo_label_smoothing"), std::string::npos);
  EXPECT_NE(error(with("use_sft=true")).find("use_sft"), std::string::npos);
  EXPECT_NE(error(with("packing=true")).find("packing"), std::string::npos);
  EXPECT_NE(error({"dpo_beta=0.2"}).find("use_dpo=true"), std::string::npos);
  const TrainConfig t = parse_train_config(load_train_config("tiny", with("dpo_beta=0.3")), "x");
  EXPECT_TRUE(t.use_dpo);
  EXPECT_DOUBLE_EQ(t.dpo_beta, 0.3);
}

}  // namespace
}  // namespace hyperion::train
