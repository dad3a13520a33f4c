#include "text/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <filesystem>
#include <unordered_map>

#include "base/error.h"
#include "io/atomic_file.h"
#include "io/model_dir_file.h"
#include "text/hf_tokenizer.h"
#include "text/hf_tokenizer_impl.h"

namespace hyperion::text {

namespace fs = std::filesystem;

// Exactly one of `sp` (loaded) and `hf` is in use.
struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::unique_ptr<HfTokenizer> hf;
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<int32_t> end_ids;
  std::string origin;
  // SentencePiece only (SentencePieceExtras): a tokenizer.model has none of these.
  std::string chat_template;
  AddedTokenMatcher whole_tokens;
  bool add_bos = true, add_eos = false;

  std::vector<int32_t> sp_encode(std::string_view text) const;
};

std::string tokenizer_file_in(const std::string& dir) {
  std::error_code ec;
  // Whatever is there under the name: a directory, FIFO or device is then refused by name
  // when read (base/input_file.h), not taken for a missing file.
  for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
    const std::string f = (fs::path(dir) / name).string();
    if (fs::exists(fs::symlink_status(f, ec))) return io::model_dir_file(dir, name);
  }
  return {};
}

namespace {

// tokenizer_config.json and generation_config.json are a few KiB to a few MiB (a chat
// template, the added tokens); anything past this is not one.
constexpr int64_t kCompanionFileMaxBytes = int64_t{64} << 20;

// Feeds the training sentences to SentencePiece without a temporary file.
class VectorSentenceIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorSentenceIterator(const std::vector<std::string>& sentences)
      : sentences_(sentences) {}
  bool done() const override { return pos_ >= sentences_.size(); }
  void Next() override { ++pos_; }
  const std::string& value() const override { return sentences_[pos_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& sentences_;
  size_t pos_ = 0;
};

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

// SentencePiece trains on sentences, conventionally lines: a line never contains '\n',
// so newlines are encoded through byte fallback (<0x0A>) exactly as in Llama's tokenizer.
// Calls fn(line) for every non-blank line of every document, in order.
template <typename Fn>
void for_each_line(const std::vector<std::string>& documents, Fn&& fn) {
  for (const std::string& doc : documents) {
    size_t start = 0;
    while (start <= doc.size()) {
      size_t end = doc.find('\n', start);
      if (end == std::string::npos) end = doc.size();
      std::string_view line(doc.data() + start, end - start);
      if (!is_blank(line)) fn(line);
      start = end + 1;
    }
  }
}

// The training sentences: every line, or above `max_sentences` an evenly strided subset
// (SentencePiece would sample randomly; a fixed stride keeps training deterministic).
// Counted first so a large corpus is never copied whole.
std::vector<std::string> training_sentences(const std::vector<std::string>& documents,
                                            int64_t max_sentences) {
  int64_t total = 0;
  for_each_line(documents, [&](std::string_view) { ++total; });
  const int64_t keep = std::min(total, max_sentences);
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(keep));
  // Keeps lines floor(k * total / keep) for k = 0 .. keep - 1 (all of them when keep == total).
  int64_t i = 0;
  for_each_line(documents, [&](std::string_view line) {
    const int64_t k = static_cast<int64_t>(out.size());
    if (k < keep && i == k * total / keep) out.emplace_back(line);
    ++i;
  });
  return out;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    file = tokenizer_file_in(path);
    HYP_CHECK(!file.empty(),
              "tokenizer: the directory '{}' has neither tokenizer.json nor "
              "tokenizer.model",
              path);
  }
  std::string bytes;
  try {
    bytes = io::read_file(file);
  } catch (const Error& e) {
    fail("tokenizer: cannot load model: {}", e.what());
  }
  if (fs::path(file).extension() != ".json") return from_serialized(bytes, file);

  // tokenizer.json, with the files Hugging Face keeps beside it.
  HfTokenizerSource src;
  src.tokenizer_json = std::move(bytes);
  src.tokenizer_json_path = file;
  const fs::path dir = fs::path(file).parent_path();
  // A companion file that is there must be readable: one that is a directory or a FIFO is
  // an error naming it, not a silently lost chat template or end token.
  auto beside = [&](const char* name, std::string* out, std::string* out_path) {
    const fs::path f = dir / name;
    if (!fs::exists(fs::symlink_status(f, ec))) return;
    *out = io::read_file(io::model_dir_file(dir.string(), name), kCompanionFileMaxBytes);
    if (out_path) *out_path = f.string();
  };
  beside("tokenizer_config.json", &src.config_json, &src.config_json_path);
  beside("generation_config.json", &src.generation_config_json, &src.generation_config_path);
  beside("chat_template.jinja", &src.chat_template_override, nullptr);
  return from_hf_source(std::move(src), file);
}

Tokenizer Tokenizer::from_hf_json(std::string tokenizer_json, std::string config_json,
                                  std::string generation_config_json, std::string origin) {
  HfTokenizerSource src;
  src.tokenizer_json = std::move(tokenizer_json);
  src.tokenizer_json_path = origin + ": tokenizer.json";
  src.config_json = std::move(config_json);
  if (!src.config_json.empty()) src.config_json_path = origin + ": tokenizer_config.json";
  src.generation_config_json = std::move(generation_config_json);
  if (!src.generation_config_json.empty())
    src.generation_config_path = origin + ": generation_config.json";
  return from_hf_source(std::move(src), std::move(origin));
}

Tokenizer Tokenizer::from_hf_source(HfTokenizerSource&& src, std::string origin) {
  auto impl = std::make_unique<Impl>();
  // A malformed or unsupported file is bad input, like a bad flag: exit status 2.
  try {
    impl->hf = HfTokenizer::parse(src);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw_usage_error(e.what());
  }
  // Moved, not copied: tokenizer.json is many MB (33 for Gemma 3).
  impl->files.emplace_back("tokenizer.json", std::move(src.tokenizer_json));
  if (!src.config_json.empty())
    impl->files.emplace_back("tokenizer_config.json", std::move(src.config_json));
  if (!src.chat_template_override.empty())
    impl->files.emplace_back("chat_template.jinja", std::move(src.chat_template_override));
  // Carried too: its eos_token_id list is where end-of-turn tokens are named.
  if (!src.generation_config_json.empty())
    impl->files.emplace_back("generation_config.json", std::move(src.generation_config_json));
  impl->end_ids = impl->hf->end_ids();
  impl->origin = std::move(origin);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_serialized(const std::string& bytes, std::string origin) {
  HYP_CHECK(!bytes.empty(), "tokenizer: model '{}' is empty", origin);
  auto impl = std::make_unique<Impl>();
  auto status = impl->sp.LoadFromSerializedProto(bytes);
  HYP_CHECK(status.ok(), "tokenizer: '{}' is not a valid SentencePiece model ({})", origin,
            status.ToString());
  HYP_CHECK(impl->sp.GetPieceSize() > 0, "tokenizer: model '{}' has an empty vocabulary", origin);
  impl->files.emplace_back("tokenizer.model", bytes);
  if (impl->sp.eos_id() >= 0) impl->end_ids.push_back(impl->sp.eos_id());
  impl->origin = std::move(origin);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_serialized(const std::string& bytes, std::string origin,
                                     const SentencePieceExtras& extras) {
  Tokenizer tok = from_serialized(bytes, std::move(origin));
  Impl& m = *tok.impl_;
  const int32_t n = tok.vocab_size();
  auto in_vocab = [&](int32_t id, const char* what) {
    HYP_CHECK(id >= 0 && id < n, "tokenizer '{}': {} id {} is outside the vocabulary [0, {})",
              m.origin, what, id, n);
  };
  for (int32_t id : extras.end_ids) {
    in_vocab(id, "end");
    if (!tok.is_end(id)) m.end_ids.push_back(id);
  }
  for (int32_t id : extras.whole_tokens) {
    in_vocab(id, "whole-token");
    m.whole_tokens.add({m.sp.IdToPiece(id), id, false, false});
  }
  m.chat_template = extras.chat_template;
  m.add_bos = extras.add_bos;
  m.add_eos = extras.add_eos;
  return tok;
}

Tokenizer Tokenizer::train(const std::vector<std::string>& documents,
                           const std::string& output_model_path,
                           const TokenizerTrainOptions& opts) {
  HYP_CHECK(opts.vocab_size > 0, "tokenizer train: vocab_size must be positive, got {}",
            opts.vocab_size);
  HYP_CHECK(opts.model_type == "bpe" || opts.model_type == "unigram",
            "tokenizer train: model_type must be 'bpe' or 'unigram', got '{}'", opts.model_type);
  HYP_CHECK(opts.character_coverage > 0 && opts.character_coverage <= 1,
            "tokenizer train: character_coverage must be in (0, 1], got {}",
            opts.character_coverage);
  HYP_CHECK(opts.max_sentences > 0, "tokenizer train: max_sentences must be positive, got {}",
            opts.max_sentences);
  // Byte fallback reserves 256 ids next to unk/bos/eos.
  HYP_CHECK(!opts.byte_fallback || opts.vocab_size >= 259 + 1,
            "tokenizer train: vocab_size {} is too small for byte fallback (needs >= 260: 3 "
            "special + 256 byte tokens + at least one piece)",
            opts.vocab_size);

  const std::vector<std::string> sentences = training_sentences(documents, opts.max_sentences);
  HYP_CHECK(!sentences.empty(), "tokenizer train: no non-empty text among {} documents",
            documents.size());

  const std::unordered_map<std::string, std::string> kwargs = {
      {"model_type", opts.model_type},
      {"vocab_size", std::to_string(opts.vocab_size)},
      {"byte_fallback", opts.byte_fallback ? "true" : "false"},
      {"character_coverage", fmt::format("{}", opts.character_coverage)},
      {"num_threads", std::to_string(std::max(1, opts.num_threads))},
      {"input_sentence_size", "0"},  // use every sentence given (subsampled above)
      {"shuffle_input_sentence", "false"},
      {"max_sentence_length", "65536"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "true"},
      {"remove_extra_whitespaces", "false"},
      {"minloglevel", "2"},  // SentencePiece logs every step at INFO; errors come back as status
  };
  // Unigram training draws random numbers; pin the generator.
  sentencepiece::SetRandomGeneratorSeed(0x5eed);
  VectorSentenceIterator it(sentences);
  std::string model;
  auto status = sentencepiece::SentencePieceTrainer::Train(kwargs, &it, &model);
  HYP_CHECK(status.ok(),
            "tokenizer train: cannot train a {} vocabulary of size {} on {} sentences for '{}' "
            "(the corpus may be too small for this vocab_size): {}",
            opts.model_type, opts.vocab_size, sentences.size(), output_model_path,
            status.ToString());
  Tokenizer tok = from_serialized(model, output_model_path);
  HYP_CHECK(tok.vocab_size() == opts.vocab_size,
            "tokenizer train: corpus supports only {} pieces, asked for vocab_size {}",
            tok.vocab_size(), opts.vocab_size);
  io::write_file_atomic(output_model_path, model);
  return tok;
}

std::vector<int32_t> Tokenizer::Impl::sp_encode(std::string_view text) const {
  std::vector<int> ids;
  auto status = sp.Encode(text, &ids);
  HYP_CHECK(status.ok(), "tokenizer '{}': encode failed: {}", origin, status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  if (impl_->hf) return impl_->hf->encode(text);
  if (impl_->whole_tokens.empty()) return impl_->sp_encode(text);
  // Whole tokens first; SentencePiece on each stretch between them (its dummy prefix
  // included, as llama.cpp prefixes each stretch after a special token).
  std::vector<int32_t> ids;
  size_t pos = 0, begin = 0, end = 0;
  int32_t id = -1;
  auto stretch = [&](std::string_view s) {
    if (s.empty()) return;
    const std::vector<int32_t> part = impl_->sp_encode(s);
    ids.insert(ids.end(), part.begin(), part.end());
  };
  while (impl_->whole_tokens.find(text, pos, &begin, &end, &id)) {
    stretch(text.substr(pos, begin - pos));
    ids.push_back(id);
    pos = end;
  }
  stretch(text.substr(pos));
  return ids;
}

std::vector<int32_t> Tokenizer::encode_with_special_tokens(std::string_view text) const {
  if (impl_->hf) return impl_->hf->encode_with_special_tokens(text);
  std::vector<int32_t> ids;
  if (impl_->add_bos && bos_id() >= 0) ids.push_back(bos_id());
  const std::vector<int32_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  if (impl_->add_eos && eos_id() >= 0) ids.push_back(eos_id());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  if (impl_->hf) return impl_->hf->decode(ids, skip_special_tokens);
  const int32_t n = vocab_size();
  for (size_t i = 0; i < ids.size(); ++i) {
    HYP_CHECK(ids[i] >= 0 && ids[i] < n,
              "tokenizer '{}': decode: id {} at position {} is outside the vocabulary [0, {})",
              impl_->origin, ids[i], i, n);
  }
  std::string text;
  auto status = impl_->sp.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  HYP_CHECK(status.ok(), "tokenizer '{}': decode failed: {}", impl_->origin, status.ToString());
  return text;
}

std::string Tokenizer::id_to_piece(int32_t id) const {
  HYP_CHECK(id >= 0 && id < vocab_size(),
            "tokenizer '{}': id_to_piece: id {} is outside the vocabulary [0, {})", impl_->origin,
            id, vocab_size());
  return impl_->hf ? impl_->hf->piece(id) : impl_->sp.IdToPiece(id);
}

std::vector<std::string> Tokenizer::token_bytes() const {
  if (impl_->hf) return impl_->hf->token_bytes();
  const int32_t n = vocab_size();
  std::vector<std::string> out(static_cast<size_t>(n));
  static constexpr std::string_view kWordStart = "\xE2\x96\x81";  // U+2581
  for (int32_t id = 0; id < n; ++id) {
    if (impl_->sp.IsControl(id) || impl_->sp.IsUnknown(id)) continue;
    std::string piece = impl_->sp.IdToPiece(id);
    if (impl_->sp.IsByte(id) && piece.size() == 6 && piece.rfind("<0x", 0) == 0) {
      out[id] = std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
      continue;
    }
    std::string bytes;  // (built anew: GCC 12's -Wrestrict misreads an in-place replace)
    bytes.reserve(piece.size());
    for (size_t i = 0; i < piece.size();) {
      if (piece.compare(i, kWordStart.size(), kWordStart) == 0) {
        bytes += ' ';
        i += kWordStart.size();
      } else {
        bytes += piece[i++];
      }
    }
    out[id] = std::move(bytes);
  }
  return out;
}

int32_t Tokenizer::token_id(std::string_view token) const {
  if (impl_->hf) return impl_->hf->token_id(token);
  const int id = impl_->sp.PieceToId(token);
  return id == impl_->sp.unk_id() && token != impl_->sp.IdToPiece(id) ? -1 : id;
}

size_t Tokenizer::max_piece_bytes() const {
  if (impl_->hf) return impl_->hf->max_piece_bytes();
  size_t longest = 1;
  for (int32_t id = 0; id < vocab_size(); ++id)
    longest = std::max(longest, impl_->sp.IdToPiece(id).size());
  return longest;
}

int32_t Tokenizer::vocab_size() const {
  return impl_->hf ? impl_->hf->vocab_size() : impl_->sp.GetPieceSize();
}
bool Tokenizer::fits_model_vocab(int64_t model_vocab) const {
  return impl_->hf ? vocab_size() <= model_vocab : vocab_size() == model_vocab;
}
int32_t Tokenizer::bos_id() const {
  return impl_->hf ? impl_->hf->bos_id() : impl_->sp.bos_id();
}
int32_t Tokenizer::eos_id() const {
  return impl_->hf ? impl_->hf->eos_id() : impl_->sp.eos_id();
}
int32_t Tokenizer::unk_id() const {
  return impl_->hf ? impl_->hf->unk_id() : impl_->sp.unk_id();
}
int32_t Tokenizer::pad_id() const {
  return impl_->hf ? impl_->hf->pad_id() : impl_->sp.pad_id();
}
const std::vector<int32_t>& Tokenizer::end_ids() const {
  return impl_->end_ids;
}
bool Tokenizer::is_end(int32_t id) const {
  return std::find(impl_->end_ids.begin(), impl_->end_ids.end(), id) != impl_->end_ids.end();
}
bool Tokenizer::is_special(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  return impl_->hf ? impl_->hf->is_special(id) : impl_->sp.IsControl(id);
}
const std::string& Tokenizer::chat_template() const {
  return impl_->hf ? impl_->hf->chat_template() : impl_->chat_template;
}
std::string Tokenizer::bos_token() const {
  if (impl_->hf) return impl_->hf->bos_token();
  return bos_id() >= 0 ? impl_->sp.IdToPiece(bos_id()) : std::string();
}
std::string Tokenizer::eos_token() const {
  if (impl_->hf) return impl_->hf->eos_token();
  return eos_id() >= 0 ? impl_->sp.IdToPiece(eos_id()) : std::string();
}
const char* Tokenizer::format() const {
  return impl_->hf ? "tokenizer.json" : "sentencepiece";
}
const std::vector<std::pair<std::string, std::string>>& Tokenizer::files() const {
  return impl_->files;
}
const std::string& Tokenizer::origin() const {
  return impl_->origin;
}

}  // namespace hyperion::text
