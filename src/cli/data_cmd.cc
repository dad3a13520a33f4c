// hyperion data prepare: raw text -> tokenizer + token shards (train/data_prepare.h).
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/commands.h"
#include "train/data_prepare.h"

namespace hyperion::cli {

namespace {

constexpr const char* kDataUsage =
    R"(usage: hyperion data prepare --input FILE [--input FILE ...] --output DIR [options]

Reads .txt (documents separated by '%' lines or blank lines) and .jsonl ({"text": ...}
per line) files, trains a SentencePiece tokenizer (Llama conventions) on the training
split, and writes DIR/{tokenizer.model, train.bin, val.bin, meta.json}.

options:
  --input FILE         input text; repeat for several files (required)
  --output DIR         output directory, created if missing (required)
  --vocab-size N       tokenizer vocabulary size (default 8192)
  --tokenizer MODEL    use this existing SentencePiece .model instead of training one
  --val-fraction F     fraction of documents held out for validation, in [0, 1) (default 0.05)
  --seed N             seed of the held-out split (default 1234)
  --json               print the summary as one JSON object
)";

// A non-negative integer given to `flag`, within [lo, hi].
int64_t parse_integer(const std::string& value, const char* flag, double lo, double hi) {
  const double v = parse_number(value, flag);
  HYP_CHECK(std::floor(v) == v && v >= lo && v <= hi,
            "{}: expected an integer in [{}, {}], got '{}'", flag, lo, hi, value);
  return static_cast<int64_t>(v);
}

int cmd_data_prepare(const Args& args) {
  train::PrepareOptions opts;
  bool json = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      json = true;
      continue;
    }
    if (a == "-h" || a == "--help") {
      std::fputs(kDataUsage, stdout);
      return 0;
    }
    const bool takes_value = a == "--input" || a == "--output" || a == "--vocab-size" ||
                             a == "--tokenizer" || a == "--val-fraction" || a == "--seed";
    if (!takes_value) {
      fail(
          "data prepare: unknown argument '{}' (expected --input, --output, --vocab-size, "
          "--tokenizer, --val-fraction, --seed, --json)",
          a);
    }
    HYP_CHECK(i + 1 < args.size(), "data prepare: {} needs a value", a);
    const std::string& v = args[++i];
    if (a == "--input") {
      opts.inputs.push_back(v);
    } else if (a == "--output") {
      opts.output_dir = v;
    } else if (a == "--vocab-size") {
      opts.vocab_size = static_cast<int>(parse_integer(v, "--vocab-size", 1, 1 << 24));
    } else if (a == "--tokenizer") {
      opts.tokenizer_model = v;
    } else if (a == "--val-fraction") {
      opts.val_fraction = parse_number(v, "--val-fraction");
      HYP_CHECK(opts.val_fraction >= 0 && opts.val_fraction < 1,
                "--val-fraction: expected a value in [0, 1), got '{}'", v);
    } else {  // --seed; integers above 2^53 are not exactly representable as parsed
      opts.seed = static_cast<uint64_t>(parse_integer(v, "--seed", 0, 9007199254740992.0));
    }
  }
  HYP_CHECK(!opts.inputs.empty(), "data prepare: --input FILE is required");
  HYP_CHECK(!opts.output_dir.empty(), "data prepare: --output DIR is required");

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
    std::printf("%s\n", j.dump(2).c_str());
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

}  // namespace

int cmd_data(const Args& args) {
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    std::fputs(kDataUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "prepare") return cmd_data_prepare(Args(args.begin() + 1, args.end()));
  std::fprintf(stderr, "hyperion data: unknown subcommand '%s'\n\n%s", args[0].c_str(), kDataUsage);
  return 2;
}

}  // namespace hyperion::cli
