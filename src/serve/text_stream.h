// Incremental detokenisation for streaming, with stop strings.
//
// The text of the generated tokens is decoded as a continuation of an anchor token
// (decode([anchor, out...]) minus decode([anchor])), so a leading space that
// SentencePiece would strip at the start of a text is kept. The anchor starts as the
// prompt's last token that is not a special one (decode leaves those out: after
// "[/INST]" a word would start a text of its own and lose the space it has in the whole
// decoded sequence), or none for a prompt of special tokens only (the output starts the
// text), and moves up to the newest such token whenever the text decoded so far ends on
// a whole character, so each token costs a decode of a few tokens, not of the whole
// output (which made a 128-token stream cost 8,000 token decodes, serially in the
// engine's step). Text is released only when it is final:
//   - a trailing U+FFFD (a multi-byte character split over byte-fallback tokens) waits
//     for the next token;
//   - a suffix that could be the start of a stop string waits until it cannot be;
//   - when a stop string appears, the text before it is released and the stream stops
//     (the stop string itself is never sent, as in the OpenAI API).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace hyperion::serve {

class TextStream {
 public:
  // `tokenizer` may be null: no text, no stop strings (token ids only). `context`: the
  // prompt (its last 64 tokens are looked at for an anchor). `keep_special`: special
  // tokens in the output are text too (tool-call markers); the prompt's are never.
  TextStream(const text::Tokenizer* tokenizer, const std::vector<int32_t>& context,
             std::vector<std::string> stop, bool keep_special = false);

  // Adds a generated token; returns the text it makes final. Sets *stopped when a stop
  // string matched (the returned text ends right before it).
  std::string push(int32_t token, bool* stopped);
  // At the end of the stream: whatever is still held back (an incomplete character or a
  // partial stop string that never completed).
  std::string flush();
  // Everything released so far.
  const std::string& text() const { return released_; }

 private:
  // The text of the tokens after the anchor.
  std::string window_text() const;
  // Whether `token` may be the anchor: any token but a special one, which decode leaves out.
  bool can_anchor(int32_t token) const;

  const text::Tokenizer* tok_;
  std::vector<int32_t> window_;  // the anchor token (if any), then the tokens not yet settled
  bool anchored_ = false;        // window_[0] is an anchor
  std::string anchor_text_;      // decode({anchor}); empty without one
  std::string settled_;          // the text of every generated token up to the anchor
  std::vector<std::string> stop_;
  std::string released_;
  bool stopped_ = false;
  bool keep_special_ = false;
};

}  // namespace hyperion::serve
