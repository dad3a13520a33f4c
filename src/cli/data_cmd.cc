// hyperion data prepare: raw text -> tokenizer + token shards (train/data_prepare.h).
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "io/file_identity.h"
#include "train/data_prepare.h"

namespace hyperion::cli {

const CommandSpec kDataPrepareSpec = {
    "data prepare",
    "",
    "train a SentencePiece tokenizer on text and write token shards",
    {{"input", "FILE",
      "input text: .txt (documents split by '%' or blank lines) or .jsonl "
      "({\"text\": ...} per line)",
      true},
     {"output", "DIR", "output directory, created if missing"},
     {"vocab-size", "N", "tokenizer vocabulary size (default 8192)"},
     {"tokenizer", "MODEL", "use this SentencePiece .model instead of training one"},
     {"val-fraction", "F",
      "fraction of documents held out for validation, in [0, 1) (default "
      "0.05)"},
     {"seed", "N", "seed of the held-out split (default 1234)"},
     {"json", "", "print the summary as one JSON object"}},
    "Writes DIR/{tokenizer.model, train.bin, val.bin, meta.json}; the tokenizer follows "
    "Llama's\nconventions (BOS 1, EOS 2, byte fallback). --input and --output are required.",
    "data prepare --input corpus.txt --output data/my --vocab-size 8192"};

namespace {

// An integer given to `flag`, within [lo, hi].
int64_t integer_in(const Flags& f, const char* flag, int64_t fallback, double lo, double hi) {
  const int64_t v = f.integer(flag, fallback);
  HYP_USAGE_CHECK(double(v) >= lo && double(v) <= hi,
                  "data prepare: --{} must be in [{}, {}], got {}", flag, lo, hi, v);
  return v;
}

}  // namespace

int cmd_data_prepare(const Args& args) {
  const Flags f(kDataPrepareSpec, args);
  HYP_USAGE_CHECK(f.positional().empty(), "data prepare: unexpected argument '{}'",
                  f.positional()[0]);
  train::PrepareOptions opts;
  const bool json = f.has("json");
  opts.inputs = f.all("input");
  opts.output_dir = f.get("output");
  opts.vocab_size = static_cast<int>(integer_in(f, "vocab-size", opts.vocab_size, 1, 1 << 24));
  opts.tokenizer_model = f.get("tokenizer");
  opts.val_fraction = f.number("val-fraction", opts.val_fraction);
  HYP_USAGE_CHECK(opts.val_fraction >= 0 && opts.val_fraction < 1,
                  "data prepare: --val-fraction must be in [0, 1), got '{}'",
                  f.get("val-fraction"));
  // integers above 2^53 are not exactly representable as parsed
  opts.seed = static_cast<uint64_t>(
      integer_in(f, "seed", static_cast<int64_t>(opts.seed), 0, 9007199254740992.0));
  HYP_USAGE_CHECK(!opts.inputs.empty(), "data prepare: --input FILE is required");
  // The same file twice would hold each document twice: copies would land on both sides
  // of the held-out split.
  for (size_t i = 0; i < opts.inputs.size(); ++i)
    for (size_t j = i + 1; j < opts.inputs.size(); ++j)
      HYP_USAGE_CHECK(opts.inputs[i] != opts.inputs[j] && !io::same_file(opts.inputs[i], opts.inputs[j]),
                      "data prepare: --input {} and --input {} are the same file", opts.inputs[i],
                      opts.inputs[j]);
  HYP_USAGE_CHECK(!opts.output_dir.empty(), "data prepare: --output DIR is required");

  const train::PrepareResult r = train::prepare_dataset(opts);
  if (json) {
    nlohmann::json j = {{"documents", r.documents},
                        {"train_docs", r.train_docs},
                        {"val_docs", r.val_docs},
                        {"train_tokens", r.train_tokens},
                        {"val_tokens", r.val_tokens},
                        {"vocab_size", r.vocab_size},
                        {"tokenizer", r.tokenizer_path},
                        {"train", r.train_path},
                        {"val", r.val_path},
                        {"seconds", r.seconds}};
    print_json(j, 2);
  } else {
    std::printf("documents   %lld (train %lld, val %lld)\n", static_cast<long long>(r.documents),
                static_cast<long long>(r.train_docs), static_cast<long long>(r.val_docs));
    std::printf("tokens      train %lld, val %lld (with BOS/EOS per document)\n",
                static_cast<long long>(r.train_tokens), static_cast<long long>(r.val_tokens));
    std::printf("vocab       %d\n", r.vocab_size);
    std::printf("tokenizer   %s\n", r.tokenizer_path.c_str());
    std::printf("train       %s\n", r.train_path.c_str());
    std::printf("val         %s\n", r.val_path.c_str());
    std::printf("time        %.2f s\n", r.seconds);
  }
  return 0;
}

}  // namespace hyperion::cli
