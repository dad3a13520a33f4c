#include "recsys/dlrm_config.h"

#include <limits>

#include "base/error.h"

namespace hyperion::recsys {

const char* sharding_name(Sharding s) {
  return s == Sharding::kTable ? "table" : "row";
}

std::vector<ConfigKey> dlrm_config_schema() {
  using T = ConfigType;
  return {
      {"dlrm.dense_features", T::kInt, "13", "dense (integer) features per example"},
      {"dlrm.table_rows", T::kString, "1000,1000",
       "rows of each embedding table, comma-separated (one table per sparse feature)"},
      {"dlrm.embedding_dim", T::kInt, "128", "embedding dimension of every table"},
      {"dlrm.pooling", T::kString, "sum", "bag pooling: sum | mean | sqrtn"},
      {"dlrm.embedding_dtype", T::kString, "float32", "table rows: float32 | bfloat16"},
      {"dlrm.bottom_mlp", T::kString, "512,256,128",
       "bottom MLP widths (the last equals embedding_dim)"},
      {"dlrm.top_mlp", T::kString, "1024,1024,512,256,1", "top MLP widths (the last is 1)"},
      {"dlrm.cross_layers", T::kInt, "3", "DCNv2 cross layers"},
      {"dlrm.cross_rank", T::kInt, "512", "low rank of each cross layer"},
      {"dlrm.sparse_optimizer", T::kString, "rowwise_adagrad",
       "embedding optimizer, fused into the backward: sgd | adagrad | rowwise_adagrad"},
      {"dlrm.adagrad_eps", T::kFloat, "1e-8", "Adagrad epsilon (tables and dense layers)"},
      {"dlrm.sharding", T::kString, "table",
       "how tables are placed over ranks: table (whole tables) | row (row blocks of every table)"},
      {"dlrm.bag_sizes", T::kString, "1",
       "synthetic data: ids per bag, one for all tables or one per table"},
      {"dlrm.zipf_exponent", T::kFloat, "1.05", "synthetic data: power law of the ids"},
      {"dlrm.synthetic_signal", T::kFloat, "1.0", "synthetic data: strength of the label signal"},
      {"dlrm.eval_examples", T::kInt, "16384", "held-out examples for the AUC"},
      {"dlrm.eval_dataset_path", T::kString, "",
       "Criteo data: the held-out TSV file (empty: no held-out AUC)"},
  };
}

namespace {

std::vector<int64_t> parse_list(const Config& c, const std::string& key) {
  const std::string& text = c.get_string(key);
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    HYP_CHECK(!item.empty() && used == item.size() && v > 0,
              "config key {} ({}): '{}' is not a comma-separated list of positive integers", key,
              c.source_of(key), text);
    out.push_back(v);
    pos = end + 1;
  }
  return out;
}

}  // namespace

int64_t DlrmConfig::embedding_params() const {
  int64_t n = 0;
  for (int64_t r : table_rows) n += r * embedding_dim;
  return n;
}

int64_t DlrmConfig::dense_params() const {
  int64_t n = 0, in = dense_features;
  for (int64_t w : bottom_mlp) n += w * in + w, in = w;
  const int64_t x = interaction_dim();
  n += cross_layers * (2 * x * cross_rank + x);
  in = x;
  for (int64_t w : top_mlp) n += w * in + w, in = w;
  return n;
}

double DlrmConfig::forward_flops_per_example() const {
  double macs = 0;
  int64_t in = dense_features;
  for (int64_t w : bottom_mlp) macs += double(w * in), in = w;
  const int64_t x = interaction_dim();
  macs += double(cross_layers) * (2.0 * double(x * cross_rank) + double(x));
  in = x;
  for (int64_t w : top_mlp) macs += double(w * in), in = w;
  return 2 * macs;
}

DlrmConfig parse_dlrm_config(const Config& c) {
  DlrmConfig d;
  auto where = [&](const char* key) { return fmt::format("{} ({})", key, c.source_of(key)); };
  d.dense_features = c.get_int("dlrm.dense_features");
  HYP_CHECK(d.dense_features >= 1 && d.dense_features <= 4096,
            "config key {} must be in [1, 4096], got {}", where("dlrm.dense_features"),
            d.dense_features);
  d.table_rows = parse_list(c, "dlrm.table_rows");
  for (int64_t r : d.table_rows)
    HYP_CHECK(r <= std::numeric_limits<int32_t>::max(),
              "config key {}: a table of {} rows is over the 2^31 - 1 ids this reader supports",
              where("dlrm.table_rows"), r);
  d.embedding_dim = c.get_int("dlrm.embedding_dim");
  HYP_CHECK(d.embedding_dim >= 1 && d.embedding_dim <= 4096,
            "config key {} must be in [1, 4096], got {}", where("dlrm.embedding_dim"),
            d.embedding_dim);
  d.pooling = parse_pooling(c.get_string("dlrm.pooling"), "config key " + where("dlrm.pooling"));
  const std::string& dt = c.get_string("dlrm.embedding_dtype");
  HYP_CHECK(dt == "float32" || dt == "bfloat16",
            "config key {} must be float32 or bfloat16, got '{}'", where("dlrm.embedding_dtype"),
            dt);
  d.embedding_dtype = dt == "bfloat16" ? DType::kBF16 : DType::kF32;
  d.bottom_mlp = parse_list(c, "dlrm.bottom_mlp");
  HYP_CHECK(d.bottom_mlp.back() == d.embedding_dim,
            "config key {}: the last bottom MLP width ({}) must equal dlrm.embedding_dim ({}), "
            "as the interaction stacks it with the pooled embeddings",
            where("dlrm.bottom_mlp"), d.bottom_mlp.back(), d.embedding_dim);
  d.top_mlp = parse_list(c, "dlrm.top_mlp");
  HYP_CHECK(d.top_mlp.back() == 1, "config key {}: the last top MLP width must be 1 (the logit)",
            where("dlrm.top_mlp"));
  d.cross_layers = c.get_int("dlrm.cross_layers");
  HYP_CHECK(d.cross_layers >= 0 && d.cross_layers <= 64, "config key {} must be in [0, 64], got {}",
            where("dlrm.cross_layers"), d.cross_layers);
  d.cross_rank = c.get_int("dlrm.cross_rank");
  HYP_CHECK(d.cross_rank >= 1, "config key {} must be >= 1, got {}", where("dlrm.cross_rank"),
            d.cross_rank);
  d.sparse_optimizer = parse_sparse_optimizer(c.get_string("dlrm.sparse_optimizer"),
                                              "config key " + where("dlrm.sparse_optimizer"));
  d.adagrad_eps = c.get_float("dlrm.adagrad_eps");
  HYP_CHECK(d.adagrad_eps > 0, "config key {} must be > 0", where("dlrm.adagrad_eps"));
  const std::string& sh = c.get_string("dlrm.sharding");
  HYP_CHECK(sh == "table" || sh == "row", "config key {} must be table or row, got '{}'",
            where("dlrm.sharding"), sh);
  d.sharding = sh == "table" ? Sharding::kTable : Sharding::kRow;
  const std::vector<int64_t> bags = parse_list(c, "dlrm.bag_sizes");
  HYP_CHECK(bags.size() == 1 || bags.size() == d.table_rows.size(),
            "config key {}: {} bag sizes for {} tables (give one for all, or one per table)",
            where("dlrm.bag_sizes"), bags.size(), d.table_rows.size());
  for (size_t t = 0; t < d.table_rows.size(); ++t) {
    const int64_t b = bags.size() == 1 ? bags[0] : bags[t];
    HYP_CHECK(b <= 4096, "config key {}: a bag of {} ids (at most 4096)", where("dlrm.bag_sizes"),
              b);
    d.bag_sizes.push_back(static_cast<int32_t>(b));
  }
  d.zipf_exponent = c.get_float("dlrm.zipf_exponent");
  HYP_CHECK(d.zipf_exponent > 0 && d.zipf_exponent < 10, "config key {} must be in (0, 10), got {}",
            where("dlrm.zipf_exponent"), d.zipf_exponent);
  d.synthetic_signal = c.get_float("dlrm.synthetic_signal");
  d.eval_examples = c.get_int("dlrm.eval_examples");
  HYP_CHECK(d.eval_examples >= 0, "config key {} must be >= 0", where("dlrm.eval_examples"));
  d.eval_dataset_path = c.get_string("dlrm.eval_dataset_path");
  return d;
}

}  // namespace hyperion::recsys
