// GGUF vocabularies from a checkpoint's tokenizer (text/gguf_vocab.h).
#include "text/gguf_vocab.h"

#include <sentencepiece_processor.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "base/error.h"
#include "base/log.h"
#include "io/atomic_file.h"
#include "text/tokenizer.h"

namespace hyperion::text {

namespace {

// The normalizer settings llama.cpp's SentencePiece tokenizer must reproduce.
struct SpNormalizer {
  std::string normalizer = "identity";
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
};

// Reads a protobuf varint at p (bounded by end); false on truncation.
bool read_varint(const unsigned char*& p, const unsigned char* end, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const unsigned char b = *p++;
    v |= uint64_t(b & 0x7F) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return true;
    }
  }
  return false;
}

// ModelProto.normalizer_spec (field 3): name (1), add_dummy_prefix (3),
// remove_extra_whitespaces (4). Debian's SentencePiece ships no generated proto header,
// so the serialized model is walked directly (wire types 0, 1, 2 and 5 only).
void read_normalizer(const std::string& proto, SpNormalizer* v) {
  auto walk = [](const unsigned char* p, const unsigned char* end, auto&& on_field) {
    while (p < end) {
      uint64_t key = 0;
      if (!read_varint(p, end, &key)) return;
      const uint32_t field = uint32_t(key >> 3), wire = uint32_t(key & 7);
      uint64_t value = 0;
      if (wire == 0) {
        if (!read_varint(p, end, &value)) return;
        on_field(field, wire, value, nullptr, 0);
      } else if (wire == 2) {
        if (!read_varint(p, end, &value) || value > uint64_t(end - p)) return;
        on_field(field, wire, 0, p, size_t(value));
        p += value;
      } else if (wire == 1 || wire == 5) {
        const size_t n = wire == 1 ? 8 : 4;
        if (size_t(end - p) < n) return;
        p += n;
      } else {
        return;
      }
    }
  };
  const auto* begin = reinterpret_cast<const unsigned char*>(proto.data());
  walk(begin, begin + proto.size(),
       [&](uint32_t field, uint32_t wire, uint64_t, const unsigned char* data, size_t n) {
         if (field != 3 || wire != 2) return;
         walk(data, data + n,
              [&](uint32_t f, uint32_t w, uint64_t value, const unsigned char* d, size_t len) {
                if (f == 1 && w == 2) v->normalizer.assign(reinterpret_cast<const char*>(d), len);
                if (f == 3 && w == 0) v->add_dummy_prefix = value != 0;
                if (f == 4 && w == 0) v->remove_extra_whitespaces = value != 0;
              });
       });
}

// As convert_hf_to_gguf.py's _create_vocab_sentencepiece: pieces, scores and types from
// the SentencePiece model, padded up to the config's vocab_size with "[PADi]" entries of
// score -10000 and type UNUSED.
GgufVocab read_sentencepiece_vocab(const std::string& dir, int64_t vocab_size) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer.model").string();
  sentencepiece::SentencePieceProcessor sp;
  const auto status = sp.Load(path);
  HYP_CHECK(status.ok(),
            "gguf convert: {}: tokenizer.model: cannot load SentencePiece model '{}': {}", dir,
            path, status.ToString());
  const int64_t n = sp.GetPieceSize();
  HYP_CHECK(n <= vocab_size,
            "gguf convert: {}: tokenizer.model has {} pieces but config.json vocab_size is {}", dir,
            n, vocab_size);
  GgufVocab v;
  v.model = "llama";
  v.tokens.resize(size_t(vocab_size));
  v.scores.assign(size_t(vocab_size), -10000.0f);
  v.types.assign(size_t(vocab_size), kGgufTokenUnused);
  for (int64_t i = 0; i < vocab_size; ++i) v.tokens[size_t(i)] = fmt::format("[PAD{}]", i);
  for (int id = 0; id < static_cast<int>(n); ++id) {
    int32_t type = kGgufTokenNormal;
    if (sp.IsUnknown(id))
      type = kGgufTokenUnknown;
    else if (sp.IsControl(id))
      type = kGgufTokenControl;
    else if (sp.IsUnused(id))
      type = kGgufTokenUnused;
    else if (sp.IsByte(id))
      type = kGgufTokenByte;
    v.tokens[size_t(id)] = sp.IdToPiece(id);
    v.scores[size_t(id)] = sp.GetScore(id);
    v.types[size_t(id)] = type;
  }
  v.unk_id = sp.unk_id();
  SpNormalizer norm;
  read_normalizer(sp.serialized_model_proto(), &norm);
  v.add_space_prefix = norm.add_dummy_prefix;
  // llama.cpp's "llama" tokenizer neither normalises text nor collapses whitespace, so a
  // model that does would tokenize differently there: refuse rather than write a GGUF
  // that silently disagrees with training.
  HYP_CHECK(norm.normalizer == "identity" && !norm.remove_extra_whitespaces,
            "gguf convert: {}: tokenizer.model: normalizer '{}' with remove_extra_whitespaces={} "
            "is not reproduced by llama.cpp's SentencePiece tokenizer (train the tokenizer with "
            "--normalization_rule_name=identity --remove_extra_whitespaces=false)",
            dir, norm.normalizer, norm.remove_extra_whitespaces);
  return v;
}

// The split patterns of the byte-level pre-tokenizers llama.cpp implements, by the name
// its `tokenizer.ggml.pre` gives them (llama-vocab.cpp). llama.cpp itself recognises a
// tokenizer by hashing its output on test strings; the pattern says the same here.
struct KnownPre {
  const char* name;
  const char* pattern;
};
constexpr KnownPre kKnownPre[] = {
    {"llama-bpe",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
    {"qwen2",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
};

// Tokens llama.cpp's converter marks CONTROL although the file does not call them special.
bool looks_special(const std::string& t) {
  return (t.size() >= 4 && t.rfind("<|", 0) == 0 && t.compare(t.size() - 2, 2, "|>") == 0) ||
         t == "<pad>" || t == "<mask>";
}

// As convert_hf_to_gguf.py's _set_vocab_gpt2: every id of the model's vocabulary, the file's
// token where it has one (added tokens: CONTROL when special, else USER_DEFINED), "[PADi]"
// of type UNUSED where it has none; the merges as "left right" in rank order.
GgufVocab read_bpe_vocab(const std::string& dir, int64_t vocab_size) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer.json").string();
  const std::string where = fmt::format("gguf convert: {}: tokenizer.json", dir);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(io::read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", where, e.what());
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  const nlohmann::json& model = j.value("model", nlohmann::json::object());
  HYP_CHECK(model.value("type", std::string()) == "BPE",
            "{}: model.type '{}': GGUF's BPE vocabulary (\"gpt2\") needs a BPE model", where,
            model.value("type", std::string()));
  // The pre-tokenizers, flattened out of a Sequence.
  std::vector<nlohmann::json> pre;
  const nlohmann::json& pt = j.value("pre_tokenizer", nlohmann::json());
  if (pt.is_object() && pt.value("type", std::string()) == "Sequence") {
    for (const auto& p : pt.value("pretokenizers", nlohmann::json::array())) pre.push_back(p);
  } else if (pt.is_object()) {
    pre.push_back(pt);
  }
  const nlohmann::json* byte_level = nullptr;
  std::vector<std::string> patterns;
  for (const auto& p : pre) {
    const std::string type = p.value("type", std::string());
    if (type == "ByteLevel") {
      byte_level = &p;
    } else if (type == "Split" && p.contains("pattern") && p["pattern"].contains("Regex") &&
               p.value("behavior", std::string()) == "Isolated" && !p.value("invert", false)) {
      patterns.push_back(p["pattern"]["Regex"].get<std::string>());
    } else {
      fail("{}: pre_tokenizer {} is not one llama.cpp's BPE vocabulary runs (a byte-level "
           "model after one Split regex, as Llama 3 and Qwen have)",
           where, p.dump().substr(0, 200));
    }
  }
  HYP_CHECK(byte_level != nullptr,
            "{}: the BPE model is not byte-level (no ByteLevel pre-tokenizer): llama.cpp's BPE "
            "vocabulary (\"gpt2\") is byte-level only",
            where);
  HYP_CHECK(!byte_level->value("add_prefix_space", false),
            "{}: pre_tokenizer ByteLevel has add_prefix_space = true, which llama.cpp's BPE "
            "vocabulary does not do",
            where);
  GgufVocab v;
  v.model = "gpt2";
  if (patterns.empty() && byte_level->value("use_regex", true)) v.pre = "gpt-2";
  if (patterns.size() == 1 && !byte_level->value("use_regex", true))
    for (const KnownPre& k : kKnownPre)
      if (patterns[0] == k.pattern) v.pre = k.name;
  HYP_CHECK(!v.pre.empty(),
            "{}: the pre-tokenizer's split pattern{} {} is not one llama.cpp knows (Llama 3's "
            "llama-bpe, Qwen's qwen2, GPT-2's): a GGUF would split text differently there",
            where, patterns.size() == 1 ? "" : "s",
            patterns.empty() ? std::string("(none, with ByteLevel use_regex = false)")
                             : nlohmann::json(patterns).dump());
  const nlohmann::json& norm = j.value("normalizer", nlohmann::json());
  HYP_CHECK(norm.is_null() || norm.value("type", std::string()) == "NFC",
            "{}: normalizer {} is not reproduced by llama.cpp's BPE vocabulary (none, or NFC "
            "as Qwen's, is)",
            where, norm.dump().substr(0, 200));
  if (!norm.is_null())
    log_warn("{}: llama.cpp does not run the NFC normalizer (as with its own converter's Qwen "
             "files): a text not in NFC (decomposed accents) tokenizes differently there",
             where);

  std::vector<std::string> tokens(static_cast<size_t>(vocab_size));
  std::vector<int32_t> types(static_cast<size_t>(vocab_size), kGgufTokenUnused);
  for (int64_t i = 0; i < vocab_size; ++i) tokens[size_t(i)] = fmt::format("[PAD{}]", i);
  auto place = [&](const std::string& token, int64_t id, int32_t type, const char* key) {
    HYP_CHECK(id >= 0 && id < vocab_size,
              "{}: {} '{}' has id {} but config.json vocab_size is {}", where, key, token, id,
              vocab_size);
    tokens[size_t(id)] = token;
    types[size_t(id)] = type;
  };
  HYP_CHECK(model.contains("vocab") && model["vocab"].is_object(),
            "{}: model.vocab is missing or not an object", where);
  for (const auto& [token, id] : model["vocab"].items()) {
    HYP_CHECK(id.is_number_integer(), "{}: model.vocab['{}'] is not an integer id", where, token);
    place(token, id.get<int64_t>(), kGgufTokenNormal, "model.vocab token");
  }
  for (const auto& t : j.value("added_tokens", nlohmann::json::array())) {
    const std::string content = t.value("content", std::string());
    const bool special = t.value("special", false) || looks_special(content);
    place(content, t.value("id", int64_t{-1}), special ? kGgufTokenControl : kGgufTokenUserDefined,
          "added token");
  }
  v.tokens = std::move(tokens);
  v.types = std::move(types);
  for (const auto& m : model.value("merges", nlohmann::json::array())) {
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      HYP_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                "{}: merge '{}' is not two tokens separated by one space", where, s);
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else {
      HYP_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                "{}: merge {} is not a pair of tokens", where, m.dump());
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
      HYP_CHECK(left.find(' ') == std::string::npos && right.find(' ') == std::string::npos,
                "{}: merge {} has a space inside a token, which GGUF's \"left right\" merges "
                "cannot carry",
                where, m.dump());
    }
    v.merges.push_back(left + " " + right);
  }
  return v;
}

}  // namespace

GgufVocab read_gguf_vocab(const std::string& dir, int64_t vocab_size) {
  const std::filesystem::path d(dir);
  const bool sp = std::filesystem::exists(d / "tokenizer.model");
  HYP_CHECK(sp || std::filesystem::exists(d / "tokenizer.json"),
            "gguf convert: {}: no tokenizer.model or tokenizer.json", dir);
  GgufVocab v = sp ? read_sentencepiece_vocab(dir, vocab_size) : read_bpe_vocab(dir, vocab_size);
  if (!sp) {
    // What the tokenizer adds around a text, and its chat template, as hyperion runs it
    // (loading it also checks that hyperion can tokenize with it).
    const Tokenizer tok = Tokenizer::load((d / "tokenizer.json").string());
    const std::vector<int32_t> ids = tok.encode_with_special_tokens("a");
    v.add_bos = tok.bos_id() >= 0 && !ids.empty() && ids.front() == tok.bos_id();
    v.add_eos = tok.eos_id() >= 0 && ids.size() > 1 && ids.back() == tok.eos_id();
    v.chat_template = tok.chat_template();
  }
  return v;
}

void write_gguf_vocab(io::GgufWriter& w, const GgufVocab& v, int64_t bos_id, int64_t eos_id,
                      int64_t pad_id) {
  w.set_string("tokenizer.ggml.model", v.model);
  if (!v.pre.empty()) w.set_string("tokenizer.ggml.pre", v.pre);
  w.set_string_array("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) w.set_f32_array("tokenizer.ggml.scores", v.scores);
  w.set_i32_array("tokenizer.ggml.token_type", v.types);
  if (!v.merges.empty()) w.set_string_array("tokenizer.ggml.merges", v.merges);
  if (bos_id >= 0) w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(bos_id));
  if (eos_id >= 0) w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(eos_id));
  if (v.unk_id >= 0) w.set_u32("tokenizer.ggml.unknown_token_id", uint32_t(v.unk_id));
  if (pad_id >= 0) w.set_u32("tokenizer.ggml.padding_token_id", uint32_t(pad_id));
  w.set_bool("tokenizer.ggml.add_bos_token", v.add_bos);
  w.set_bool("tokenizer.ggml.add_eos_token", v.add_eos);
  if (v.model == "llama") w.set_bool("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
  if (!v.chat_template.empty()) w.set_string("tokenizer.chat_template", v.chat_template);
}

}  // namespace hyperion::text
