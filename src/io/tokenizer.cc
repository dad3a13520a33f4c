#include "io/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <unordered_map>

#include "base/error.h"
#include "io/atomic_file.h"

namespace hyperion::io {

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::string serialized;
  std::string origin;
};

namespace {

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

Tokenizer Tokenizer::load(const std::string& model_path) {
  std::string bytes;
  try {
    bytes = read_file(model_path);
  } catch (const Error& e) {
    fail("tokenizer: cannot load model: {}", e.what());
  }
  return from_serialized(bytes, model_path);
}

Tokenizer Tokenizer::from_serialized(const std::string& bytes, std::string origin) {
  HYP_CHECK(!bytes.empty(), "tokenizer: model '{}' is empty", origin);
  auto impl = std::make_unique<Impl>();
  auto status = impl->sp.LoadFromSerializedProto(bytes);
  HYP_CHECK(status.ok(), "tokenizer: '{}' is not a valid SentencePiece model ({})", origin,
            status.ToString());
  HYP_CHECK(impl->sp.GetPieceSize() > 0, "tokenizer: model '{}' has an empty vocabulary", origin);
  impl->serialized = bytes;
  impl->origin = std::move(origin);
  return Tokenizer(std::move(impl));
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
  write_file_atomic(output_model_path, model);
  return tok;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  auto status = impl_->sp.Encode(text, &ids);
  HYP_CHECK(status.ok(), "tokenizer '{}': encode failed: {}", impl_->origin, status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
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
  return impl_->sp.IdToPiece(id);
}

size_t Tokenizer::max_piece_bytes() const {
  size_t longest = 1;
  for (int32_t id = 0; id < vocab_size(); ++id)
    longest = std::max(longest, impl_->sp.IdToPiece(id).size());
  return longest;
}

int32_t Tokenizer::vocab_size() const {
  return impl_->sp.GetPieceSize();
}
int32_t Tokenizer::bos_id() const {
  return impl_->sp.bos_id();
}
int32_t Tokenizer::eos_id() const {
  return impl_->sp.eos_id();
}
int32_t Tokenizer::unk_id() const {
  return impl_->sp.unk_id();
}
int32_t Tokenizer::pad_id() const {
  return impl_->sp.pad_id();
}
const std::string& Tokenizer::serialized() const {
  return impl_->serialized;
}
const std::string& Tokenizer::origin() const {
  return impl_->origin;
}

}  // namespace hyperion::io
