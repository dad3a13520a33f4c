#include "train/data_prepare.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <mutex>
#include <optional>
#include <system_error>

#include "base/error.h"
#include "base/log.h"
#include "base/threads.h"
#include "base/timer.h"
#include "base/utf8.h"
#include "io/atomic_file.h"
#include "io/file_identity.h"
#include "io/token_shard.h"
#include "text/text_input.h"
#include "text/tokenizer.h"

namespace hyperion::train {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from (seed, index): 53 high bits of a double-mixed hash.
double unit_hash(uint64_t seed, uint64_t index) {
  const uint64_t h = splitmix64(splitmix64(seed) ^ index);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// Concatenates BOS, tokens, EOS for the selected documents.
std::vector<int32_t> frame(const std::vector<std::vector<int32_t>>& encoded,
                           const std::vector<bool>& is_val, bool want_val, int32_t bos,
                           int32_t eos) {
  size_t total = 0;
  for (size_t i = 0; i < encoded.size(); ++i) {
    if (is_val[i] == want_val) total += encoded[i].size() + 2;  // bos (when there is one), eos
  }
  std::vector<int32_t> out;
  out.reserve(total);
  for (size_t i = 0; i < encoded.size(); ++i) {
    if (is_val[i] != want_val) continue;
    if (bos >= 0) out.push_back(bos);  // Qwen's vocabularies have no BOS
    out.insert(out.end(), encoded[i].begin(), encoded[i].end());
    out.push_back(eos);
  }
  return out;
}

}  // namespace

std::vector<bool> split_validation(int64_t n, double val_fraction, uint64_t seed) {
  HYP_CHECK(val_fraction >= 0 && val_fraction < 1,
            "split_validation: val_fraction must be in [0, 1), got {}", val_fraction);
  std::vector<bool> is_val(static_cast<size_t>(std::max<int64_t>(n, 0)), false);
  if (n <= 0 || val_fraction == 0) return is_val;
  std::vector<double> u(is_val.size());
  int64_t val = 0;
  for (int64_t i = 0; i < n; ++i) {
    u[i] = unit_hash(seed, static_cast<uint64_t>(i));
    is_val[i] = u[i] < val_fraction;
    val += is_val[i];
  }
  if (n >= 2 && val == 0) {
    // Too few documents for the fraction to pick any: hold out the one hashed lowest.
    is_val[std::min_element(u.begin(), u.end()) - u.begin()] = true;
  } else if (n >= 2 && val == n) {
    is_val[std::max_element(u.begin(), u.end()) - u.begin()] = false;
  } else if (n == 1) {
    is_val[0] = false;  // a lone document is for training
  }
  return is_val;
}

bool is_prepared_dataset(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir + "/train.bin", ec) || !fs::exists(dir + "/val.bin", ec) ||
      text::tokenizer_file_in(dir).empty() || !fs::exists(dir + "/meta.json", ec))
    return false;
  try {
    const nlohmann::json meta = nlohmann::json::parse(io::read_file(dir + "/meta.json"));
    return meta.value("complete", true);  // written before "complete" existed: complete
  } catch (const std::exception&) {
    return false;
  }
}

PrepareResult prepare_dataset(const PrepareOptions& opts) {
  Timer timer;
  HYP_CHECK(!opts.inputs.empty(), "data prepare: no input files given");
  HYP_CHECK(!opts.output_dir.empty(), "data prepare: no output directory given");
  HYP_CHECK(opts.val_fraction >= 0 && opts.val_fraction < 1,
            "data prepare: val_fraction must be in [0, 1), got {}", opts.val_fraction);
  HYP_CHECK(!opts.tokenizer_model.empty() || opts.vocab_size > 0,
            "data prepare: vocab_size must be positive, got {}", opts.vocab_size);
  // An output written over an input would destroy it (--input DIR/train.bin --output DIR).
  // The given tokenizer may be DIR/tokenizer.model itself: it is rewritten unchanged.
  for (const char* name : {"train.bin", "val.bin", "meta.json"})
    io::check_output_is_not_an_input((std::filesystem::path(opts.output_dir) / name).string(),
                                     opts.inputs, "data prepare");

  // The output directory is new, empty, or an earlier output of this command (meta.json
  // says so): never a directory of someone else's files (a model's tokenizer.model).
  {
    std::error_code ec;
    const std::filesystem::path out(opts.output_dir);
    if (std::filesystem::exists(out, ec)) {
      HYP_CHECK(std::filesystem::is_directory(out, ec),
                "data prepare: --output {} is not a directory", opts.output_dir);
      bool ours = false;
      try {
        ours = nlohmann::json::parse(io::read_file((out / "meta.json").string()))
                   .value("format", "") == "hyperion-token-shards";
      } catch (const std::exception&) {
      }
      HYP_CHECK(ours || std::filesystem::directory_iterator(out, ec) ==
                            std::filesystem::directory_iterator(),
                "data prepare: --output {} holds files that are not a prepared dataset (no "
                "meta.json of hyperion data prepare); choose a new or empty directory",
                opts.output_dir);
    }
  }

  // A given tokenizer is loaded (and refused when malformed) before anything is written.
  std::optional<text::Tokenizer> tok;
  if (!opts.tokenizer_model.empty()) tok.emplace(text::Tokenizer::load(opts.tokenizer_model));

  std::vector<std::string> docs;
  for (const std::string& input : opts.inputs) {
    std::vector<std::string> d = text::read_documents(input);
    log_debug("data prepare: {} documents from {}", d.size(), input);
    docs.insert(docs.end(), std::make_move_iterator(d.begin()), std::make_move_iterator(d.end()));
  }
  const int64_t n = static_cast<int64_t>(docs.size());
  HYP_CHECK(n > 0, "data prepare: the inputs hold no documents ({})", fmt::join(opts.inputs, ", "));
  if (tok) {
    // Checked before anything is written: a tokenizer.json encodes UTF-8 text only, and a
    // document needs an EOS to end it.
    HYP_CHECK(tok->eos_id() >= 0,
              "data prepare: tokenizer '{}' has no EOS token to end each document with (for a "
              "tokenizer.json: eos_token in tokenizer_config.json)",
              tok->origin());
    if (std::string(tok->format()) == "tokenizer.json") {
      for (int64_t i = 0; i < n; ++i) {
        const size_t bad = utf8_invalid_at(docs[size_t(i)]);
        if (bad != std::string::npos)
          usage_fail("data prepare: document {} of {} is not valid UTF-8 (byte {} of the "
                     "document), which tokenizer '{}' cannot encode",
                     i + 1, fmt::join(opts.inputs, ", "), bad, tok->origin());
      }
    }
  }
  const std::vector<bool> is_val = split_validation(n, opts.val_fraction, opts.seed);

  io::make_directories(opts.output_dir);
  const std::filesystem::path dir(opts.output_dir);
  // meta.json says "complete": false until everything is written, then is rewritten last:
  // a prepare killed half-way leaves a directory that is ours (it may be prepared again)
  // but never one that looks complete with a mix of old and new files.
  io::write_file_atomic(
      (dir / "meta.json").string(),
      nlohmann::json{{"format", "hyperion-token-shards"}, {"complete", false}}.dump(2) + "\n");
  PrepareResult r;
  r.tokenizer_path = (dir / "tokenizer.model").string();
  r.train_path = (dir / "train.bin").string();
  r.val_path = (dir / "val.bin").string();

  // No tokenizer file of an earlier prepare is left beside this one's (a stale
  // tokenizer.json would be loaded before a new tokenizer.model).
  for (const char* name : text::kTokenizerFileNames) {
    const bool carried = tok && std::any_of(tok->files().begin(), tok->files().end(),
                                            [&](const auto& f) { return f.first == name; });
    std::error_code ec;
    if (!carried) std::filesystem::remove(dir / name, ec);
  }
  if (tok) {
    // An existing tokenizer (a SentencePiece .model, or a Hugging Face tokenizer.json with
    // its config): its files are copied in.
    for (const auto& [name, bytes] : tok->files())
      io::write_file_atomic((dir / name).string(), bytes);
    r.tokenizer_path = (dir / tok->files().front().first).string();
  } else {
    // Lend the train documents to the trainer (moved, not copied: corpora can be large).
    std::vector<std::string> train_docs;
    for (int64_t i = 0; i < n; ++i) {
      if (!is_val[i]) train_docs.push_back(std::move(docs[i]));
    }
    text::TokenizerTrainOptions to;
    to.vocab_size = opts.vocab_size;
    // to.num_threads stays at its fixed default: SentencePiece records the trainer options
    // in the model, so a machine-dependent count would make tokenizer.model differ by host.
    tok.emplace(text::Tokenizer::train(train_docs, r.tokenizer_path, to));
    for (int64_t i = 0, k = 0; i < n; ++i) {
      if (!is_val[i]) docs[i] = std::move(train_docs[k++]);
    }
  }
  HYP_CHECK(tok->eos_id() >= 0,
            "data prepare: tokenizer '{}' has no EOS token to end each document with (for a "
            "tokenizer.json: eos_token in tokenizer_config.json)",
            tok->origin());
  log_debug("data prepare: tokenizer ready ({} pieces) after {:.2f} s", tok->vocab_size(),
            timer.seconds());

  // Encoding is const and thread-safe; documents vary in length. An exception must not
  // leave the parallel region: the first is kept and rethrown after it.
  std::vector<std::vector<int32_t>> encoded(docs.size());
  std::mutex error_mu;
  std::string error;
  parallel_for_dynamic(n, [&](int64_t i) {
    try {
      encoded[i] = tok->encode(docs[i]);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (error.empty()) error = fmt::format("document {}: {}", i + 1, e.what());
    }
  });
  HYP_CHECK(error.empty(), "data prepare: {}", error);

  const std::vector<int32_t> train = frame(encoded, is_val, false, tok->bos_id(), tok->eos_id());
  const std::vector<int32_t> val = frame(encoded, is_val, true, tok->bos_id(), tok->eos_id());
  r.vocab_size = tok->vocab_size();
  io::write_token_shard(r.train_path, train.data(), static_cast<int64_t>(train.size()),
                        r.vocab_size);
  io::write_token_shard(r.val_path, val.data(), static_cast<int64_t>(val.size()), r.vocab_size);

  r.documents = n;
  r.val_docs = std::count(is_val.begin(), is_val.end(), true);
  r.train_docs = n - r.val_docs;
  r.train_tokens = static_cast<int64_t>(train.size());
  r.val_tokens = static_cast<int64_t>(val.size());

  // File names are relative so the directory can be moved as a whole. No timings: the
  // output stays byte-identical across runs.
  nlohmann::json meta = {
      {"format", "hyperion-token-shards"},
      {"version", 1},
      {"inputs", opts.inputs},
      {"documents", r.documents},
      {"train_docs", r.train_docs},
      {"val_docs", r.val_docs},
      {"train_tokens", r.train_tokens},
      {"val_tokens", r.val_tokens},
      {"vocab_size", r.vocab_size},
      {"bos_id", tok->bos_id()},
      {"eos_id", tok->eos_id()},
      {"val_fraction", opts.val_fraction},
      {"seed", opts.seed},
      {"tokenizer", std::filesystem::path(r.tokenizer_path).filename().string()},
      {"train", "train.bin"},
      {"val", "val.bin"},
      {"complete", true},
  };
  if (!opts.cache_key.empty()) meta["cache_key"] = opts.cache_key;
  io::write_file_atomic((dir / "meta.json").string(), meta.dump(2) + "\n");
  r.seconds = timer.seconds();
  return r;
}

}  // namespace hyperion::train
