// Reads tokenizer.json and tokenizer_config.json into HfTokenizer::Impl. Every error names
// the file and the JSON key path at fault ("tokenizer.json: pre_tokenizer.pretokenizers[0]
// .type: ..."); nothing unsupported is ignored silently.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "text/hf_tokenizer_impl.h"
#include "text/hf_tokenizer_json_sax.h"

namespace hyperion::text {

namespace {

// What an error quotes of a file's value: at most 80 characters.
std::string clipped(const std::string& s) {
  return s.size() <= 80 ? s : s.substr(0, 77) + "...";
}

using nlohmann::json;

// No real vocabulary is near this; a larger id would make the id tables a huge allocation.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

struct Reader {
  const std::string& file;
  // Ids are dense in every real vocabulary; an id far past the number of tokens would make
  // the id tables a large allocation from a few bytes of file.
  int64_t max_id = kMaxTokenId;

  [[noreturn]] void bad(const std::string& path, const std::string& what) const {
    fail("tokenizer: {}: {}: {}", file, path, what);
  }
  const json& at(const json& j, const std::string& path, const char* key) const {
    if (!j.is_object()) bad(path, "expected an object");
    auto it = j.find(key);
    if (it == j.end()) bad(path.empty() ? key : path + "." + key, "missing");
    return *it;
  }
  std::string str(const json& j, const std::string& path, const char* key) const {
    const json& v = at(j, path, key);
    if (!v.is_string()) bad(path + "." + key, "expected a string");
    return v.get<std::string>();
  }
  std::string str_or(const json& j, const std::string& path, const char* key,
                     const std::string& def) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_string()) bad(path + "." + key, "expected a string");
    return it->get<std::string>();
  }
  bool flag(const json& j, const std::string& path, const char* key, bool def) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_boolean()) bad(path + "." + key, "expected true or false");
    return it->get<bool>();
  }
  int64_t integer(const json& j, const std::string& path, const char* key, int64_t lo,
                  int64_t hi) const {
    const json& v = at(j, path, key);
    if (!v.is_number_integer()) bad(path + "." + key, "expected an integer");
    const auto n = v.get<int64_t>();
    if (n < lo || n > hi) bad(path + "." + key, fmt::format("{} is outside [{}, {}]", n, lo, hi));
    return n;
  }
  std::string type(const json& j, const std::string& path) const { return str(j, path, "type"); }
  // A {"String": s} or {"Regex": r} pattern.
  void pattern(const json& j, const std::string& path, std::string* literal,
               std::shared_ptr<Regex>* regex) const {
    const json& p = at(j, path, "pattern");
    if (p.contains("String") && p["String"].is_string()) {
      *literal = p["String"].get<std::string>();
    } else if (p.contains("Regex") && p["Regex"].is_string()) {
      *regex = std::make_shared<Regex>(p["Regex"].get<std::string>(),
                                       fmt::format("tokenizer: {}: {}.pattern", file, path));
    } else {
      bad(path + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
    }
  }
  [[noreturn]] void unsupported(const std::string& path, const std::string& type,
                                const char* supported) const {
    bad(path + ".type", fmt::format("'{}' is not supported (supported: {})", type, supported));
  }
};

void read_normalizer(const Reader& r, const json& j, const std::string& path,
                     std::vector<NormalizerOp>& ops) {
  if (j.is_null()) return;
  using K = NormalizerOp::Kind;
  const std::string t = r.type(j, path);
  NormalizerOp op{};
  if (t == "Sequence") {
    const json& list = r.at(j, path, "normalizers");
    if (!list.is_array()) r.bad(path + ".normalizers", "expected a list");
    for (size_t i = 0; i < list.size(); ++i)
      read_normalizer(r, list[i], fmt::format("{}.normalizers[{}]", path, i), ops);
    return;
  }
  if (t == "NFC") {
    op.kind = K::kNfc;
  } else if (t == "NFD") {
    op.kind = K::kNfd;
  } else if (t == "NFKC") {
    op.kind = K::kNfkc;
  } else if (t == "NFKD") {
    op.kind = K::kNfkd;
  } else if (t == "Lowercase") {
    op.kind = K::kLowercase;
  } else if (t == "Replace") {
    op.kind = K::kReplace;
    r.pattern(j, path, &op.pattern, &op.regex);
    op.content = r.str(j, path, "content");
  } else if (t == "Prepend") {
    op.kind = K::kPrepend;
    op.content = r.str(j, path, "prepend");
  } else if (t == "Strip") {
    op.kind = K::kStrip;
    op.strip_left = r.flag(j, path, "strip_left", false);
    op.strip_right = r.flag(j, path, "strip_right", false);
  } else {
    r.unsupported(path, t, "NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip, Sequence");
  }
  ops.push_back(std::move(op));
}

PreTokenizerOp::Behavior read_behavior(const Reader& r, const json& j, const std::string& path) {
  using B = PreTokenizerOp::Behavior;
  const std::string b = r.str(j, path, "behavior");
  if (b == "Removed") return B::kRemoved;
  if (b == "Isolated") return B::kIsolated;
  if (b == "MergedWithPrevious") return B::kMergedWithPrevious;
  if (b == "MergedWithNext") return B::kMergedWithNext;
  if (b == "Contiguous") return B::kContiguous;
  r.bad(path + ".behavior", fmt::format("'{}' is not a split behavior", b));
}

PreTokenizerOp::Prepend read_prepend_scheme(const Reader& r, const json& j,
                                            const std::string& path) {
  using P = PreTokenizerOp::Prepend;
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    const std::string s = r.str(j, path, "prepend_scheme");
    if (s == "always") return P::kAlways;
    if (s == "first") return P::kFirst;
    if (s == "never") return P::kNever;
    r.bad(path + ".prepend_scheme", fmt::format("'{}' is not always, first or never", s));
  }
  return r.flag(j, path, "add_prefix_space", true) ? P::kAlways : P::kNever;
}

void read_pre_tokenizer(const Reader& r, const json& j, const std::string& path,
                        std::vector<PreTokenizerOp>& ops, bool* byte_level) {
  if (j.is_null()) return;
  using K = PreTokenizerOp::Kind;
  const std::string t = r.type(j, path);
  PreTokenizerOp op{};
  if (t == "Sequence") {
    const json& list = r.at(j, path, "pretokenizers");
    if (!list.is_array()) r.bad(path + ".pretokenizers", "expected a list");
    for (size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(r, list[i], fmt::format("{}.pretokenizers[{}]", path, i), ops, byte_level);
    return;
  }
  // After ByteLevel, the `tokenizers` library runs later pre-tokenizers on text already
  // mapped to the byte alphabet; hyperion keeps raw bytes, so it refuses that order.
  if (*byte_level && t != "ByteLevel")
    r.bad(path + ".type", fmt::format("'{}' after a ByteLevel pre-tokenizer is not supported", t));
  if (t == "Split") {
    op.kind = K::kSplit;
    r.pattern(j, path, &op.pattern, &op.regex);
    op.behavior = read_behavior(r, j, path);
    op.invert = r.flag(j, path, "invert", false);
  } else if (t == "ByteLevel") {
    op.kind = K::kByteLevel;
    *byte_level = true;
    op.add_prefix_space = r.flag(j, path, "add_prefix_space", true);
    if (r.flag(j, path, "use_regex", true))
      op.regex = std::make_shared<Regex>(kGpt2SplitPattern, "tokenizer: ByteLevel");
  } else if (t == "Metaspace") {
    op.kind = K::kMetaspace;
    op.replacement = r.str_or(j, path, "replacement", op.replacement);
    if (op.replacement.empty()) r.bad(path + ".replacement", "must not be empty");
    op.prepend = read_prepend_scheme(r, j, path);
    op.split = r.flag(j, path, "split", true);
  } else if (t == "Digits") {
    op.kind = K::kDigits;
    op.individual_digits = r.flag(j, path, "individual_digits", false);
  } else if (t == "Whitespace") {
    op.kind = K::kWhitespace;
    op.regex = std::make_shared<Regex>(R"(\w+|[^\w\s]+)", "tokenizer: Whitespace");
  } else if (t == "WhitespaceSplit") {
    op.kind = K::kWhitespaceSplit;
  } else {
    r.unsupported(path, t,
                  "Split, ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit, Sequence");
  }
  ops.push_back(std::move(op));
}

void read_decoder(const Reader& r, const json& j, const std::string& path,
                  std::vector<DecoderOp>& ops, bool* byte_level) {
  if (j.is_null()) return;
  using K = DecoderOp::Kind;
  const std::string t = r.type(j, path);
  DecoderOp op{};
  if (t == "Sequence") {
    const json& list = r.at(j, path, "decoders");
    if (!list.is_array()) r.bad(path + ".decoders", "expected a list");
    for (size_t i = 0; i < list.size(); ++i)
      read_decoder(r, list[i], fmt::format("{}.decoders[{}]", path, i), ops, byte_level);
    return;
  }
  if (t == "ByteLevel") {
    op.kind = K::kByteLevel;
    *byte_level = true;
  } else if (t == "Metaspace") {
    op.kind = K::kMetaspace;
    op.replacement = r.str_or(j, path, "replacement", "\xE2\x96\x81");
    op.metaspace_strip_first = read_prepend_scheme(r, j, path) != PreTokenizerOp::Prepend::kNever;
  } else if (t == "Replace") {
    op.kind = K::kReplace;
    r.pattern(j, path, &op.pattern, &op.regex);
    op.content = r.str(j, path, "content");
  } else if (t == "ByteFallback") {
    op.kind = K::kByteFallback;
  } else if (t == "Fuse") {
    op.kind = K::kFuse;
  } else if (t == "Strip") {
    op.kind = K::kStrip;
    op.content = r.str(j, path, "content");
    // The `tokenizers` library's content is one character.
    const auto lead = static_cast<unsigned char>(op.content.empty() ? 0 : op.content[0]);
    const size_t one = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    if (op.content.empty() || op.content.size() != one)
      r.bad(path + ".content", "must be exactly one character");
    op.strip_start = static_cast<size_t>(r.integer(j, path, "start", 0, 1 << 20));
    op.strip_stop = static_cast<size_t>(r.integer(j, path, "stop", 0, 1 << 20));
  } else {
    r.unsupported(path, t, "ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence");
  }
  ops.push_back(std::move(op));
}

// TemplateProcessing's "single" template, as ids before and after the sequence.
void read_post_processor(const Reader& r, const json& j, const std::string& path,
                         SpecialTemplate& post) {
  if (j.is_null()) return;
  const std::string t = r.type(j, path);
  if (t == "Sequence") {
    const json& list = r.at(j, path, "processors");
    if (!list.is_array()) r.bad(path + ".processors", "expected a list");
    for (size_t i = 0; i < list.size(); ++i)
      read_post_processor(r, list[i], fmt::format("{}.processors[{}]", path, i), post);
    return;
  }
  if (t == "ByteLevel") return;  // offsets only: the ids are unchanged
  if (t != "TemplateProcessing") r.unsupported(path, t, "TemplateProcessing, ByteLevel, Sequence");
  const json& single = r.at(j, path, "single");
  const json& specials = r.at(j, path, "special_tokens");
  if (!single.is_array()) r.bad(path + ".single", "expected a list");
  post = {};
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string item = fmt::format("{}.single[{}]", path, i);
    if (single[i].contains("Sequence")) {
      if (seen_sequence) r.bad(item, "a second sequence in a single-sequence template");
      seen_sequence = true;
      continue;
    }
    const std::string name =
        r.str(r.at(single[i], item, "SpecialToken"), item + ".SpecialToken", "id");
    const json& tok = r.at(specials, path + ".special_tokens", name.c_str());
    const json& ids = r.at(tok, fmt::format("{}.special_tokens.{}", path, name), "ids");
    if (!ids.is_array())
      r.bad(fmt::format("{}.special_tokens.{}.ids", path, name), "expected a list");
    for (const json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId)
        r.bad(fmt::format("{}.special_tokens.{}.ids", path, name), "expected token ids");
      (seen_sequence ? post.after : post.before).push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
}

void read_model(const Reader& r, const json& model, const BpeTables& tables, bool byte_level,
                HfTokenizer::Impl& impl) {
  const std::string t = model.contains("type") ? r.type(model, "model") : "BPE";
  if (t != "BPE") r.unsupported("model", t, "BPE");
  // The tables hold model.vocab and model.merges of the right kinds; anything else is
  // still in the document, missing or of the wrong kind.
  if (!tables.has_vocab) {
    r.at(model, "model", "vocab");
    r.bad("model.vocab", "expected an object of token -> id");
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    r.bad("model.dropout", "BPE dropout is random at encode time; only null or 0 is supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!r.str_or(model, "model", key, "").empty())
      r.bad(std::string("model.") + key, "a non-empty value is not supported");

  BpeModelSpec spec;
  spec.byte_level = byte_level;
  spec.byte_fallback = r.flag(model, "model", "byte_fallback", false);
  spec.ignore_merges = r.flag(model, "model", "ignore_merges", false);
  spec.fuse_unk = r.flag(model, "model", "fuse_unk", false);

  TokenIndex keyed;
  size_t vocab_bytes = 0;
  for (const BpeTables::Token& token : tables.vocab) vocab_bytes += token.length;
  keyed.reserve(tables.vocab.size(), vocab_bytes);
  std::string raw;
  std::vector<uint8_t> seen;  // an id given to a token already: decoding would not invert
  for (const BpeTables::Token& token : tables.vocab) {
    const std::string_view text = tables.token_text(token);
    if (token.id < 0 || token.id > r.max_id)
      r.bad(fmt::format("model.vocab.{}", text),
            fmt::format("expected an id in [0, {}] (ids are dense: the file has {} tokens)",
                        r.max_id, r.max_id - 65536));
    const auto id = static_cast<int32_t>(token.id);
    if (static_cast<size_t>(id) >= impl.pieces.size()) {
      impl.pieces.resize(std::max(static_cast<size_t>(id) + 1, tables.vocab.size()));
      seen.resize(impl.pieces.size(), 0);
    }
    if (seen[static_cast<size_t>(id)])
      r.bad(fmt::format("model.vocab.{}", text),
            fmt::format("id {} is also the id of '{}': each token needs an id of its own", id,
                        clipped(impl.pieces[id])));
    seen[static_cast<size_t>(id)] = 1;
    impl.pieces[id] = text;
    // A byte-level token that spells no bytes cannot come out of the model; it still decodes.
    std::string_view key = text;
    if (byte_level) {
      if (!byte_level_decode(text, &raw)) continue;
      key = raw;
    }
    if (keyed.insert(key, id) >= 0)
      r.bad(fmt::format("model.vocab.{}", text), "the token is listed twice");
    impl.max_piece_bytes = std::max(impl.max_piece_bytes, key.size());
  }
  // Ids past the highest are not tokens: pieces was sized for dense ids.
  while (!impl.pieces.empty() && !seen[impl.pieces.size() - 1]) impl.pieces.pop_back();
  const std::string unk = r.str_or(model, "model", "unk_token", "");
  if (!unk.empty()) {
    spec.unk_id = keyed.find(unk);
    if (spec.unk_id < 0) r.bad("model.unk_token", fmt::format("'{}' is not in the vocabulary", unk));
  }
  impl.model.emplace(spec, std::move(keyed));

  if (!tables.has_merges) {
    r.at(model, "model", "merges");
    r.bad("model.merges", "expected a list");
  }
  impl.model->reserve_merges(tables.merges.size());
  // Merges go to the model a batch at a time (BpeModel::add_merges prefetches a batch's
  // lookups); `index` keeps each one's place in the file for an error.
  constexpr size_t kBatch = 256;
  std::string batch_text;
  std::vector<BpeModel::MergeText> batch;
  std::vector<size_t> index;
  auto flush = [&] {
    std::string why;
    const size_t bad = impl.model->add_merges(batch_text, batch, &why);
    if (bad < batch.size()) r.bad(fmt::format("model.merges[{}]", index[bad]), why);
    batch_text.clear(), batch.clear(), index.clear();
  };
  std::string_view left, right;
  std::string raw_left, raw_right;
  for (size_t i = 0; i < tables.merges.size(); ++i) {
    const BpeTables::Merge& m = tables.merges[i];
    const std::string_view text = tables.merge_text(m);
    using F = BpeTables::Merge::Form;
    if (m.form == F::kString) {
      const size_t sp = text.find(' ');
      if (sp == std::string_view::npos || text.find(' ', sp + 1) != std::string_view::npos)
        r.bad(fmt::format("model.merges[{}]", i),
              fmt::format("'{}' is not two tokens separated by one space", text));
      left = text.substr(0, sp), right = text.substr(sp + 1);
    } else if (m.form == F::kPair) {
      left = text.substr(0, m.left), right = text.substr(m.left);
    } else {
      r.bad(fmt::format("model.merges[{}]", i), "expected \"a b\" or [\"a\", \"b\"]");
    }
    if (byte_level) {
      // Unreachable from bytes: such a merge can never apply.
      if (!byte_level_decode(left, &raw_left) || !byte_level_decode(right, &raw_right)) continue;
      left = raw_left, right = raw_right;
    }
    batch.push_back({static_cast<uint32_t>(batch_text.size()), static_cast<uint32_t>(left.size()),
                     static_cast<uint32_t>(right.size()), static_cast<int32_t>(i)});
    batch_text += left;
    batch_text += right;
    index.push_back(i);
    if (batch.size() == kBatch) flush();
  }
  flush();
}

void read_added_tokens(const Reader& r, const json& root, HfTokenizer::Impl& impl) {
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return;
  if (!it->is_array()) r.bad("added_tokens", "expected a list");
  std::unordered_map<int32_t, std::string> added_content;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& a = (*it)[i];
    const std::string path = fmt::format("added_tokens[{}]", i);
    const auto id = static_cast<int32_t>(r.integer(a, path, "id", 0, r.max_id));
    const std::string content = r.str(a, path, "content");
    if (content.empty()) r.bad(path + ".content", "must not be empty");
    const bool special = r.flag(a, path, "special", false);
    if (r.flag(a, path, "single_word", false))
      r.bad(path + ".single_word", "single_word added tokens are not supported");
    const bool normalized = r.flag(a, path, "normalized", !special);
    // An added token may repeat a vocabulary entry (the same content at the same id, as
    // Llama 2 and Gemma list their specials); two contents for one id, or two ids for one
    // content, would make decoding no longer invert encoding.
    if (auto other = added_content.find(id); other != added_content.end() && other->second != content)
      r.bad(path + ".id", fmt::format("id {} is also added_tokens' '{}'", id, clipped(other->second)));
    if (auto other = impl.added_ids.find(content); other != impl.added_ids.end() && other->second != id)
      r.bad(path + ".content", fmt::format("'{}' is added twice, as id {} and id {}",
                                           clipped(content), other->second, id));
    added_content[id] = content;
    if (static_cast<size_t>(id) >= impl.pieces.size())
      impl.pieces.resize(static_cast<size_t>(id) + 1);
    impl.pieces[id] = content;
    if (static_cast<size_t>(id) >= impl.special.size())
      impl.special.resize(static_cast<size_t>(id) + 1);
    impl.special[id] = special;
    impl.added_ids[content] = id;
    impl.max_piece_bytes = std::max(impl.max_piece_bytes, content.size());
    AddedTokenMatcher::Token tok{content, id, r.flag(a, path, "lstrip", false),
                                 r.flag(a, path, "rstrip", false)};
    if (normalized) {
      tok.content = normalize(impl.normalizers, tok.content);
      impl.normalized_added.add(std::move(tok));
    } else {
      impl.raw_added.add(std::move(tok));
    }
  }
}

// A special token in tokenizer_config.json: a string, {"content": ...}, or null.
std::string config_token(const Reader& r, const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  r.bad(key, "expected a token string, {\"content\": ...} or null");
}

void read_config(const HfTokenizerSource& src, HfTokenizer::Impl& impl, HfTokenizer& tok) {
  if (src.config_json.empty()) return;
  const Reader r{src.config_json_path};
  json cfg;
  try {
    cfg = json::parse(src.config_json);
  } catch (const json::exception& e) {
    fail("tokenizer: {}: not valid JSON: {}", src.config_json_path, e.what());
  }
  if (!cfg.is_object()) r.bad("(top level)", "expected an object");
  auto id_of = [&](const char* key, std::string* text) {
    const std::string t = config_token(r, cfg, key);
    if (text) *text = t;
    if (t.empty()) return int32_t{-1};
    const int32_t id = tok.token_id(t);
    if (id < 0) r.bad(key, fmt::format("'{}' is not a token of {}", t, impl.origin));
    return id;
  };
  impl.bos = id_of("bos_token", &impl.bos_token);
  impl.eos = id_of("eos_token", &impl.eos_token);
  impl.pad = id_of("pad_token", nullptr);
  impl.unk = id_of("unk_token", nullptr);
  if (cfg.contains("add_bos_token") || cfg.contains("add_eos_token")) {
    impl.post = {};
    if (r.flag(cfg, "", "add_bos_token", false)) {
      if (impl.bos < 0) r.bad("add_bos_token", "true, but there is no bos_token");
      impl.post.before.push_back(impl.bos);
    }
    if (r.flag(cfg, "", "add_eos_token", false)) {
      if (impl.eos < 0) r.bad("add_eos_token", "true, but there is no eos_token");
      impl.post.after.push_back(impl.eos);
    }
  }
  auto ct = cfg.find("chat_template");
  if (ct != cfg.end() && !ct->is_null()) {
    if (ct->is_string()) {
      impl.chat_template = ct->get<std::string>();
    } else if (ct->is_array()) {
      for (size_t i = 0; i < ct->size(); ++i) {
        const json& e = (*ct)[i];
        const std::string path = fmt::format("chat_template[{}]", i);
        if (r.str(e, path, "name") == "default") impl.chat_template = r.str(e, path, "template");
      }
      if (impl.chat_template.empty())
        r.bad("chat_template", "a list of named templates without one named 'default'");
    } else {
      r.bad("chat_template", "expected a string or a list of {name, template}");
    }
  }
}

// The most a decoder chain can grow a token's text: only Replace can (Metaspace, ByteLevel
// and ByteFallback shrink it; Fuse and Strip do not grow it).
TextGrowth decoder_growth(const std::vector<DecoderOp>& ops) {
  TextGrowth g;
  for (const DecoderOp& op : ops) {
    if (op.kind != DecoderOp::Kind::kReplace) continue;
    const TextGrowth r = replace_growth(op.pattern.size(), op.content.size(), op.regex != nullptr);
    g.then(r.factor, r.extra);
  }
  return g;
}

// Expansion bombs are refused at load (hf_text_ops.h, TextGrowth).
void check_growth(const Reader& r, const char* stage, const TextGrowth& g) {
  if (g.factor > kMaxTextGrowth || g.extra > kMaxTextExtra)
    r.bad(stage, fmt::format("its steps could grow a text {:.3g}-fold plus {:.3g} bytes; at most "
                             "{:.0f}-fold plus {:.0f} bytes is accepted (a chain that multiplies "
                             "its input, such as Replace \"a\" -> \"aa\" repeated, is an "
                             "expansion bomb)",
                             g.factor, g.extra, kMaxTextGrowth, kMaxTextExtra));
}

void read_end_ids(const HfTokenizerSource& src, HfTokenizer::Impl& impl, HfTokenizer& tok) {
  auto add = [&](int32_t id) {
    if (id >= 0 && std::find(impl.end_ids.begin(), impl.end_ids.end(), id) == impl.end_ids.end())
      impl.end_ids.push_back(id);
  };
  add(impl.eos);
  if (!src.generation_config_json.empty()) {
    // eos_token_id: an id or a list of ids, each an integer in [0, 2^31); anything else
    // is an error naming the file and the value (ids past the vocabulary are dropped
    // below, as transformers ignores them).
    const std::string where =
        src.generation_config_path.empty() ? "generation_config.json" : src.generation_config_path;
    const json g = json::parse(src.generation_config_json, nullptr, false);
    HYP_CHECK(!g.is_discarded() && g.is_object(), "{}: not a JSON object", where);
    auto id_of = [&](const json& x, const std::string& what) {
      HYP_CHECK(x.is_number_integer(), "{}: {} must be an integer token id, got {}", where, what,
                clipped(x.dump()));
      const bool fits = x.is_number_unsigned() ? x.get<uint64_t>() <= uint64_t{INT32_MAX}
                                               : x.get<int64_t>() >= 0 &&
                                                     x.get<int64_t>() <= int64_t{INT32_MAX};
      HYP_CHECK(fits, "{}: {} is {}, not a token id (0 to 2^31 - 1)", where, what, x.dump());
      return static_cast<int32_t>(x.get<int64_t>());
    };
    if (g.contains("eos_token_id") && !g["eos_token_id"].is_null()) {
      const json& e = g["eos_token_id"];
      if (e.is_array()) {
        for (size_t i = 0; i < e.size(); ++i)
          add(id_of(e[i], fmt::format("eos_token_id[{}]", i)));
      } else {
        add(id_of(e, "eos_token_id"));
      }
    }
  }
  // The end-of-turn and end-of-text tokens of the chat formats in use (Llama 3, ChatML,
  // Gemma, Phi, Mistral): a model ends its turn with them whatever eos_token says.
  for (const char* name : {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|im_end|>",
                           "<|endoftext|>", "<end_of_turn>", "<|end|>", "</s>", "<eos>"}) {
    const int32_t id = tok.token_id(name);
    if (tok.is_special(id)) add(id);
  }
  std::erase_if(impl.end_ids, [&](int32_t id) { return id >= impl.vocab_size; });
}

}  // namespace

void parse_hf_tokenizer(const HfTokenizerSource& src, HfTokenizer::Impl& impl) {
  impl.origin = src.tokenizer_json_path;
  Reader r{src.tokenizer_json_path};
  BpeTables tables;
  const json root = parse_tokenizer_json(src.tokenizer_json, src.tokenizer_json_path, tables);
  if (!root.is_object()) r.bad("(top level)", "expected an object");
  for (const char* key : {"truncation", "padding"})
    if (root.contains(key) && !root[key].is_null())
      r.bad(key, "truncation and padding are not applied by hyperion; expected null");

  {
    const auto added = root.find("added_tokens");
    r.max_id = std::min<int64_t>(
        kMaxTokenId, static_cast<int64_t>(tables.vocab.size()) +
                         (added != root.end() && added->is_array() ? int64_t(added->size()) : 0) +
                         65536);
  }
  bool byte_level = false;
  read_normalizer(r, root.value("normalizer", json()), "normalizer", impl.normalizers);
  read_pre_tokenizer(r, root.value("pre_tokenizer", json()), "pre_tokenizer", impl.pre_tokenizers,
                     &byte_level);
  read_decoder(r, root.value("decoder", json()), "decoder", impl.decoders, &byte_level);
  check_growth(r, "normalizer", normalizer_growth(impl.normalizers));
  check_growth(r, "decoder", decoder_growth(impl.decoders));
  read_post_processor(r, root.value("post_processor", json()), "post_processor", impl.post);
  read_model(r, r.at(root, "", "model"), tables, byte_level, impl);
  read_added_tokens(r, root, impl);
  impl.vocab_size = static_cast<int32_t>(impl.pieces.size());
  HYP_CHECK(impl.vocab_size > 0, "tokenizer: {}: the vocabulary is empty", src.tokenizer_json_path);
  impl.special.resize(impl.pieces.size(), 0);
  for (int32_t id : impl.post.before)
    HYP_CHECK(id < impl.vocab_size,
              "tokenizer: {}: post_processor: id {} is outside the vocabulary",
              src.tokenizer_json_path, id);
  for (int32_t id : impl.post.after)
    HYP_CHECK(id < impl.vocab_size,
              "tokenizer: {}: post_processor: id {} is outside the vocabulary",
              src.tokenizer_json_path, id);
}

// The config needs token lookups, so it is read once the HfTokenizer exists.
void parse_hf_tokenizer_config(const HfTokenizerSource& src, HfTokenizer::Impl& impl,
                               HfTokenizer& tok) {
  read_config(src, impl, tok);
  if (!src.chat_template_override.empty()) impl.chat_template = src.chat_template_override;
  read_end_ids(src, impl, tok);
}

}  // namespace hyperion::text
