#include "train/sft_data.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "kernels/cross_entropy.h"
#include "text/chat_masks.h"

namespace hyperion::train {

using json = nlohmann::ordered_json;

void for_each_jsonl_object(const std::string& path, const char* what,
                           const std::function<void(const json&, int64_t)>& fn) {
  std::ifstream in(path);
  HYP_USAGE_CHECK(in.good(), "{} {}: cannot open the file", what, path);
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception& e) {
        throw_usage_error(fmt::format("not JSON ({})", e.what()));
      }
      if (!j.is_object()) throw_usage_error("a line must be a JSON object");
      fn(j, number);
    } catch (const UsageError& e) {
      throw_usage_error(fmt::format("{} {}:{}: {}", what, path, number, e.what()));
    }
  }
}

json chat_turns(const json& v, const char* role, const char* field) {
  if (v.is_string()) return json::array({json{{"role", role}, {"content", v}}});
  if (v.is_array()) return v;
  throw_usage_error(fmt::format("\"{}\" must be a string or a list of messages", field));
}

int64_t fit_example(SftExample& e, int64_t max_tokens, bool* truncated) {
  if (static_cast<int64_t>(e.tokens.size()) > max_tokens) {
    e.tokens.resize(static_cast<size_t>(max_tokens));
    e.trained.resize(static_cast<size_t>(max_tokens));
    *truncated = true;
  }
  // Targets are tokens 1..n-1: the first token is never predicted.
  int64_t trained = 0;
  for (size_t i = 1; i < e.trained.size(); ++i) trained += e.trained[i];
  return trained;
}

SftData read_sft_jsonl(const std::string& path, const text::Tokenizer& tokenizer,
                       const text::ChatTemplate& chat_template, const SftReadOptions& options) {
  const text::ChatMasker masker(chat_template, tokenizer);
  SftData data;
  data.path = path;
  for_each_jsonl_object(path, "sft data", [&](const json& j, int64_t number) {
    json messages = json::array();
    if (j.contains("messages")) {
      messages = j["messages"];
    } else if (j.contains("prompt") && j.contains("completion")) {
      messages = chat_turns(j["prompt"], "user", "prompt");
      for (const json& m : chat_turns(j["completion"], "assistant", "completion")) messages.push_back(m);
    } else {
      throw_usage_error("a line needs \"messages\", or \"prompt\" and \"completion\"");
    }
    const json* tools = j.contains("tools") && !j["tools"].is_null() ? &j["tools"] : nullptr;
    text::ChatTokens ct = masker.tokenize(messages, tools, options.assistant_only);
    ++data.lines;
    SftExample e{std::move(ct.tokens), std::move(ct.trained), number};
    bool truncated = false;
    const int64_t trained = fit_example(e, options.max_tokens, &truncated);
    data.truncated += truncated;
    if (trained == 0) {
      ++data.dropped;
      return;
    }
    data.trained_tokens += trained;
    data.examples.push_back(std::move(e));
  });
  HYP_USAGE_CHECK(!data.examples.empty(),
                  "sft data {}: no conversation to train on ({} read, {} without an assistant token within the "
                  "first {} tokens)",
                  path, data.lines, data.dropped, options.max_tokens);
  return data;
}

SftLoader::SftLoader(std::shared_ptr<const SftData> data, int64_t first, int64_t count, int64_t batch,
                     int64_t seq_len, uint64_t seed, bool shuffle, int32_t pad_id, int rank, int world, bool packing)
    : SequenceBatcher(batch, seq_len, seed, shuffle, rank, world, "sft loader"),
      data_(std::move(data)),
      first_(first),
      count_(count),
      pad_id_(pad_id),
      packing_(packing) {
  HYP_CHECK(first >= 0 && count >= 0 && first + count <= static_cast<int64_t>(data_->examples.size()),
            "sft loader: examples [{}, {}) of {}", first, first + count, data_->examples.size());
  int64_t sequences = count;
  if (packing_) {
    // First fit in file order: a new row when the next conversation does not fit.
    int64_t used = seq_len;  // forces a row for the first conversation
    for (int64_t i = 0; i < count; ++i) {
      const int64_t len =
          std::min<int64_t>(static_cast<int64_t>(data_->examples[static_cast<size_t>(first + i)].tokens.size()), seq_len);
      if (used + len > seq_len) {
        row_start_.push_back(i);
        used = 0;
      }
      used += len;
    }
    row_start_.push_back(count);
    sequences = static_cast<int64_t>(row_start_.size()) - 1;
  }
  HYP_USAGE_CHECK(sequences >= batch * world,
                  "{} holds {} conversations{}, fewer than the batch * world = {} * {} = {} one step needs",
                  describe(), count, packing_ ? fmt::format(" in {} packed sequences", sequences) : "", batch,
                  world, batch * world);
  set_sequences(sequences);
}

void sft_row(const SftExample& e, int64_t seq_len, int32_t pad_id, int32_t* inputs, int32_t* targets) {
  const auto n = static_cast<int64_t>(e.tokens.size());
  for (int64_t j = 0; j < seq_len; ++j) {
    inputs[j] = j < n ? e.tokens[static_cast<size_t>(j)] : pad_id;
    targets[j] = j + 1 < n && e.trained[static_cast<size_t>(j + 1)] ? e.tokens[static_cast<size_t>(j + 1)] : kIgnoreIndex;
  }
}

double SftLoader::conversations_per_sequence() const {
  return packing_ ? double(count_) / double(sequences_per_epoch()) : 1.0;
}

std::string SftLoader::describe() const {
  return fmt::format("sft data '{}'", data_->path);
}

int64_t SftLoader::put(const SftExample& e, int32_t* inputs, int32_t* targets, int32_t* positions,
                       int64_t room) const {
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(e.tokens.size()), room);
  for (int64_t j = 0; j < n; ++j) {
    inputs[j] = e.tokens[static_cast<size_t>(j)];
    // The conversation's last token here has no target: the next one is another's.
    targets[j] = j + 1 < n && e.trained[static_cast<size_t>(j + 1)] ? e.tokens[static_cast<size_t>(j + 1)] : kIgnoreIndex;
    positions[j] = static_cast<int32_t>(j);
  }
  return n;
}

void SftLoader::fill(int64_t sequence, int32_t* inputs, int32_t* targets, int32_t* positions) {
  const int64_t T = seq_len_;
  if (!packing_) {
    sft_row(data_->examples[static_cast<size_t>(first_ + sequence)], T, pad_id_, inputs, targets);
    return;
  }
  int64_t at = 0;
  {
    for (int64_t i = row_start_[static_cast<size_t>(sequence)]; i < row_start_[static_cast<size_t>(sequence) + 1]; ++i)
      at += put(data_->examples[static_cast<size_t>(first_ + i)], inputs + at, targets + at, positions + at, T - at);
  }
  // The tail: padding, with ignored targets (a document of its own).
  for (int64_t j = at; j < T; ++j) {
    inputs[j] = pad_id_;
    targets[j] = kIgnoreIndex;
    positions[j] = static_cast<int32_t>(j - at);
  }
}

}  // namespace hyperion::train
