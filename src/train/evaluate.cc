#include "train/evaluate.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "base/timer.h"
#include "io/token_shard.h"
#include "kernels/cross_entropy.h"
#include "model/forward_model.h"
#include "text/text_input.h"

namespace hyperion {

namespace {

// The mean loss over every scored token of the passes added.
struct LossSum {
  double sum = 0;
  int64_t count = 0;
  void add(const CrossEntropyResult& r) {
    sum += r.loss * double(r.count);
    count += r.count;
  }
  EvalReport report(const Timer& timer) const {
    EvalReport rep;
    rep.tokens = count;
    rep.loss = count > 0 ? sum / double(count) : 0.0;
    rep.perplexity = std::exp(rep.loss);
    rep.seconds = timer.seconds();
    return rep;
  }
};

}  // namespace

EvalReport evaluate_stream(const ParamStore& params, const std::vector<int32_t>& tokens,
                           int64_t seq_len, int64_t batch) {
  Timer timer;
  HYP_CHECK(tokens.size() >= 2, "eval: need at least 2 tokens, got {}", tokens.size());
  HYP_CHECK(seq_len > 0 && batch > 0, "eval: seq_len ({}) and batch ({}) must be > 0", seq_len,
            batch);
  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t windows = (total - 1 + seq_len - 1) / seq_len;
  batch = std::min(batch, windows);
  ForwardModel model(params, batch, seq_len);
  const int64_t n = batch * seq_len;
  std::vector<int32_t> in(static_cast<size_t>(n)), tg(static_cast<size_t>(n));
  LossSum loss;
  for (int64_t w0 = 0; w0 < windows; w0 += batch) {
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t start = (w0 + b) * seq_len;
      for (int64_t i = 0; i < seq_len; ++i) {
        const int64_t p = start + i;
        const bool valid = w0 + b < windows && p + 1 < total;
        in[static_cast<size_t>(b * seq_len + i)] = valid ? tokens[static_cast<size_t>(p)] : 0;
        tg[static_cast<size_t>(b * seq_len + i)] =
            valid ? tokens[static_cast<size_t>(p + 1)] : kIgnoreIndex;
      }
    }
    loss.add(model.loss(in.data(), tg.data()));
  }
  return loss.report(timer);
}

EvalReport evaluate_llama_perplexity(const ParamStore& params, const text::Tokenizer& tokenizer,
                                     const std::string& text, int64_t chunk) {
  Timer timer;
  HYP_CHECK(chunk >= 4, "eval: a llama-perplexity chunk must be >= 4 tokens, got {}", chunk);
  const std::vector<int32_t> tokens = tokenizer.encode_with_special_tokens(text);
  const int64_t chunks = static_cast<int64_t>(tokens.size()) / chunk;
  HYP_CHECK(chunks >= 2, "eval: the text has {} tokens; llama-perplexity needs at least 2 chunks of {}",
            tokens.size(), chunk);
  const int64_t batch = std::min<int64_t>(chunks, 4), seq = chunk - 1;
  ForwardModel model(params, batch, seq);
  std::vector<int32_t> in(static_cast<size_t>(batch * seq)), tg(static_cast<size_t>(batch * seq));
  LossSum loss;
  for (int64_t c0 = 0; c0 < chunks; c0 += batch) {
    for (int64_t b = 0; b < batch; ++b) {
      const bool valid = c0 + b < chunks;
      const int32_t* t = tokens.data() + (c0 + b) * chunk;
      for (int64_t j = 0; j < seq; ++j) {
        const size_t at = static_cast<size_t>(b * seq + j);
        // The chunk's first token is BOS (where the tokenizer has one), as llama-perplexity
        // puts it; positions from chunk / 2 on are scored.
        in[at] = !valid ? 0 : j == 0 && tokenizer.bos_id() >= 0 ? tokenizer.bos_id() : t[j];
        tg[at] = valid && j >= chunk / 2 ? t[j + 1] : kIgnoreIndex;
      }
    }
    loss.add(model.loss(in.data(), tg.data()));
  }
  return loss.report(timer);
}

std::vector<int32_t> tokenize_file(const text::Tokenizer& tokenizer, const std::string& path) {
  std::vector<int32_t> out;
  for (const std::string& doc : text::read_documents(path)) {
    // Framed as data prepare frames documents: BOS when the tokenizer has one (Qwen's has
    // none), EOS when it has one.
    if (tokenizer.bos_id() >= 0) out.push_back(tokenizer.bos_id());
    std::vector<int32_t> ids = tokenizer.encode(doc);
    out.insert(out.end(), ids.begin(), ids.end());
    if (tokenizer.eos_id() >= 0) out.push_back(tokenizer.eos_id());
  }
  HYP_CHECK(out.size() >= 2, "{}: no text to evaluate", path);
  return out;
}

std::vector<int32_t> read_shard_tokens(const std::string& path, int64_t vocab_size) {
  io::TokenShard shard = io::TokenShard::open(path);
  HYP_CHECK(shard.vocab_size() <= vocab_size,
            "{}: shard vocabulary ({}) is larger than the model's ({})", path, shard.vocab_size(),
            vocab_size);
  std::vector<int32_t> out(static_cast<size_t>(shard.size()));
  if (!out.empty()) shard.read(0, shard.size(), out.data());
  return out;
}

}  // namespace hyperion
