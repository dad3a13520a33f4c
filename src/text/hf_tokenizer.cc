#include "text/hf_tokenizer.h"

#include <algorithm>
#include <cstdint>

#include "base/error.h"
#include "base/utf8.h"
#include "text/hf_tokenizer_impl.h"

namespace hyperion::text {

namespace {

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes one U+FFFD.
std::string utf8_lossy(std::string_view s) {
  size_t bad = utf8_invalid_at(s);
  if (bad == std::string_view::npos) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  const auto* u = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (bad != std::string_view::npos) {
    out.append(s.substr(i, bad - i));
    // The maximal prefix of a well-formed sequence starting at `bad` (Unicode §3.9 D93b).
    size_t j = bad + 1;
    const unsigned char c = u[bad];
    size_t need = c >= 0xC2 && c <= 0xDF   ? 1
                  : c >= 0xE0 && c <= 0xEF ? 2
                  : c >= 0xF0 && c <= 0xF4 ? 3
                                           : 0;
    for (size_t k = 0; k < need && j < s.size(); ++k, ++j) {
      const unsigned char d = u[j];
      unsigned char lo = 0x80, hi = 0xBF;
      if (k == 0) {
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
      }
      if (d < lo || d > hi) break;
    }
    out += "\xEF\xBF\xBD";
    i = j;
    const size_t next = utf8_invalid_at(s.substr(i));
    bad = next == std::string_view::npos ? next : i + next;
  }
  out.append(s.substr(i));
  return out;
}

// "<0xAB>" -> 0xAB; -1 for anything else.
int byte_token_value(std::string_view t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                  : -1;
  };
  const int h = hex(t[3]), l = hex(t[4]);
  return h < 0 || l < 0 ? -1 : h * 16 + l;
}

// The most a text of n bytes may become through the normalizers or a decoder at run time
// (hf_text_ops.h, TextGrowth): what the load-time bound allows for any real tokenizer,
// and a hostile text still cannot make gigabytes of one request.
size_t run_limit(size_t n) {
  return kRunTextGrowth * n + static_cast<size_t>(kMaxTextExtra);
}

// The token texts of one decode, end to end in one buffer, with where each ends: 4 bytes a
// token beside its text. With a std::string per token (32 bytes, and a heap block for any
// longer than 15), `tokenize --json` of a 50 MB text (15 million tokens) peaked at 1.17 GB;
// it peaks at 0.40 GB now, as the encode alone does.
struct TokenTexts {
  std::string bytes;
  std::vector<uint32_t> ends;

  size_t size() const { return ends.size(); }
  std::string_view operator[](size_t i) const {
    const size_t b = i == 0 ? 0 : ends[i - 1];
    return std::string_view(bytes).substr(b, ends[i] - b);
  }
  void push(std::string_view t) {
    bytes.append(t);
    end_token();
  }
  // Ends the token at the buffer's end (after text appended to `bytes` directly).
  void end_token() {
    HYP_CHECK(bytes.size() <= UINT32_MAX,
              "decode: the text of these ids passes 4 GiB; decode them in parts");
    ends.push_back(static_cast<uint32_t>(bytes.size()));
  }
  void clear() {
    bytes.clear();
    ends.clear();
  }
};

// One decoder of the chain, from `in` into `out` (empty on entry).
void run_decoder(const DecoderOp& op, const TokenTexts& in, TokenTexts& out) {
  using K = DecoderOp::Kind;
  std::string scratch;
  switch (op.kind) {
    case K::kByteLevel: {  // one token: the bytes, repaired where they are not UTF-8
      std::string& all = out.bytes;
      std::string raw;
      all.reserve(in.bytes.size());
      for (size_t i = 0; i < in.size(); ++i) {
        const std::string_view t = in[i];
        if (byte_level_decode(t, &raw))
          all += raw;
        else
          all += t;
      }
      if (utf8_invalid_at(all) != std::string_view::npos) all = utf8_lossy(all);
      out.end_token();
      break;
    }
    case K::kMetaspace:
      // As the `tokenizers` library: in the first token every replacement character is
      // dropped (when a prefix is prepended at encode), elsewhere each becomes a space.
      for (size_t i = 0; i < in.size(); ++i) {
        scratch.assign(in[i]);
        replace_all(scratch, op.replacement, i == 0 && op.metaspace_strip_first ? "" : " ");
        out.push(scratch);
      }
      break;
    case K::kReplace:
      for (size_t i = 0; i < in.size(); ++i) {
        scratch.assign(in[i]);
        replace_all(scratch, op.pattern, op.content, op.regex.get(), run_limit(scratch.size()));
        out.push(scratch);
      }
      break;
    case K::kByteFallback: {
      std::string bytes;
      size_t byte_count = 0;
      auto flush = [&]() {
        if (byte_count == 0) return;
        if (utf8_invalid_at(bytes) == std::string_view::npos) {
          out.push(bytes);
        } else {
          for (size_t k = 0; k < byte_count; ++k) out.push("\xEF\xBF\xBD");
        }
        bytes.clear(), byte_count = 0;
      };
      for (size_t i = 0; i < in.size(); ++i) {
        const std::string_view t = in[i];
        const int b = byte_token_value(t);
        if (b >= 0) {
          bytes += static_cast<char>(b), ++byte_count;
        } else {
          flush();
          out.push(t);
        }
      }
      flush();
      break;
    }
    case K::kFuse:
      out.push(in.bytes);
      break;
    case K::kStrip:
      for (size_t i = 0; i < in.size(); ++i) {
        const std::string_view t = in[i];
        const std::string& c = op.content;
        size_t b = 0, e = t.size();
        for (size_t k = 0; k < op.strip_start && t.compare(b, c.size(), c) == 0 && b < e; ++k)
          b += c.size();
        for (size_t k = 0;
             k < op.strip_stop && e >= b + c.size() && t.compare(e - c.size(), c.size(), c) == 0;
             ++k)
          e -= c.size();
        out.push(t.substr(b, e - b));
      }
      break;
  }
}

}  // namespace

void AddedTokenMatcher::add(Token t) {
  if (t.content.empty()) return;
  int32_t node = 0;
  for (unsigned char c : t.content) {
    int32_t next = child(node, c);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      auto& ch = nodes_[node].children;
      ch.insert(std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, int32_t{-1})), {c, next});
      nodes_.emplace_back();
    }
    node = next;
  }
  first_byte_[static_cast<unsigned char>(t.content[0])] = true;
  if (nodes_[node].token < 0) {
    nodes_[node].token = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(std::move(t));
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
  const auto& ch = nodes_[node].children;
  auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(byte, int32_t{-1}));
  return it != ch.end() && it->first == byte ? it->second : -1;
}

bool AddedTokenMatcher::find(std::string_view text, size_t from, size_t* begin, size_t* end,
                             int32_t* id) const {
  if (tokens_.empty()) return false;
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) continue;
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      node = child(node, static_cast<uint8_t>(text[j]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) best = nodes_[node].token, best_end = j + 1;
    }
    if (best < 0) continue;
    const Token& t = tokens_[best];
    size_t b = i, e = best_end;
    if (t.lstrip)
      while (b > from && is_ascii_space(text[b - 1])) --b;
    if (t.rstrip)
      while (e < text.size() && is_ascii_space(text[e])) ++e;
    *begin = b, *end = e, *id = t.id;
    return true;
  }
  return false;
}

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

std::unique_ptr<HfTokenizer> HfTokenizer::parse(const HfTokenizerSource& src) {
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  parse_hf_tokenizer(src, m);
  std::unique_ptr<HfTokenizer> tok(new HfTokenizer(std::move(impl)));
  parse_hf_tokenizer_config(src, m, *tok);
  return tok;
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text) const {
  const Impl& m = *impl_;
  const size_t bad = utf8_invalid_at(text);
  HYP_CHECK(bad == std::string_view::npos,
            "tokenizer '{}': the text is not valid UTF-8 (byte offset {})", m.origin, bad);
  std::vector<int32_t> ids;
  // Room for the most ids a text can have without a copy as it grows: each id is at least
  // a byte of text (an added token, several). Only the pages the ids fill are committed.
  ids.reserve(text.size() + 16);
  auto encode_word = [&](std::string_view word) { m.model->encode_word(word, ids); };
  auto encode_words = [&](std::string_view segment, bool at_start) {
    pre_tokenize(m.pre_tokenizers, segment, at_start, encode_word);
  };
  // A stretch between raw added tokens: normalized, then split on normalized added tokens.
  auto encode_segment = [&](std::string_view raw, bool at_start) {
    if (raw.empty()) return;
    const std::string norm = normalize(m.normalizers, std::string(raw), run_limit(raw.size()));
    size_t pos = 0, b = 0, e = 0;
    int32_t id = -1;
    while (m.normalized_added.find(norm, pos, &b, &e, &id)) {
      encode_words(std::string_view(norm).substr(pos, b - pos), at_start && pos == 0);
      ids.push_back(id);
      pos = e;
    }
    encode_words(std::string_view(norm).substr(pos), at_start && pos == 0);
  };
  size_t pos = 0, b = 0, e = 0;
  int32_t id = -1;
  while (m.raw_added.find(text, pos, &b, &e, &id)) {
    encode_segment(text.substr(pos, b - pos), pos == 0);
    ids.push_back(id);
    pos = e;
  }
  encode_segment(text.substr(pos), pos == 0);
  return ids;
}

std::vector<int32_t> HfTokenizer::encode_with_special_tokens(std::string_view text) const {
  std::vector<int32_t> body = encode(text);
  std::vector<int32_t> ids = impl_->post.before;
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), impl_->post.after.begin(), impl_->post.after.end());
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  TokenTexts toks, next;
  toks.ends.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    HYP_CHECK(id >= 0, "tokenizer '{}': decode: id {} at position {} is negative", m.origin, id, i);
    // A model's padded embedding rows past the tokenizer (Qwen: 151,936 rows for 151,665
    // tokens) can be sampled: they decode to nothing, as Hugging Face's decode skips them.
    if (id >= m.vocab_size) continue;
    if (skip_special_tokens && m.special[id]) continue;
    toks.push(m.pieces[id]);
  }
  for (const DecoderOp& op : m.decoders) {
    next.clear();
    run_decoder(op, toks, next);
    std::swap(toks, next);
  }
  next = TokenTexts();  // given back before the text is checked (and copied if not UTF-8)
  // Without a decoder Hugging Face joins the tokens with spaces.
  if (m.decoders.empty() && toks.size() > 1) {
    std::string text;
    text.reserve(toks.bytes.size() + toks.size());
    for (size_t i = 0; i < toks.size(); ++i) text.append(i ? " " : "").append(toks[i]);
    toks.bytes = std::move(text);
  }
  toks.ends = {};
  if (utf8_invalid_at(toks.bytes) == std::string_view::npos) return std::move(toks.bytes);
  return utf8_lossy(toks.bytes);
}

std::vector<std::string> HfTokenizer::token_bytes() const {
  const Impl& m = *impl_;
  std::vector<std::string> out(static_cast<size_t>(m.vocab_size));
  std::string raw;
  for (int32_t id = 0; id < m.vocab_size; ++id) {
    if (m.special[id]) continue;
    std::string t = m.pieces[id];
    // The decoder chain on one token in mid-text: no UTF-8 repair (a byte-level token may
    // be part of a character), no Strip, every word-start mark a space.
    for (const DecoderOp& op : m.decoders) {
      using K = DecoderOp::Kind;
      switch (op.kind) {
        case K::kByteLevel:
          if (byte_level_decode(t, &raw)) t = raw;
          break;
        case K::kMetaspace:
          replace_all(t, op.replacement, " ");
          break;
        case K::kReplace:
          replace_all(t, op.pattern, op.content, op.regex.get(), run_limit(t.size()));
          break;
        case K::kByteFallback:
          if (const int b = byte_token_value(t); b >= 0) t = std::string(1, static_cast<char>(b));
          break;
        case K::kFuse:
        case K::kStrip:
          break;
      }
    }
    out[id] = std::move(t);
  }
  return out;
}

std::string HfTokenizer::piece(int32_t id) const {
  HYP_CHECK(id >= 0 && id < impl_->vocab_size,
            "tokenizer '{}': id {} is outside the vocabulary [0, {})", impl_->origin, id,
            impl_->vocab_size);
  return impl_->pieces[id];
}

int32_t HfTokenizer::token_id(std::string_view token) const {
  auto it = impl_->added_ids.find(token);
  if (it != impl_->added_ids.end()) return it->second;
  if (!impl_->model) return -1;
  if (impl_->model->spec().byte_level) {
    std::string raw;
    return byte_level_decode(token, &raw) ? impl_->model->find(raw) : -1;
  }
  return impl_->model->find(token);
}

bool HfTokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[id];
}
int32_t HfTokenizer::vocab_size() const {
  return impl_->vocab_size;
}
size_t HfTokenizer::max_piece_bytes() const {
  return impl_->max_piece_bytes;
}
int32_t HfTokenizer::bos_id() const {
  return impl_->bos;
}
int32_t HfTokenizer::eos_id() const {
  return impl_->eos;
}
int32_t HfTokenizer::pad_id() const {
  return impl_->pad;
}
int32_t HfTokenizer::unk_id() const {
  return impl_->unk;
}
const std::vector<int32_t>& HfTokenizer::end_ids() const {
  return impl_->end_ids;
}
const std::string& HfTokenizer::chat_template() const {
  return impl_->chat_template;
}
const std::string& HfTokenizer::bos_token() const {
  return impl_->bos_token;
}
const std::string& HfTokenizer::eos_token() const {
  return impl_->eos_token;
}
bool HfTokenizer::adds_bos() const {
  return !impl_->post.before.empty() && impl_->post.before.front() == impl_->bos;
}

}  // namespace hyperion::text
