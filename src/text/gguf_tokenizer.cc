// Tokenizers from a GGUF file's vocabulary (text/gguf_tokenizer.h).
#include "text/gguf_tokenizer.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "base/error.h"
#include "base/log.h"
#include "base/utf8.h"
#include "text/gguf_vocab.h"

namespace hyperion::text {

namespace {

using io::GgufType;
using nlohmann::json;

// The keys read (gguf-py/gguf/constants.py spells them so).
constexpr const char* kModelKey = "tokenizer.ggml.model";
constexpr const char* kPreKey = "tokenizer.ggml.pre";
constexpr const char* kTokensKey = "tokenizer.ggml.tokens";
constexpr const char* kScoresKey = "tokenizer.ggml.scores";
constexpr const char* kTypesKey = "tokenizer.ggml.token_type";
constexpr const char* kMergesKey = "tokenizer.ggml.merges";
constexpr const char* kBosKey = "tokenizer.ggml.bos_token_id";
constexpr const char* kEosKey = "tokenizer.ggml.eos_token_id";
constexpr const char* kEotKey = "tokenizer.ggml.eot_token_id";
constexpr const char* kEomKey = "tokenizer.ggml.eom_token_id";
constexpr const char* kUnkKey = "tokenizer.ggml.unknown_token_id";
constexpr const char* kPadKey = "tokenizer.ggml.padding_token_id";
constexpr const char* kAddBosKey = "tokenizer.ggml.add_bos_token";
constexpr const char* kAddEosKey = "tokenizer.ggml.add_eos_token";
constexpr const char* kAddSpacePrefixKey = "tokenizer.ggml.add_space_prefix";
constexpr const char* kChatTemplateKey = "tokenizer.chat_template";

// Past these a file is not a vocabulary (the largest real ones: Gemma 3's 262,208 tokens,
// Gemma 3's 514,906 merges). hyperion's token ids stop below 2^24 (hf_tokenizer_json.cc).
constexpr uint64_t kMaxTokens = uint64_t{1} << 24;
constexpr uint64_t kMaxMerges = uint64_t{1} << 26;
constexpr size_t kMaxTokenBytes = size_t{1} << 16;

// The end-of-turn tokens of the chat formats in use (as hf_tokenizer_json.cc's list): a
// control token so spelled ends a generation, whatever eos_token_id says.
constexpr const char* kEndOfTurnTokens[] = {"<|eot_id|>", "<|eom_id|>",    "<|end_of_text|>",
                                            "<|im_end|>", "<|endoftext|>", "<end_of_turn>",
                                            "<|end|>",    "</s>",          "<eos>"};

// Key access whose every failure is a UsageError naming the file and the key.
class Keys {
 public:
  explicit Keys(const io::GgufFile& f) : f_(f) {}
  const std::string& path() const { return f_.path(); }
  bool has(const char* key) const { return f_.has(key); }

  template <typename... Args>
  [[noreturn]] void bad(std::string_view key, fmt::format_string<Args...> why,
                        Args&&... args) const {
    usage_fail("gguf tokenizer: {}: {}: {}", f_.path(), key,
               fmt::format(why, std::forward<Args>(args)...));
  }

  std::string describe(const char* key) const {
    const GgufType t = f_.type(key);
    return t == GgufType::kArray
               ? fmt::format("an array of {}", io::gguf_type_name(f_.array_type(key)))
               : fmt::format("a {}", io::gguf_type_name(t));
  }
  void expect(const char* key, GgufType want) const {
    if (f_.type(key) != want)
      bad(key, "is {}, expected a {}", describe(key), io::gguf_type_name(want));
  }
  // An array of `elem`s of at most `max` elements.
  void expect_array(const char* key, GgufType elem, uint64_t max) const {
    if (f_.type(key) != GgufType::kArray || f_.array_type(key) != elem)
      bad(key, "is {}, expected an array of {}", describe(key), io::gguf_type_name(elem));
    if (f_.array_size(key) > max)
      bad(key, "has {} elements; more than {} is not a vocabulary", f_.array_size(key), max);
  }

  std::string string(const char* key) const {
    expect(key, GgufType::kString);
    return f_.get_string(key);
  }
  std::optional<bool> flag(const char* key) const {
    if (!has(key)) return std::nullopt;
    expect(key, GgufType::kBool);
    return f_.get_bool(key);
  }
  // A token id in [0, n): any integer type (converters write u32), -1 when the key is not
  // there.
  int32_t id(const char* key, size_t n) const {
    if (!has(key)) return -1;
    int64_t v = 0;
    switch (f_.type(key)) {
      case GgufType::kU8:
        v = f_.get<uint8_t>(key);
        break;
      case GgufType::kI8:
        v = f_.get<int8_t>(key);
        break;
      case GgufType::kU16:
        v = f_.get<uint16_t>(key);
        break;
      case GgufType::kI16:
        v = f_.get<int16_t>(key);
        break;
      case GgufType::kU32:
        v = f_.get<uint32_t>(key);
        break;
      case GgufType::kI32:
        v = f_.get<int32_t>(key);
        break;
      case GgufType::kI64:
        v = f_.get<int64_t>(key);
        break;
      case GgufType::kU64: {
        const uint64_t u = f_.get<uint64_t>(key);
        v = u > uint64_t{INT64_MAX} ? INT64_MAX : static_cast<int64_t>(u);
        break;
      }
      default:
        bad(key, "is {}, expected an integer token id", describe(key));
    }
    if (v < 0 || static_cast<uint64_t>(v) >= n)
      bad(key, "token id {} is outside the vocabulary ({} tokens in {})", v, n, kTokensKey);
    return static_cast<int32_t>(v);
  }

  const io::GgufFile& file() const { return f_; }

 private:
  const io::GgufFile& f_;
};

// What both kinds of vocabulary read.
struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;  // kGgufToken*; NORMAL for all when the file has none
  std::vector<float> scores;   // 0 for all when the file has none
  // Map from token text to id (views into `tokens`): every token is unique.
  std::unordered_map<std::string_view, int32_t> ids;
  int32_t bos = -1, eos = -1, unk = -1, pad = -1, eot = -1, eom = -1;
  std::optional<bool> add_bos, add_eos;
  std::string chat_template;

  size_t size() const { return tokens.size(); }
};

Vocab read_vocab(const Keys& k) {
  Vocab v;
  if (!k.has(kTokensKey)) k.bad(kTokensKey, "missing: a vocabulary needs its tokens");
  k.expect_array(kTokensKey, GgufType::kString, kMaxTokens);
  v.tokens = k.file().get_string_array(kTokensKey);
  const size_t n = v.tokens.size();
  if (n == 0) k.bad(kTokensKey, "is empty");

  if (k.has(kTypesKey)) {
    // llama.cpp reads int32 types only.
    k.expect_array(kTypesKey, GgufType::kI32, kMaxTokens);
    v.types = k.file().get_array<int32_t>(kTypesKey);
    if (v.types.size() != n)
      k.bad(kTypesKey, "has {} entries but {} has {}: one type per token", v.types.size(),
            kTokensKey, n);
    for (size_t i = 0; i < n; ++i)
      if (v.types[i] < kGgufTokenNormal || v.types[i] > kGgufTokenByte)
        k.bad(fmt::format("{}[{}]", kTypesKey, i),
              "{} is not a token type (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, "
              "6 byte)",
              v.types[i]);
  } else {
    v.types.assign(n, kGgufTokenNormal);
  }

  if (k.has(kScoresKey)) {
    const GgufType elem = k.file().type(kScoresKey) == GgufType::kArray
                              ? k.file().array_type(kScoresKey)
                              : GgufType::kF32;
    // llama.cpp takes float32 or int32 scores.
    if (elem == GgufType::kI32) {
      k.expect_array(kScoresKey, GgufType::kI32, kMaxTokens);
      const std::vector<int32_t> s = k.file().get_array<int32_t>(kScoresKey);
      v.scores.assign(s.begin(), s.end());
    } else {
      k.expect_array(kScoresKey, GgufType::kF32, kMaxTokens);
      v.scores = k.file().get_array<float>(kScoresKey);
    }
    if (v.scores.size() != n)
      k.bad(kScoresKey, "has {} entries but {} has {}: one score per token", v.scores.size(),
            kTokensKey, n);
  } else {
    v.scores.assign(n, 0.0f);
  }

  // Empty tokens become "[EMPTY_i]", as llama.cpp renames them; duplicates make ids
  // ambiguous (llama.cpp asserts there are none).
  size_t empty = 0;
  v.ids.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    std::string& t = v.tokens[i];
    if (t.empty()) {
      t = fmt::format("[EMPTY_{}]", i);
      ++empty;
    }
    if (t.size() > kMaxTokenBytes)
      k.bad(fmt::format("{}[{}]", kTokensKey, i), "is {} bytes long; more than {} is not a token",
            t.size(), kMaxTokenBytes);
  }
  for (size_t i = 0; i < n; ++i) {
    const auto [at, fresh] = v.ids.emplace(v.tokens[i], static_cast<int32_t>(i));
    if (!fresh)
      k.bad(fmt::format("{}[{}]", kTokensKey, i),
            "'{}' is also token {}: each token must be unique", v.tokens[i].substr(0, 200),
            at->second);
  }
  if (empty > 0)
    log_warn("gguf tokenizer: {}: {}: {} empty token(s) named [EMPTY_<id>], as llama.cpp does",
             k.path(), kTokensKey, empty);

  v.bos = k.id(kBosKey, n);
  v.eos = k.id(kEosKey, n);
  v.unk = k.id(kUnkKey, n);
  v.pad = k.id(kPadKey, n);
  v.eot = k.id(kEotKey, n);
  v.eom = k.id(kEomKey, n);
  v.add_bos = k.flag(kAddBosKey);
  v.add_eos = k.flag(kAddEosKey);
  if (k.has(kChatTemplateKey)) {
    v.chat_template = k.string(kChatTemplateKey);
    if (const size_t at = utf8_invalid_at(v.chat_template); at != std::string::npos)
      k.bad(kChatTemplateKey, "is not valid UTF-8 (byte {})", at);
  }
  return v;
}

// The end-of-turn ids besides eos: the file's eot/eom, and the control tokens spelled as
// the chat formats' end-of-turn tokens.
std::vector<int32_t> end_of_turn_ids(const Vocab& v) {
  std::vector<int32_t> out;
  auto add = [&](int32_t id) {
    if (id >= 0 && id != v.eos && std::find(out.begin(), out.end(), id) == out.end())
      out.push_back(id);
  };
  add(v.eot);
  add(v.eom);
  for (const char* name : kEndOfTurnTokens)
    if (auto it = v.ids.find(name); it != v.ids.end() && v.types[it->second] == kGgufTokenControl)
      add(it->second);
  return out;
}

// ---- "gpt2": a byte-level BPE as a tokenizer.json.

// A pre-tokenizer llama.cpp names in tokenizer.ggml.pre, written as the Hugging Face
// tokenizer.json of the models that carry the name does (llama-vocab.cpp lists the regexes
// llama.cpp runs for each; where it adapted a regex to its own engine, the original is here).
struct PreTokenizer {
  std::vector<const char*> names;
  std::vector<const char*> splits;  // Split regexes (behavior Isolated), in order
  bool byte_level_regex = false;    // ByteLevel's own GPT-2 split (use_regex)
  bool nfc = false;                 // the original tokenizer's NFC normalizer
  bool ignore_merges = false;       // a word that is a token is that token (Llama 3, Tekken)
  bool add_bos = false;             // llama.cpp's add_bos when add_bos_token is absent
};

constexpr const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen35Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kTekkenSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const std::vector<PreTokenizer>& pre_tokenizers() {
  static const std::vector<PreTokenizer> table = {
      // llama.cpp's own split for a file that names none (its "default"; GPT-2's regex
      // between punctuation and digit splits).
      {{"default"},
       {R"([\p{P}\$\+<=>\^~\|]+)",
        R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))", R"(\p{N}+)",
        R"([0-9][0-9][0-9])"}},
      {{"gpt-2", "phi-2"}, {}, /*byte_level_regex=*/true},
      {{"llama-bpe", "llama3", "llama-v3"},
       {kLlama3Split},
       false,
       false,
       /*ignore_merges=*/true,
       /*add_bos=*/true},
      {{"dbrx", "smaug-bpe"}, {kLlama3Split}},
      // Qwen's tokenizers (and DeepSeek's distillations of Qwen, which keep its tokenizer).
      {{"qwen2", "deepseek-r1-qwen"}, {kQwen2Split}, false, /*nfc=*/true},
      {{"qwen35"}, {kQwen35Split}, false, /*nfc=*/true},
      {{"tekken"}, {kTekkenSplit}, false, false, /*ignore_merges=*/true, /*add_bos=*/true},
      // Digits one by one, then GPT-2's regex.
      {{"starcoder", "smollm"}, {R"(\p{N})"}, /*byte_level_regex=*/true},
  };
  return table;
}

// JSON string syntax for text already checked to be valid UTF-8.
void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u < 0x20) {
      fmt::format_to(std::back_inserter(out), "\\u{:04x}", u);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
}

Tokenizer bpe_tokenizer(const Keys& k) {
  Vocab v = read_vocab(k);
  const size_t n = v.size();

  std::string pre_name = "default";
  if (k.has(kPreKey)) {
    pre_name = k.string(kPreKey);
  } else {
    log_warn(
        "gguf tokenizer: {}: no {}: splitting text as llama.cpp does without one (its "
        "\"default\"), which is likely not how the model was trained",
        k.path(), kPreKey);
  }
  const PreTokenizer* pre = nullptr;
  std::vector<std::string> supported;
  for (const PreTokenizer& p : pre_tokenizers())
    for (const char* name : p.names) {
      supported.emplace_back(name);
      if (pre_name == name) pre = &p;
    }
  if (pre == nullptr)
    k.bad(kPreKey, "'{}' is not a pre-tokenizer hyperion reproduces (supported: {})", pre_name,
          fmt::join(supported, ", "));

  // JSON needs UTF-8, and byte-level tokens are (the GPT-2 alphabet).
  for (size_t i = 0; i < n; ++i)
    if (const size_t at = utf8_invalid_at(v.tokens[i]); at != std::string::npos)
      k.bad(fmt::format("{}[{}]", kTokensKey, i), "is not valid UTF-8 (byte {})", at);

  // The trailing UNUSED tokens are the model's padded embedding rows, not tokens (the
  // original tokenizer.json has none there), unless a special id names one.
  size_t kept = n;
  const int32_t named = std::max({v.bos, v.eos, v.unk, v.pad, v.eot, v.eom});
  while (kept > 1 && static_cast<int64_t>(kept) > int64_t{named} + 1 &&
         v.types[kept - 1] == kGgufTokenUnused)
    --kept;
  auto kept_id = [&](std::string_view t) {
    const auto it = v.ids.find(t);
    return it != v.ids.end() && static_cast<size_t>(it->second) < kept ? it->second : -1;
  };

  if (!k.has(kMergesKey))
    k.bad(kMergesKey, "missing: a BPE vocabulary (\"gpt2\") needs its merges");
  k.expect_array(kMergesKey, GgufType::kString, kMaxMerges);
  const std::vector<std::string> merges = k.file().get_string_array(kMergesKey);

  const bool add_bos = v.add_bos.value_or(pre->add_bos);
  const bool add_eos = v.add_eos.value_or(false);
  if (add_bos && v.bos < 0) k.bad(kAddBosKey, "is true, but the file has no {}", kBosKey);
  if (add_eos && v.eos < 0) k.bad(kAddEosKey, "is true, but the file has no {}", kEosKey);

  // The large parts (vocabulary, merges, added tokens) are written as text directly; the
  // rest through nlohmann::json.
  size_t bytes = 0;
  for (size_t i = 0; i < kept; ++i) bytes += v.tokens[i].size() + 16;
  for (const std::string& m : merges) bytes += m.size() + 8;
  std::string out;
  out.reserve(bytes + 4096);
  out += R"({"version":"1.0","truncation":null,"padding":null,"added_tokens":[)";
  bool first = true;
  for (size_t i = 0; i < kept; ++i) {
    const int32_t type = v.types[i];
    if (type != kGgufTokenControl && type != kGgufTokenUserDefined) continue;
    if (!first) out.push_back(',');
    first = false;
    fmt::format_to(std::back_inserter(out), R"({{"id":{},"content":)", i);
    append_json_string(out, v.tokens[i]);
    fmt::format_to(
        std::back_inserter(out),
        R"(,"single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":{}}})",
        type == kGgufTokenControl);
  }
  out += "],";

  json pre_tokenizer = json::array();
  for (const char* re : pre->splits)
    pre_tokenizer.push_back({{"type", "Split"},
                             {"pattern", {{"Regex", re}}},
                             {"behavior", "Isolated"},
                             {"invert", false}});
  pre_tokenizer.push_back({{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", pre->byte_level_regex}});
  if (pre_tokenizer.size() > 1)
    pre_tokenizer = {{"type", "Sequence"}, {"pretokenizers", std::move(pre_tokenizer)}};
  else
    pre_tokenizer = json(pre_tokenizer[0]);

  json post = nullptr;
  if (add_bos || add_eos) {
    json specials = json::object();
    auto special = [&](int32_t id, int type_id) {
      const std::string& t = v.tokens[static_cast<size_t>(id)];
      specials[t] = {{"id", t}, {"ids", json::array({id})}, {"tokens", json::array({t})}};
      return json{{"SpecialToken", {{"id", t}, {"type_id", type_id}}}};
    };
    json single = json::array(), pair = json::array();
    for (int seq = 0; seq < 2; ++seq) {
      if (add_bos) pair.push_back(special(v.bos, seq));
      pair.push_back({{"Sequence", {{"id", seq == 0 ? "A" : "B"}, {"type_id", seq}}}});
      if (add_eos) pair.push_back(special(v.eos, seq));
    }
    if (add_bos) single.push_back(special(v.bos, 0));
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    if (add_eos) single.push_back(special(v.eos, 0));
    post = {{"type", "TemplateProcessing"},
            {"single", std::move(single)},
            {"pair", std::move(pair)},
            {"special_tokens", std::move(specials)}};
  }
  const json decoder = {{"type", "ByteLevel"},
                        {"add_prefix_space", true},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  out += R"("normalizer":)";
  out += pre->nfc ? R"({"type":"NFC"})" : "null";
  out += R"(,"pre_tokenizer":)" + pre_tokenizer.dump();
  out += R"(,"post_processor":)" + post.dump();
  out += R"(,"decoder":)" + decoder.dump();
  fmt::format_to(
      std::back_inserter(out),
      R"(,"model":{{"type":"BPE","dropout":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":{},"vocab":{{)",
      pre->ignore_merges);
  for (size_t i = 0; i < kept; ++i) {
    if (i > 0) out.push_back(',');
    append_json_string(out, v.tokens[i]);
    fmt::format_to(std::back_inserter(out), ":{}", i);
  }
  out += R"(},"merges":[)";
  // "left right", split at the first space after the first byte as llama.cpp does; both
  // sides and their concatenation must be tokens (the tokenizers library refuses a merge
  // that is not; llama.cpp would never apply it).
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (space == std::string::npos)
      k.bad(fmt::format("{}[{}]", kMergesKey, i), "'{}' is not two tokens separated by a space",
            m.substr(0, 200));
    const std::string_view left(m.data(), space), right(m.data() + space + 1, m.size() - space - 1);
    joined.assign(left);
    joined.append(right);
    for (const std::string_view part : {left, right, std::string_view(joined)})
      if (kept_id(part) < 0)
        k.bad(fmt::format("{}[{}]", kMergesKey, i), "'{}': '{}' is not a token of {}",
              m.substr(0, 200), std::string(part.substr(0, 200)), kTokensKey);
    if (i > 0) out.push_back(',');
    out.push_back('[');
    append_json_string(out, left);
    out.push_back(',');
    append_json_string(out, right);
    out.push_back(']');
  }
  out += "]}}";

  json config = json::object();
  auto token_or_null = [&](int32_t id) {
    return id >= 0 ? json(v.tokens[static_cast<size_t>(id)]) : json(nullptr);
  };
  config["bos_token"] = token_or_null(v.bos);
  config["eos_token"] = token_or_null(v.eos);
  if (v.pad >= 0) config["pad_token"] = token_or_null(v.pad);
  if (v.unk >= 0) config["unk_token"] = token_or_null(v.unk);
  if (!v.chat_template.empty()) config["chat_template"] = v.chat_template;
  config["tokenizer_class"] = "PreTrainedTokenizerFast";

  // End-of-turn ids besides eos ride in generation_config.json's eos_token_id, as Hugging
  // Face models list them (hf_tokenizer.h reads it; its own list of end-of-turn spellings
  // covers the rest).
  std::string generation_config;
  if (v.eot >= 0 || v.eom >= 0) {
    json ends = json::array();
    for (int32_t id : {v.eos, v.eot, v.eom})
      if (id >= 0 && std::find(ends.begin(), ends.end(), json(id)) == ends.end())
        ends.push_back(id);
    generation_config = json{{"eos_token_id", std::move(ends)}}.dump();
  }
  return Tokenizer::from_hf_json(std::move(out), config.dump(), std::move(generation_config),
                                 k.path());
}

// ---- "llama": a SentencePiece vocabulary as a SentencePiece model.

// The protocol buffer wire format, as much as sentencepiece_model.proto needs (Debian's
// libsentencepiece-dev ships no generated header): varints (wire type 0), 32-bit floats
// (5) and length-delimited strings and messages (2).
class ProtoWriter {
 public:
  void varint_field(uint32_t field, uint64_t value) {
    key(field, 0);
    varint(value);
  }
  void float_field(uint32_t field, float value) {
    key(field, 5);
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof bits);
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
  }
  void bytes_field(uint32_t field, std::string_view bytes) {
    key(field, 2);
    varint(bytes.size());
    out_.append(bytes);
  }
  const std::string& bytes() const { return out_; }
  void clear() { out_.clear(); }

 private:
  void key(uint32_t field, uint32_t wire) { varint((uint64_t{field} << 3) | wire); }
  void varint(uint64_t v) {
    for (; v >= 0x80; v >>= 7) out_.push_back(static_cast<char>((v & 0x7F) | 0x80));
    out_.push_back(static_cast<char>(v));
  }
  std::string out_;
};

// sentencepiece_model.proto's field numbers, those written here.
namespace sp_field {
// ModelProto
constexpr uint32_t kPieces = 1, kTrainerSpec = 2, kNormalizerSpec = 3;
// ModelProto.SentencePiece: its type enum is GGUF's token type (llama.cpp took it from there).
constexpr uint32_t kPiece = 1, kScore = 2, kType = 3;
// TrainerSpec: model_type (BPE = 2), vocab_size, byte_fallback, and the pieces the
// processor's unk_id()/bos_id()/eos_id()/pad_id() look up.
constexpr uint32_t kModelType = 3, kVocabSize = 4, kByteFallback = 35, kUnkSurface = 44,
                   kUnkPiece = 45, kBosPiece = 46, kEosPiece = 47, kPadPiece = 48;
constexpr uint64_t kBpe = 2;
// NormalizerSpec
constexpr uint32_t kName = 1, kAddDummyPrefix = 3, kRemoveExtraWhitespaces = 4,
                   kEscapeWhitespaces = 5;
}  // namespace sp_field

// "<0xXX>" (upper-case hex, as SentencePiece and llama.cpp spell byte pieces): the byte,
// or -1.
int byte_piece_value(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  int value = 0;
  for (const char c : t.substr(3, 2)) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

Tokenizer sentencepiece_tokenizer(const Keys& k) {
  Vocab v = read_vocab(k);
  const size_t n = v.size();
  std::vector<int32_t>& types = v.types;

  // The ids llama.cpp assumes when the file names none: unk 0 (here the UNKNOWN token, if
  // there is one), bos 1, eos 2, each unless it would be the unknown token.
  if (!k.has(kUnkKey)) {
    const auto it = std::find(types.begin(), types.end(), kGgufTokenUnknown);
    v.unk = it != types.end() ? static_cast<int32_t>(it - types.begin()) : 0;
  }
  for (auto [key, id, def] : {std::tuple{kBosKey, &v.bos, 1}, std::tuple{kEosKey, &v.eos, 2}}) {
    if (!k.has(key)) *id = static_cast<size_t>(def) < n && def != v.unk ? def : -1;
    if (*id >= 0 && *id == v.unk) k.bad(key, "is {}, the unknown token's id ({})", *id, kUnkKey);
  }

  // One UNKNOWN piece (SentencePiece allows no second; llama.cpp never produces one from
  // text); bos, eos and pad are control pieces, which SentencePiece requires of them.
  for (size_t i = 0; i < n; ++i)
    if (types[i] == kGgufTokenUnknown) types[i] = kGgufTokenControl;
  types[static_cast<size_t>(v.unk)] = kGgufTokenUnknown;
  for (int32_t id : {v.bos, v.eos, v.pad})
    if (id >= 0 && id != v.unk) types[static_cast<size_t>(id)] = kGgufTokenControl;

  bool bytes_seen[256] = {};
  int byte_count = 0;
  for (size_t i = 0; i < n; ++i) {
    if (types[i] != kGgufTokenByte) continue;
    const int b = byte_piece_value(v.tokens[i]);
    if (b < 0)
      k.bad(fmt::format("{}[{}]", kTokensKey, i),
            "'{}' has type BYTE (6) in {} but is not spelled <0xXX>", v.tokens[i].substr(0, 200),
            kTypesKey);
    if (!bytes_seen[b]) ++byte_count;
    bytes_seen[b] = true;
  }
  // Byte fallback spells any character the pieces lack in bytes: llama.cpp's tokenizer
  // needs all 256 for it, SentencePiece refuses fewer.
  if (byte_count > 0 && byte_count < 256) {
    int missing = 0;
    while (bytes_seen[missing]) ++missing;
    k.bad(kTypesKey,
          "{} tokens have type BYTE (6), but byte fallback needs all 256 (<0x{:02X}> is "
          "missing)",
          byte_count, missing);
  }

  ProtoWriter model, part;
  for (size_t i = 0; i < n; ++i) {
    part.clear();
    part.bytes_field(sp_field::kPiece, v.tokens[i]);
    part.float_field(sp_field::kScore, v.scores[i]);
    part.varint_field(sp_field::kType, static_cast<uint64_t>(types[i]));
    model.bytes_field(sp_field::kPieces, part.bytes());
  }
  // A piece that is not a control piece makes SentencePiece report "none": the unknown
  // piece stands for a missing bos, eos or pad.
  const std::string& unk_piece = v.tokens[static_cast<size_t>(v.unk)];
  auto piece_or_none = [&](int32_t id) -> const std::string& {
    return id >= 0 && id != v.unk ? v.tokens[static_cast<size_t>(id)] : unk_piece;
  };
  part.clear();
  part.varint_field(sp_field::kModelType, sp_field::kBpe);
  part.varint_field(sp_field::kVocabSize, n);
  part.varint_field(sp_field::kByteFallback, byte_count == 256 ? 1 : 0);
  // The unknown token decodes to nothing, as llama.cpp and transformers leave it out
  // (SentencePiece writes U+2047 by default).
  part.bytes_field(sp_field::kUnkSurface, "");
  part.bytes_field(sp_field::kUnkPiece, unk_piece);
  part.bytes_field(sp_field::kBosPiece, piece_or_none(v.bos));
  part.bytes_field(sp_field::kEosPiece, piece_or_none(v.eos));
  part.bytes_field(sp_field::kPadPiece, piece_or_none(v.pad));
  model.bytes_field(sp_field::kTrainerSpec, part.bytes());
  // Llama's normalisation: none, whitespace kept as it is and escaped as U+2581, a dummy
  // prefix unless add_space_prefix is false (Gemma). llama.cpp ignores
  // remove_extra_whitespaces for this vocabulary, so it is off.
  part.clear();
  part.bytes_field(sp_field::kName, "identity");
  part.varint_field(sp_field::kAddDummyPrefix, k.flag(kAddSpacePrefixKey).value_or(true) ? 1 : 0);
  part.varint_field(sp_field::kRemoveExtraWhitespaces, 0);
  part.varint_field(sp_field::kEscapeWhitespaces, 1);
  model.bytes_field(sp_field::kNormalizerSpec, part.bytes());

  SentencePieceExtras extras;
  extras.chat_template = std::move(v.chat_template);
  extras.end_ids = end_of_turn_ids(v);
  // What llama.cpp finds whole in text before SentencePiece runs (its special-token
  // partition): control, user-defined and unknown tokens.
  for (size_t i = 0; i < n; ++i)
    if (types[i] == kGgufTokenControl || types[i] == kGgufTokenUserDefined ||
        types[i] == kGgufTokenUnknown)
      extras.whole_tokens.push_back(static_cast<int32_t>(i));
  extras.add_bos = v.add_bos.value_or(true);
  extras.add_eos = v.add_eos.value_or(false);
  if (extras.add_bos && v.bos < 0) k.bad(kAddBosKey, "is true, but the file has no {}", kBosKey);
  if (extras.add_eos && v.eos < 0) k.bad(kAddEosKey, "is true, but the file has no {}", kEosKey);
  try {
    return Tokenizer::from_serialized(model.bytes(), k.path(), extras);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    usage_fail("gguf tokenizer: {}: {}: SentencePiece does not take this vocabulary: {}", k.path(),
               kTokensKey, e.what());
  }
}

}  // namespace

std::vector<std::string> gguf_pre_tokenizer_names() {
  std::vector<std::string> out;
  for (const PreTokenizer& p : pre_tokenizers())
    for (const char* name : p.names) out.emplace_back(name);
  return out;
}

Tokenizer tokenizer_from_gguf(const io::GgufFile& f) {
  const Keys k(f);
  if (!k.has(kModelKey))
    k.bad(kModelKey, "missing: the file carries no tokenizer (tokenizer.ggml.* keys)");
  const std::string model = k.string(kModelKey);
  if (model == "gpt2") return bpe_tokenizer(k);
  if (model == "llama") return sentencepiece_tokenizer(k);
  k.bad(kModelKey,
        "'{}' is not a vocabulary hyperion reads (supported: \"llama\", a SentencePiece "
        "vocabulary; \"gpt2\", a byte-level BPE)",
        model);
}

}  // namespace hyperion::text
