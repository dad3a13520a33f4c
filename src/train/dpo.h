// Direct preference optimisation (`use_dpo`; Rafailov et al. 2023, TRL's DPOTrainer with
// its sigmoid loss): pairs of completions of one prompt, the preferred one raised against
// the other relative to a frozen reference model.
//
// Data: JSONL lines {"prompt": P, "chosen": C, "rejected": R}, each a string (a user turn,
// the assistant's answers) or a list of messages, rendered with the chat template as SFT
// renders them (train/sft_data.h); the log-probability of a completion sums over its
// assistant tokens after the prompt.
//
// The loss per pair, with logp the policy's and ref the reference's log-probabilities:
//   d = beta ((logp_c - ref_c) - (logp_r - ref_r))
//   loss = -(1 - eps) log sigmoid(d) - eps log sigmoid(-d)      (eps: label_smoothing)
// and TRL's metrics: rewards/chosen = beta (logp_c - ref_c), rewards/rejected likewise,
// rewards/margins their difference, rewards/accuracies the fraction of pairs whose chosen
// reward is the larger.
//
// The reference log-probabilities are computed once, before the first step, by the
// starting weights (the model being fine-tuned, as TRL does without a ref_model).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "train/sft_data.h"

namespace hyperion::train {

struct DpoPair {
  SftExample chosen, rejected;
  int64_t line = 0;
};

struct DpoData {
  std::string path;
  std::vector<DpoPair> pairs;
  int64_t lines = 0, truncated = 0, dropped = 0;  // as SftData's, per pair
};

// Throws hyperion::UsageError naming "path:line" and what is wrong with the line, or the
// file when no pair is left (a pair is dropped when either completion has no trained
// token within max_tokens).
DpoData read_dpo_jsonl(const std::string& path, const text::Tokenizer& tokenizer,
                       const text::ChatTemplate& chat_template, const SftReadOptions& options);

// One pair's loss, its derivatives by the policy's two log-probabilities, and rewards.
struct DpoTerms {
  double loss = 0, dchosen = 0, drejected = 0;
  double reward_chosen = 0, reward_rejected = 0;
};
DpoTerms dpo_terms(double policy_chosen, double policy_rejected, double ref_chosen, double ref_rejected,
                   double beta, double label_smoothing);

// A pair per sequence of 2 x seq_len tokens: the chosen row, then the rejected row (each
// an unpacked SFT row); last_pairs() says which pairs the last next() handed out.
class DpoLoader final : public SequenceBatcher {
 public:
  DpoLoader(std::shared_ptr<const DpoData> data, int64_t first, int64_t count, int64_t batch, int64_t seq_len,
            uint64_t seed, bool shuffle, int32_t pad_id, int rank = 0, int world = 1);
  const std::vector<int64_t>& last_pairs() const { return last_; }
  int64_t row_len() const { return seq_len_ / 2; }

 private:
  void fill(int64_t sequence, int32_t* inputs, int32_t* targets, int32_t* positions) override;
  std::string describe() const override;
  std::shared_ptr<const DpoData> data_;
  int64_t first_;
  int32_t pad_id_;
  std::vector<int64_t> last_;
};

// The log-probability a model (batch 1 x T) gives a row's trained targets: minus the
// summed cross-entropy.
double row_logprob(CausalLM& model, const int32_t* inputs, const int32_t* targets);

struct DpoStepStats {
  double loss = 0, rewards_chosen = 0, rewards_rejected = 0, accuracies = 0, margins = 0;  // pair means
  int64_t pairs = 0;
};

// Adds to the model's gradients `scale` x the gradient of the summed loss of the pairs in
// `batch` (P sequences of 2T: chosen row, rejected row), whose reference log-probabilities
// are ref[2i] (chosen) and ref[2i + 1]: each row's log-probability first (a forward), then
// each row's cross-entropy backward weighted by the loss's derivative. The model runs
// batch 1 x T. dropout_key != 0: the adapter's dropout on, each row's forwards under one
// mask derived from it. Returns the pairs' means.
DpoStepStats dpo_accumulate(CausalLM& model, const Batch& batch, const std::vector<double>& ref, double beta,
                            double label_smoothing, double scale, uint64_t dropout_key = 0);

}  // namespace hyperion::train
