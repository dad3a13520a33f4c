// MoE training end to end on the bundled corpus: the loss falls with dropless and with
// capped experts, metrics.jsonl carries the routing figures, checkpoints use Mixtral names
// and load back for evaluation and generation.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/threads.h"
#include "model/generator.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace hyperion {
namespace {

namespace fs = std::filesystem;

std::string temp_root() {
  return testing_util::process_temp_root("hyperion_moe_train_test");
}

// mixtral-tiny's shape scaled down: 2 layers of 4 experts (top-2, ffn 48) on vocab 512.
std::vector<std::string> small_moe_run(const std::string& run_name, double capacity_factor,
                                       int64_t steps) {
  std::vector<std::string> o =
      testing_util::small_run_overrides(temp_root(), run_name, "bfloat16", steps);
  for (std::string kv :
       {"base_mlp_dim=96", "num_experts=4", "num_experts_per_tok=2", "base_moe_mlp_dim=48",
        "load_balance_loss_weight=0.01", "router_z_loss_weight=0.001"})
    o.push_back(kv);
  o.push_back(fmt::format("capacity_factor={}", capacity_factor));
  return o;
}

class MoeTraining : public testing::TestWithParam<double> {
  testing_util::ScopedSingleThread single_thread_;  // see train_test_util.h
};

TEST_P(MoeTraining, LossFallsAndRoutingIsLogged) {
  const double cf = GetParam();
  const std::string name = cf > 0 ? "capped" : "dropless";
  TrainOptions opts;
  opts.quiet = true;
  TrainResult r = run_training(load_train_config("tiny", small_moe_run(name, cf, 200)), "t", opts);
  ASSERT_EQ(r.history.size(), 200u);
  // ln(512) = 6.24 at the start; a dense model of this size reaches ~4.4 in 200 steps.
  EXPECT_GT(r.history.front().lm_loss, 5.8);
  double tail = 0;
  for (size_t i = r.history.size() - 20; i < r.history.size(); ++i) tail += r.history[i].lm_loss;
  tail /= 20;
  EXPECT_LT(tail, 4.9) << name;
  EXPECT_LT(r.eval_loss, 5.0) << name;
  // The objective includes the auxiliary losses.
  const StepMetrics& last = r.history.back();
  EXPECT_GT(last.moe.lb_loss, 0.0f);
  EXPECT_GT(last.moe.z_loss, 0.0f);
  EXPECT_NEAR(last.loss, last.lm_loss + last.moe.lb_loss + last.moe.z_loss, 1e-6);
  EXPECT_GT(last.moe.load_max, 0.0);
  EXPECT_LE(last.moe.load_min, 1.0);
  if (cf > 0) {
    double dropped = 0;
    for (const StepMetrics& m : r.history) dropped += m.moe.dropped_fraction;
    EXPECT_GT(dropped, 0.0) << "cf 1.0 drops some tokens";
  } else {
    for (const StepMetrics& m : r.history) EXPECT_EQ(m.moe.dropped_fraction, 0.0);
  }

  // metrics.jsonl carries the MoE keys.
  std::ifstream in(r.run_dir + "/metrics.jsonl");
  std::string line, lastline;
  while (std::getline(in, line)) lastline = line;
  const nlohmann::json j = nlohmann::json::parse(lastline);
  for (const char* key : {"loss", "lm_loss", "moe_lb_loss", "moe_z_loss", "moe_dropped_fraction",
                          "expert_load_min", "expert_load_max", "expert_load_cv"})
    EXPECT_TRUE(j.contains(key)) << key;

  // The checkpoint: Mixtral names and config, loads back, evaluates and generates.
  const std::string ck = r.checkpoint;
  const DecoderConfig c = read_checkpoint_config(ck);
  EXPECT_EQ(c.n_experts, 4);
  EXPECT_EQ(c.expert_ffn_dim(), 48);
  ParamStore ps(c, false);
  load_model_weights(ck, ps);
  EXPECT_NE(ps.find("model.layers.1.block_sparse_moe.experts.3.w2.weight"), nullptr);
  std::vector<int32_t> val =
      read_shard_tokens(testing_util::prepared_dataset(temp_root()) + "/val.bin", c.vocab_size);
  EvalReport e = evaluate_stream(ps, val, 64, 8);
  // Evaluation is dropless (nothing dropped at inference), in f32: near the trainer's.
  EXPECT_NEAR(e.loss, r.eval_loss, cf > 0 ? 0.15 : 0.05);
  Generator gen(ps, 16);
  GenerateOptions go;
  go.sampling.temperature = 0;
  go.max_tokens = 8;
  go.stop_at_eos = false;
  EXPECT_EQ(generate_tokens(gen, {c.bos_id}, go).size(), 8u);
}

INSTANTIATE_TEST_SUITE_P(Paths, MoeTraining, testing::Values(-1.0, 1.0),
                         [](const testing::TestParamInfo<double>& i) {
                           return i.param > 0 ? "capped" : "dropless";
                         });

}  // namespace
}  // namespace hyperion
