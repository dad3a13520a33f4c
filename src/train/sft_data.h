// Supervised fine-tuning data (`use_sft`): a JSONL file of conversations, each rendered
// with the model's chat template and tokenized with the assistant tokens marked
// (text/chat_masks.h), and the loader that hands them out one conversation per sequence.
//
// A line is either
//   {"messages": [{"role": ..., "content": ...}, ...], "tools": [...]?}   (chat format)
//   {"prompt": P, "completion": C}   P, C strings (a user turn and the assistant's answer)
//                                     or lists of messages (TRL's conversational form)
// Blank lines are skipped. Each conversation keeps at most max_target_length + 1 tokens
// (the inputs and their next-token targets); one left with no trained token inside that
// window is dropped and counted, never trained on as an empty row.
//
// Unpacked, each sequence is one conversation, padded with `pad_id` inputs whose targets,
// like every untrained token's, are the ignore index (the loss is the mean over the
// trained tokens). Packed (`packing`), conversations of at most seq_len tokens fill each
// sequence in file order (a new sequence when the next does not fit), each with its own
// positions from 0 and attending to itself only (model/decoder.h's packed rows); the last
// token of one has no target (the next conversation's first token is not its
// continuation), and the row's tail is padding with ignored targets.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/sequence_batcher.h"

namespace hyperion::train {

struct SftExample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;  // per token: 1 when the loss covers it as a target
  int64_t line = 0;              // 1-based line of the file
};

struct SftData {
  std::string path;
  std::vector<SftExample> examples;
  int64_t lines = 0;      // conversations read
  int64_t truncated = 0;  // conversations cut to max_tokens
  int64_t dropped = 0;    // conversations without a trained token within max_tokens
  int64_t trained_tokens = 0;
};

struct SftReadOptions {
  int64_t max_tokens = 2049;    // max_target_length + 1
  bool assistant_only = true;   // false: every token of the conversation trains
};

// The pieces the SFT and DPO readers share:
// each non-blank line of a JSONL file parsed as a JSON object and handed to `fn` with its
// 1-based number; a UsageError from `fn`, or a line that is not a JSON object, is
// rethrown as "WHAT PATH:LINE: message" (WHAT: "sft data", "dpo data").
void for_each_jsonl_object(const std::string& path, const char* what,
                           const std::function<void(const nlohmann::ordered_json&, int64_t)>& fn);
// A prompt or completion field: a string becomes one message of `role`, a list of
// messages is taken as is (else a UsageError naming `field`).
nlohmann::ordered_json chat_turns(const nlohmann::ordered_json& v, const char* role, const char* field);
// Cuts e to max_tokens (setting *truncated when it was cut) and returns how many of its
// targets (tokens 1..) are trained.
int64_t fit_example(SftExample& e, int64_t max_tokens, bool* truncated);

// Reads and tokenizes the file. Throws hyperion::UsageError naming "path:line" and what is
// wrong with the line (not JSON, neither form, a role the template refuses, no assistant
// turn), or the file when no conversation is left to train on.
SftData read_sft_jsonl(const std::string& path, const text::Tokenizer& tokenizer,
                       const text::ChatTemplate& chat_template, const SftReadOptions& options);

// One conversation as an unpacked row: seq_len inputs (its tokens, then pad_id) and their
// targets (the next token where it is trained, else the ignore index).
void sft_row(const SftExample& e, int64_t seq_len, int32_t pad_id, int32_t* inputs, int32_t* targets);

// One conversation per sequence, in the shared epoch order (train/sequence_batcher.h).
class SftLoader final : public SequenceBatcher {
 public:
  // examples[first, first + count) of `data`; throws naming the file when they are fewer
  // than batch * world.
  // Packed: the sequences are the packed rows, at least batch * world of them.
  SftLoader(std::shared_ptr<const SftData> data, int64_t first, int64_t count, int64_t batch,
            int64_t seq_len, uint64_t seed, bool shuffle, int32_t pad_id, int rank = 0, int world = 1,
            bool packing = false);
  bool packs() const override { return packing_; }
  // Packed: conversations per row, on average (1 unpacked).
  double conversations_per_sequence() const;

 private:
  void fill(int64_t sequence, int32_t* inputs, int32_t* targets, int32_t* positions) override;
  std::string describe() const override;
  // Packed: one conversation's tokens into a row (at most `room` of them); returns how
  // many.
  int64_t put(const SftExample& e, int32_t* inputs, int32_t* targets, int32_t* positions, int64_t room) const;
  std::shared_ptr<const SftData> data_;
  int64_t first_, count_;
  int32_t pad_id_;
  bool packing_;
  std::vector<int64_t> row_start_;  // packed: row r holds examples [row_start_[r], row_start_[r + 1])
};

}  // namespace hyperion::train
