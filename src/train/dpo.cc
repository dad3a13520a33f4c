#include "train/dpo.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "text/chat_masks.h"

namespace hyperion::train {

namespace {

using json = nlohmann::ordered_json;

// log sigmoid(x), without overflow for large |x|.
double log_sigmoid(double x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}

double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}

}  // namespace

DpoData read_dpo_jsonl(const std::string& path, const text::Tokenizer& tokenizer,
                       const text::ChatTemplate& chat_template, const SftReadOptions& options) {
  const text::ChatMasker masker(chat_template, tokenizer);
  DpoData data;
  data.path = path;
  for_each_jsonl_object(path, "dpo data", [&](const json& j, int64_t number) {
    if (!j.contains("prompt") || !j.contains("chosen") || !j.contains("rejected"))
      throw_usage_error("a line needs \"prompt\", \"chosen\" and \"rejected\"");
    const json prompt = chat_turns(j["prompt"], "user", "prompt");
    const json* tools = j.contains("tools") && !j["tools"].is_null() ? &j["tools"] : nullptr;
    auto side = [&](const char* field) {
      json messages = prompt;
      for (const json& m : chat_turns(j[field], "assistant", field)) messages.push_back(m);
      const text::ChatTokens ct = masker.tokenize(messages, tools, true, prompt.size());
      return SftExample{ct.tokens, ct.trained, number};
    };
    DpoPair pair{side("chosen"), side("rejected"), number};
    ++data.lines;
    bool truncated = false;
    const int64_t trained_c = fit_example(pair.chosen, options.max_tokens, &truncated);
    const int64_t trained_r = fit_example(pair.rejected, options.max_tokens, &truncated);
    data.truncated += truncated;
    if (trained_c == 0 || trained_r == 0) {
      ++data.dropped;
      return;
    }
    data.pairs.push_back(std::move(pair));
  });
  HYP_USAGE_CHECK(!data.pairs.empty(),
                  "dpo data {}: no pair to train on ({} read, {} with a completion without an assistant token "
                  "within the first {} tokens)",
                  path, data.lines, data.dropped, options.max_tokens);
  return data;
}

DpoTerms dpo_terms(double policy_chosen, double policy_rejected, double ref_chosen, double ref_rejected,
                   double beta, double label_smoothing) {
  DpoTerms t;
  t.reward_chosen = beta * (policy_chosen - ref_chosen);
  t.reward_rejected = beta * (policy_rejected - ref_rejected);
  const double d = t.reward_chosen - t.reward_rejected, eps = label_smoothing;
  t.loss = -(1 - eps) * log_sigmoid(d) - eps * log_sigmoid(-d);
  // dloss/dd = -(1 - eps) sigmoid(-d) + eps sigmoid(d); dd/dlogp_c = beta = -dd/dlogp_r.
  const double dd = -(1 - eps) * sigmoid(-d) + eps * sigmoid(d);
  t.dchosen = beta * dd;
  t.drejected = -beta * dd;
  return t;
}

DpoLoader::DpoLoader(std::shared_ptr<const DpoData> data, int64_t first, int64_t count, int64_t batch,
                     int64_t seq_len, uint64_t seed, bool shuffle, int32_t pad_id, int rank, int world)
    : SequenceBatcher(batch, 2 * seq_len, seed, shuffle, rank, world, "dpo loader"),
      data_(std::move(data)),
      first_(first),
      pad_id_(pad_id) {
  HYP_CHECK(first >= 0 && count >= 0 && first + count <= static_cast<int64_t>(data_->pairs.size()),
            "dpo loader: pairs [{}, {}) of {}", first, first + count, data_->pairs.size());
  HYP_USAGE_CHECK(count >= batch * world, "{} holds {} pairs, fewer than the batch * world = {} * {} = {} one step needs",
                  describe(), count, batch, world, batch * world);
  set_sequences(count);
}

std::string DpoLoader::describe() const {
  return fmt::format("dpo data '{}'", data_->path);
}

void DpoLoader::fill(int64_t sequence, int32_t* inputs, int32_t* targets, int32_t* /*positions*/) {
  if (last_.size() >= static_cast<size_t>(batch_)) last_.clear();
  last_.push_back(first_ + sequence);
  const DpoPair& p = data_->pairs[static_cast<size_t>(first_ + sequence)];
  const int64_t t = row_len();
  sft_row(p.chosen, t, pad_id_, inputs, targets);
  sft_row(p.rejected, t, pad_id_, inputs + t, targets + t);
}

double row_logprob(CausalLM& model, const int32_t* inputs, const int32_t* targets) {
  const CrossEntropyResult r = model.forward_loss(inputs, targets);
  return -r.loss * static_cast<double>(r.count);
}

DpoStepStats dpo_accumulate(CausalLM& model, const Batch& batch, const std::vector<double>& ref, double beta,
                            double label_smoothing, double scale, uint64_t dropout_key) {
  const int64_t t = batch.seq_len / 2, pairs = batch.rows;
  HYP_CHECK(batch.seq_len % 2 == 0 && static_cast<int64_t>(ref.size()) == 2 * pairs,
            "dpo: {} reference log-probabilities for {} pairs of rows of {} tokens", ref.size(), pairs, batch.seq_len);
  auto row_in = [&](int64_t r) { return batch.inputs.data() + r * t; };
  auto row_tg = [&](int64_t r) { return batch.targets.data() + r * t; };
  std::vector<double> logp(static_cast<size_t>(2 * pairs));
  std::vector<int64_t> count(logp.size());
  // With adapter dropout each row keeps one mask for its log-probability and its backward.
  auto row_key = [&](int64_t r) {
    model.set_lora_dropout_key(dropout_key == 0 ? 0 : hyperion::dropout_key(dropout_key, static_cast<uint64_t>(r)) | 1);
  };
  for (int64_t r = 0; r < 2 * pairs; ++r) {
    row_key(r);
    const CrossEntropyResult cr = model.forward_loss(row_in(r), row_tg(r));
    logp[static_cast<size_t>(r)] = -cr.loss * static_cast<double>(cr.count);
    count[static_cast<size_t>(r)] = cr.count;
  }
  DpoStepStats s;
  s.pairs = pairs;
  std::vector<double> dlogp(logp.size());
  for (int64_t i = 0; i < pairs; ++i) {
    const auto c = static_cast<size_t>(2 * i), r = c + 1;
    const DpoTerms d = dpo_terms(logp[c], logp[r], ref[c], ref[r], beta, label_smoothing);
    dlogp[c] = d.dchosen;
    dlogp[r] = d.drejected;
    s.loss += d.loss;
    s.rewards_chosen += d.reward_chosen;
    s.rewards_rejected += d.reward_rejected;
    s.accuracies += d.reward_chosen > d.reward_rejected ? 1.0 : 0.0;
    s.margins += d.reward_chosen - d.reward_rejected;
  }
  // logp = -count * mean cross-entropy: a row's backward with dloss = dlogp * -count.
  for (int64_t r = 0; r < 2 * pairs; ++r) {
    const auto k = static_cast<size_t>(r);
    if (count[k] == 0) continue;
    row_key(r);
    model.forward_backward(row_in(r), row_tg(r), static_cast<float>(scale * dlogp[k] * -double(count[k])));
  }
  model.set_lora_dropout_key(0);
  const double n = static_cast<double>(pairs);
  s.loss /= n;
  s.rewards_chosen /= n;
  s.rewards_rejected /= n;
  s.accuracies /= n;
  s.margins /= n;
  return s;
}

}  // namespace hyperion::train
