#include "text/clip_tokenizer.h"

#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include <filesystem>

#include "base/error.h"
#include "base/utf8.h"
#include "io/atomic_file.h"
#include "text/bpe_model.h"
#include "text/hf_text_ops.h"

namespace hyperion::text {
namespace {

const char* kPattern =
    "(?i)<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|"
    "[^\\s\\p{L}\\p{N}]+";

// The few HTML entities prompts carry (Python's html.unescape knows all of HTML5's; a
// prompt with another keeps it verbatim).
std::string unescape_html(std::string s) {
  static const std::pair<const char*, const char*> kEntities[] = {
      {"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&#39;", "'"}, {"&#x27;", "'"},
      {"&nbsp;", "\xC2\xA0"}};
  for (int pass = 0; pass < 2; ++pass)  // CLIP unescapes twice
    for (auto [from, to] : kEntities) replace_all(s, from, to);
  return s;
}

bool is_space(uint32_t cp) {
  return utf8proc_category(utf8proc_int32_t(cp)) == UTF8PROC_CATEGORY_ZS || cp == '\t' ||
         cp == '\n' || cp == '\r' || cp == '\v' || cp == '\f' || cp == 0x1C || cp == 0x1D ||
         cp == 0x1E || cp == 0x1F || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

// Whitespace runs -> one space, trimmed, lowercased (Python's str.lower per code point).
std::string clean_and_lower(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool pending_space = false;
  for (utf8proc_ssize_t i = 0; i < utf8proc_ssize_t(text.size());) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(
        reinterpret_cast<const utf8proc_uint8_t*>(text.data()) + i, utf8proc_ssize_t(text.size()) - i, &cp);
    i += n > 0 ? n : 1;
    if (is_space(uint32_t(cp))) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    utf8proc_uint8_t buf[4];
    const utf8proc_ssize_t m = utf8proc_encode_char(utf8proc_tolower(cp), buf);
    out.append(reinterpret_cast<const char*>(buf), size_t(m));
  }
  return out;
}

}  // namespace

ClipTokenizer ClipTokenizer::load(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string vocab = (fs::path(dir) / "vocab.json").string();
  const std::string merges = (fs::path(dir) / "merges.txt").string();
  HYP_CHECK(fs::exists(vocab), "{}: a CLIP tokenizer needs vocab.json (not found)", dir);
  HYP_CHECK(fs::exists(merges), "{}: a CLIP tokenizer needs merges.txt (not found)", dir);
  std::string pad;
  int64_t max_length = 77;
  for (const char* name : {"special_tokens_map.json", "tokenizer_config.json"}) {
    const std::string path = (fs::path(dir) / name).string();
    if (!fs::exists(path)) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(io::read_file(path, 64 << 20));
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON ({})", path, e.what());
    }
    if (!j.is_object()) continue;
    if (j.contains("pad_token") && pad.empty()) {
      const auto& p = j["pad_token"];
      if (p.is_string()) pad = p.get<std::string>();
      else if (p.is_object() && p.contains("content") && p["content"].is_string())
        pad = p["content"].get<std::string>();
    }
    if (j.contains("model_max_length") && j["model_max_length"].is_number_integer()) {
      const int64_t m = j["model_max_length"].get<int64_t>();
      if (m >= 2 && m <= 4096) max_length = m;  // absurd values (1e30) mean "unset"
    }
  }
  return from_files(io::read_file(vocab, 256 << 20), io::read_file(merges, 256 << 20), dir, pad,
                    max_length);
}

ClipTokenizer ClipTokenizer::from_files(const std::string& vocab_json, const std::string& merges_txt,
                                        const std::string& origin, const std::string& pad_token,
                                        int64_t max_length) {
  ClipTokenizer t;
  t.origin_ = origin;
  t.max_length_ = max_length;
  HYP_CHECK(max_length >= 2, "{}: max_length {} leaves no room for the start and end tokens", origin,
            max_length);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(vocab_json);
  } catch (const nlohmann::json::exception& e) {
    fail("{}/vocab.json: not valid JSON ({})", origin, e.what());
  }
  HYP_CHECK(j.is_object() && !j.empty(), "{}/vocab.json: must be an object of token -> id", origin);
  HYP_CHECK(j.size() <= (size_t(1) << 22), "{}/vocab.json: {} tokens is more than allowed", origin,
            j.size());
  t.pieces_.assign(j.size(), std::string());
  for (auto it = j.begin(); it != j.end(); ++it) {
    HYP_CHECK(it.value().is_number_integer(), "{}/vocab.json: token {} has a non-integer id {}", origin,
              it.key(), it.value().dump());
    const int64_t id = it.value().get<int64_t>();
    HYP_CHECK(id >= 0 && id < int64_t(j.size()), "{}/vocab.json: token {} has id {} outside [0, {})",
              origin, it.key(), id, j.size());
    HYP_CHECK(t.pieces_[size_t(id)].empty(), "{}/vocab.json: id {} is given twice", origin, id);
    t.pieces_[size_t(id)] = it.key();
    t.vocab_.emplace(it.key(), int32_t(id));
  }
  // merges.txt: a "#version" header, then "left right" per line, in rank order.
  int32_t rank = 0;
  size_t line_no = 0;
  for (size_t pos = 0; pos < merges_txt.size();) {
    size_t end = merges_txt.find('\n', pos);
    if (end == std::string::npos) end = merges_txt.size();
    std::string line = merges_txt.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    HYP_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() &&
                  line.find(' ', sp + 1) == std::string::npos,
              "{}/merges.txt: line {} is not two symbols separated by one space: '{}'", origin,
              line_no, line.substr(0, 80));
    t.ranks_.emplace(line, rank++);
  }
  auto id_of = [&](const std::string& token) {
    auto it = t.vocab_.find(token);
    HYP_CHECK(it != t.vocab_.end(), "{}/vocab.json: has no {} token", origin, token);
    return it->second;
  };
  t.bos_ = id_of("<|startoftext|>");
  t.eos_ = id_of("<|endoftext|>");
  t.pad_ = pad_token.empty() ? t.eos_ : id_of(pad_token);
  t.regex_ = std::make_shared<Regex>(kPattern, origin + ": CLIP pattern");
  return t;
}

void ClipTokenizer::bpe(const std::string& word, std::vector<int32_t>& out) const {
  // Symbols: the byte-alphabet characters, "</w>" on the last.
  std::vector<std::string> sym;
  for (unsigned char c : word) sym.push_back(byte_level_char(c));
  if (sym.empty()) return;
  sym.back() += "</w>";
  while (sym.size() > 1) {
    int32_t best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = ranks_.find(sym[i] + " " + sym[i + 1]);
      if (it != ranks_.end() && (best < 0 || it->second < best)) {
        best = it->second;
        at = i;
      }
    }
    if (best < 0) break;
    const std::string first = sym[at], second = sym[at + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < sym.size();) {
      if (i + 1 < sym.size() && sym[i] == first && sym[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(sym[i++]);
      }
    }
    sym = std::move(merged);
  }
  for (const std::string& s : sym) {
    auto it = vocab_.find(s);
    // A symbol without an id cannot come from a vocabulary built with its merges; skip it
    // as CLIP's dictionary lookup would fail (transformers maps it to unk = <|endoftext|>).
    out.push_back(it != vocab_.end() ? it->second : eos_);
  }
}

std::vector<int32_t> ClipTokenizer::encode(std::string_view text) const {
  const size_t bad = utf8_invalid_at(text);
  HYP_CHECK(bad == std::string_view::npos, "{}: text is not valid UTF-8 at byte {}", origin_, bad);
  const std::string clean = clean_and_lower(unescape_html(std::string(text)));
  std::vector<int32_t> out;
  static_cast<const Regex*>(regex_.get())->for_each_match(clean, [&](size_t b, size_t e) {
    const std::string piece = clean.substr(b, e - b);
    if (piece == "<|startoftext|>") out.push_back(bos_);
    else if (piece == "<|endoftext|>") out.push_back(eos_);
    else bpe(piece, out);
  });
  return out;
}

std::vector<int32_t> ClipTokenizer::encode_for_model(std::string_view text, int64_t* dropped) const {
  std::vector<int32_t> tokens = encode(text);
  const size_t room = size_t(max_length_ - 2);
  if (dropped) *dropped = tokens.size() > room ? int64_t(tokens.size() - room) : 0;
  if (tokens.size() > room) tokens.resize(room);
  std::vector<int32_t> out;
  out.reserve(size_t(max_length_));
  out.push_back(bos_);
  out.insert(out.end(), tokens.begin(), tokens.end());
  out.push_back(eos_);
  out.resize(size_t(max_length_), pad_);
  return out;
}

std::string ClipTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    HYP_CHECK(id >= 0 && id < vocab_size(), "{}: id {} outside the vocabulary [0, {})", origin_, id,
              vocab_size());
    if (id == bos_ || id == eos_) continue;
    std::string p = pieces_[size_t(id)];
    const bool end = p.size() >= 4 && p.compare(p.size() - 4, 4, "</w>") == 0;
    if (end) p.resize(p.size() - 4);
    std::string raw;
    if (byte_level_decode(p, &raw)) out += raw;
    else out += p;
    if (end) out += ' ';
  }
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

ClipTokenizer ClipTokenizer::for_words(const std::vector<std::string>& words, int64_t max_length) {
  // bytes_to_unicode's order: the printable bytes first, then the rest.
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
  std::vector<std::string> vocab;
  for (int pass = 0; pass < 2; ++pass)
    for (int printable_first = 1; printable_first >= 0; --printable_first)
      for (int b = 0; b < 256; ++b)
        if (printable(b) == bool(printable_first)) vocab.push_back(byte_level_char(uint8_t(b)) + (pass ? "</w>" : ""));
  std::vector<std::string> merges;
  std::unordered_map<std::string, bool> seen;
  for (const std::string& w : words) {
    HYP_CHECK(!w.empty() && w.find(' ') == std::string::npos, "for_words: '{}' is not one word", w);
    std::vector<std::string> sym;
    for (unsigned char c : w) sym.push_back(byte_level_char(c));
    sym.back() += "</w>";
    std::string left = sym[0];
    for (size_t i = 1; i < sym.size(); ++i) {
      const std::string merge = left + " " + sym[i];
      left += sym[i];
      if (seen.emplace(merge, true).second) {
        merges.push_back(merge);
        vocab.push_back(left);
      }
    }
  }
  vocab.push_back("<|startoftext|>");
  vocab.push_back("<|endoftext|>");
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (size_t i = 0; i < vocab.size(); ++i) j[vocab[i]] = i;
  std::string merges_txt = "#version: 0.2\n";
  for (const std::string& m : merges) merges_txt += m + "\n";
  return from_files(j.dump(), merges_txt, "words", "", max_length);
}

std::string ClipTokenizer::vocab_json() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (size_t i = 0; i < pieces_.size(); ++i) j[pieces_[i]] = i;
  return j.dump();
}

std::string ClipTokenizer::merges_txt() const {
  std::vector<const std::string*> by_rank(ranks_.size());
  for (const auto& [pair, rank] : ranks_) by_rank[size_t(rank)] = &pair;
  std::string out = "#version: 0.2\n";
  for (const std::string* m : by_rank) out += *m + "\n";
  return out;
}

void ClipTokenizer::save(const std::string& dir) const {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  io::write_file_atomic((fs::path(dir) / "vocab.json").string(), vocab_json());
  io::write_file_atomic((fs::path(dir) / "merges.txt").string(), merges_txt());
  nlohmann::ordered_json special = {{"bos_token", "<|startoftext|>"}, {"eos_token", "<|endoftext|>"},
                                    {"pad_token", pieces_[size_t(pad_)]}, {"unk_token", "<|endoftext|>"}};
  io::write_file_atomic((fs::path(dir) / "special_tokens_map.json").string(), special.dump(2) + "\n");
  nlohmann::ordered_json config = {{"tokenizer_class", "CLIPTokenizer"}, {"model_max_length", max_length_},
                                   {"pad_token", pieces_[size_t(pad_)]}, {"do_lower_case", true}};
  io::write_file_atomic((fs::path(dir) / "tokenizer_config.json").string(), config.dump(2) + "\n");
}

}  // namespace hyperion::text
