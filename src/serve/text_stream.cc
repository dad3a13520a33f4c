#include "serve/text_stream.h"

#include <algorithm>

namespace hyperion::serve {

namespace {

const std::string kReplacement = "\xEF\xBF\xBD";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

TextStream::TextStream(const text::Tokenizer* tokenizer, const std::vector<int32_t>& context,
                       std::vector<std::string> stop, bool keep_special)
    : tok_(tokenizer), stop_(std::move(stop)), keep_special_(keep_special) {
  stop_.erase(std::remove(stop_.begin(), stop_.end(), std::string()), stop_.end());
  if (tok_ == nullptr) return;
  const size_t look = std::min<size_t>(context.size(), 64);
  for (size_t k = 1; k <= look; ++k) {
    const int32_t t = context[context.size() - k];
    if (can_anchor(t)) {
      window_.push_back(t);
      anchored_ = true;
      anchor_text_ = tok_->decode(window_);
      break;
    }
  }
}

bool TextStream::can_anchor(int32_t token) const {
  return token >= 0 && token < tok_->vocab_size() && !tok_->is_special(token);
}

std::string TextStream::window_text() const {
  std::string full = tok_->decode(window_, !keep_special_);
  if (!anchored_) return full;
  if (full.compare(0, anchor_text_.size(), anchor_text_) == 0)
    return full.substr(anchor_text_.size());
  // The anchor merged with what follows (should not happen with SentencePiece): fall
  // back to decoding the tokens after it alone.
  return tok_->decode(std::vector<int32_t>(window_.begin() + 1, window_.end()), !keep_special_);
}

std::string TextStream::push(int32_t token, bool* stopped) {
  *stopped = false;
  if (tok_ == nullptr || stopped_) return {};
  window_.push_back(token);
  const std::string tail = window_text();
  std::string text = settled_ + tail;
  if (!ends_with(tail, kReplacement) && can_anchor(token)) {
    // Every character so far is whole: later tokens cannot change this text, so the
    // newest token becomes the anchor. (A special token stays in the window instead: it
    // decodes to nothing, and the token after it must not start a text of its own.)
    settled_ = text;
    window_.assign(1, token);
    anchored_ = true;
    anchor_text_ = tok_->decode(window_);
  }
  while (ends_with(text, kReplacement)) text.resize(text.size() - kReplacement.size());
  if (text.size() < released_.size() || text.compare(0, released_.size(), released_) != 0)
    return {};  // not yet consistent with what was sent (a character still forming)
  // A stop string anywhere after the text already released (it may straddle it).
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) {
    const size_t from = released_.size() >= s.size() ? released_.size() - s.size() + 1 : 0;
    const size_t at = text.find(s, from);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    *stopped = true;
    const size_t end = std::max(cut, released_.size());
    std::string out = text.substr(released_.size(), end - released_.size());
    released_ += out;
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& s : stop_) {
    for (size_t len = std::min(s.size() - 1, text.size()); len > hold; --len) {
      if (text.compare(text.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  const size_t end = std::max(text.size() - hold, released_.size());
  std::string out = text.substr(released_.size(), end - released_.size());
  released_ += out;
  return out;
}

std::string TextStream::flush() {
  if (tok_ == nullptr || stopped_) return {};
  const std::string text = settled_ + window_text();
  if (text.size() <= released_.size() || text.compare(0, released_.size(), released_) != 0)
    return {};
  std::string out = text.substr(released_.size());
  released_ += out;
  return out;
}

}  // namespace hyperion::serve
