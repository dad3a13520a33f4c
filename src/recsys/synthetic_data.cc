#include "recsys/synthetic_data.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>

#include "base/error.h"
#include "kernels/fill.h"

namespace hyperion::recsys {

namespace {

// The logit's constants (see the header): chosen so that one-hot tables give an oracle
// AUC near 0.85 and a positive rate near 35% (tests/recsys/synthetic_data_test.cc).
constexpr double kBias = -1.0;
constexpr double kSparseScale = 3.2;
constexpr double kDenseScale = 1.0;
constexpr double kMuLow = 1.0, kMuHigh = 3.0;

// Domains, so that hashes drawn for different purposes are independent.
enum Domain : uint64_t {
  kDenseMu = 1,
  kDenseWeight,
  kDenseValue,
  kRank,
  kPermutation,
  kEffect,
  kLabel,
};

uint64_t hash(uint64_t seed, Domain domain, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  uint64_t h = splitmix64(seed ^ splitmix64(domain));
  h = splitmix64(h ^ a);
  h = splitmix64(h ^ b);
  return splitmix64(h ^ c);
}

// Uniform in [0, 1) from the top 53 bits.
double uniform(uint64_t h) {
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

double mu(const SyntheticSpec& spec, int64_t j) {
  return kMuLow + (kMuHigh - kMuLow) * uniform(hash(spec.seed, kDenseMu, uint64_t(j)));
}
double dense_weight(const SyntheticSpec& spec, int64_t j) {
  return 2.0 * uniform(hash(spec.seed, kDenseWeight, uint64_t(j))) - 1.0;
}
double id_effect(const SyntheticSpec& spec, int64_t t, int32_t id) {
  return 2.0 * uniform(hash(spec.seed, kEffect, uint64_t(t), uint64_t(id))) - 1.0;
}

// A rank in [0, n) with p(r) ~ (r + 1)^-s: the inverse of the continuous CDF over
// [1, n + 1), floored.
int64_t zipf_rank(double u, int64_t n, double s) {
  const double n1 = static_cast<double>(n) + 1.0;
  double x;
  if (std::abs(s - 1.0) < 1e-9) {
    x = std::exp(u * std::log(n1));
  } else {
    const double e = 1.0 - s;
    x = std::pow(1.0 + u * (std::pow(n1, e) - 1.0), 1.0 / e);
  }
  if (!(x < n1)) x = n1;  // rounding at u -> 1 (and a NaN, were there one)
  return std::clamp(static_cast<int64_t>(std::floor(x)) - 1, int64_t{0}, n - 1);
}

// P(zipf_rank = r): the continuous CDF's mass on [r + 1, r + 2).
double zipf_probability(int64_t r, int64_t n, double s) {
  const auto g = [s](double x) {
    return std::abs(s - 1.0) < 1e-9 ? std::log(x) : std::pow(x, 1.0 - s) / (1.0 - s);
  };
  const double x = static_cast<double>(r) + 1.0;
  return (g(x + 1.0) - g(x)) / (g(static_cast<double>(n) + 1.0) - g(1.0));
}

// The bijection id = (a * rank + b) mod n of table t, a coprime with n.
struct Scramble {
  uint64_t n, a, b;
  int32_t operator()(int64_t rank) const {
    return static_cast<int32_t>((a * static_cast<uint64_t>(rank) + b) % n);
  }
};

Scramble scramble(const SyntheticSpec& spec, int64_t t) {
  const uint64_t n = static_cast<uint64_t>(spec.table_rows[static_cast<size_t>(t)]);
  const uint64_t h = hash(spec.seed, kPermutation, uint64_t(t));
  uint64_t a = n > 1 ? 1 + (h >> 32) % (n - 1) : 0;
  while (n > 1 && std::gcd(a, n) != 1) a = a + 1 < n ? a + 1 : 1;
  return {n, a, (h & 0xffffffffu) % n};
}

// The ranks whose effects set a table's centre: they hold most of the mass of a skewed
// table, and the effects of the rest average out.
constexpr int64_t kCentreRanks = 32;

// What the logit needs beyond the batch, derived from the spec.
struct Model {
  std::vector<double> mus, weights;  // [D] mu_j, w_j
  std::vector<double> centres;       // [T] the table's mean effect over the id distribution
};

Model make_model(const SyntheticSpec& spec) {
  Model m;
  for (int64_t j = 0; j < spec.dense_features; ++j) {
    m.mus.push_back(mu(spec, j));
    m.weights.push_back(dense_weight(spec, j));
  }
  for (size_t t = 0; t < spec.table_rows.size(); ++t) {
    const int64_t n = spec.table_rows[t];
    const Scramble to_id = scramble(spec, int64_t(t));
    double centre = 0.0;
    for (int64_t r = 0; r < std::min(n, kCentreRanks); ++r)
      centre += zipf_probability(r, n, spec.zipf_exponent) * id_effect(spec, int64_t(t), to_id(r));
    m.centres.push_back(centre);
  }
  return m;
}

// make_model's result for the last spec this thread saw (synthetic_logit runs per row).
const Model& model_for(const SyntheticSpec& spec) {
  thread_local SyntheticSpec cached_spec;
  thread_local Model cached;
  thread_local bool valid = false;
  if (!valid || cached_spec.seed != spec.seed ||
      cached_spec.dense_features != spec.dense_features ||
      cached_spec.zipf_exponent != spec.zipf_exponent ||
      cached_spec.table_rows != spec.table_rows) {
    cached = make_model(spec);
    cached_spec = spec;
    valid = true;
  }
  return cached;
}

void check_spec(const SyntheticSpec& spec) {
  HYP_CHECK(!spec.table_rows.empty(), "SyntheticSpec: table_rows is empty (need one table)");
  HYP_CHECK(spec.table_rows.size() == spec.bag_sizes.size(),
            "SyntheticSpec: table_rows has {} tables but bag_sizes has {}", spec.table_rows.size(),
            spec.bag_sizes.size());
  constexpr int64_t kMaxRows = int64_t{1} << 31;  // ids are int32
  for (size_t t = 0; t < spec.table_rows.size(); ++t) {
    HYP_CHECK(spec.table_rows[t] >= 1 && spec.table_rows[t] <= kMaxRows,
              "SyntheticSpec: table_rows[{}] = {} is outside [1, 2^31]", t, spec.table_rows[t]);
    HYP_CHECK(spec.bag_sizes[t] >= 1, "SyntheticSpec: bag_sizes[{}] = {} is less than 1", t,
              spec.bag_sizes[t]);
  }
  HYP_CHECK(spec.dense_features >= 0, "SyntheticSpec: dense_features = {} is negative",
            spec.dense_features);
  HYP_CHECK(std::isfinite(spec.zipf_exponent) && spec.zipf_exponent >= 0,
            "SyntheticSpec: zipf_exponent = {} is not a finite number >= 0", spec.zipf_exponent);
  HYP_CHECK(std::isfinite(spec.signal), "SyntheticSpec: signal = {} is not finite", spec.signal);
}

// The logit of `row`, the batch already checked against the spec.
double logit_of(const SyntheticSpec& spec, const Model& m, const Batch& batch, int64_t row) {
  const int64_t d = spec.dense_features;
  const int64_t tables = static_cast<int64_t>(spec.table_rows.size());
  double dense_term = 0.0;
  for (int64_t j = 0; j < d; ++j)
    dense_term += m.weights[size_t(j)] * (batch.dense[size_t(row * d + j)] - m.mus[size_t(j)]);
  if (d > 0) dense_term /= std::sqrt(static_cast<double>(d));
  double sparse_term = 0.0;
  for (int64_t t = 0; t < tables; ++t) {
    const int64_t begin = batch.sparse_offsets[size_t(t * batch.rows + row)];
    const int64_t end = batch.sparse_offsets[size_t(t * batch.rows + row + 1)];
    if (end == begin) continue;
    double sum = 0.0;
    for (int64_t k = begin; k < end; ++k) sum += id_effect(spec, t, batch.sparse_ids[size_t(k)]);
    sparse_term += sum / static_cast<double>(end - begin) - m.centres[size_t(t)];
  }
  sparse_term /= std::sqrt(static_cast<double>(tables));
  return kBias + spec.signal * (kDenseScale * dense_term + kSparseScale * sparse_term);
}

}  // namespace

void synthetic_batch(const SyntheticSpec& spec, int64_t first_example, int64_t rows, Batch& out) {
  check_spec(spec);
  HYP_CHECK(rows >= 1, "synthetic_batch: rows = {} is less than 1", rows);
  HYP_CHECK(first_example >= 0, "synthetic_batch: first_example = {} is negative", first_example);
  HYP_CHECK(first_example <= std::numeric_limits<int64_t>::max() - rows,
            "synthetic_batch: first_example + rows overflows ({} + {})", first_example, rows);
  const int64_t d = spec.dense_features;
  const int64_t tables = static_cast<int64_t>(spec.table_rows.size());
  const Model& model = model_for(spec);

  out.rows = rows;
  out.seq_len = 0;
  out.inputs.clear();
  out.targets.clear();

  // Dense: x = exp(mu_j + z), Box-Muller z from the two halves of one hash.
  out.dense.resize(static_cast<size_t>(rows * d));
  for (int64_t b = 0; b < rows; ++b) {
    const uint64_t i = static_cast<uint64_t>(first_example + b);
    for (int64_t j = 0; j < d; ++j) {
      const uint64_t h = hash(spec.seed, kDenseValue, i, uint64_t(j));
      const double u1 = (static_cast<double>(h >> 32) + 1.0) * 0x1.0p-32;  // (0, 1]
      const double u2 = static_cast<double>(h & 0xffffffffu) * 0x1.0p-32;
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
      out.dense[size_t(b * d + j)] =
          static_cast<float>(std::log1p(std::exp(model.mus[size_t(j)] + z)));
    }
  }

  // Sparse, table-major: every bag of table t has bag_sizes[t] ids.
  int64_t total = 0;
  for (int32_t m : spec.bag_sizes) total += rows * m;
  out.sparse_ids.resize(static_cast<size_t>(total));
  out.sparse_offsets.resize(static_cast<size_t>(tables * rows + 1));
  int64_t at = 0;
  for (int64_t t = 0; t < tables; ++t) {
    const int64_t n = spec.table_rows[size_t(t)];
    const int32_t m = spec.bag_sizes[size_t(t)];
    const Scramble to_id = scramble(spec, t);
    for (int64_t b = 0; b < rows; ++b) {
      const uint64_t i = static_cast<uint64_t>(first_example + b);
      out.sparse_offsets[size_t(t * rows + b)] = at;
      for (int32_t k = 0; k < m; ++k) {
        const double u = uniform(hash(spec.seed, kRank, i, uint64_t(t), uint64_t(k)));
        out.sparse_ids[size_t(at++)] = to_id(zipf_rank(u, n, spec.zipf_exponent));
      }
    }
  }
  out.sparse_offsets.back() = at;

  // Labels: Bernoulli(sigmoid(logit)).
  out.labels.resize(static_cast<size_t>(rows));
  for (int64_t b = 0; b < rows; ++b) {
    const double p = 1.0 / (1.0 + std::exp(-logit_of(spec, model, out, b)));
    const double u = uniform(hash(spec.seed, kLabel, static_cast<uint64_t>(first_example + b)));
    out.labels[size_t(b)] = u < p ? 1.0f : 0.0f;
  }
}

float synthetic_logit(const SyntheticSpec& spec, const Batch& batch, int64_t row) {
  check_spec(spec);
  const int64_t tables = static_cast<int64_t>(spec.table_rows.size());
  HYP_CHECK(row >= 0 && row < batch.rows, "synthetic_logit: row {} is outside [0, rows = {})", row,
            batch.rows);
  HYP_CHECK(static_cast<int64_t>(batch.dense.size()) == batch.rows * spec.dense_features,
            "synthetic_logit: batch.dense has {} values, expected rows * dense_features = {} * {}",
            batch.dense.size(), batch.rows, spec.dense_features);
  HYP_CHECK(static_cast<int64_t>(batch.sparse_offsets.size()) == tables * batch.rows + 1,
            "synthetic_logit: batch.sparse_offsets has {} entries, expected tables * rows + 1 = "
            "{} * {} + 1",
            batch.sparse_offsets.size(), tables, batch.rows);
  for (int64_t t = 0; t < tables; ++t) {
    const int64_t begin = batch.sparse_offsets[size_t(t * batch.rows + row)];
    const int64_t end = batch.sparse_offsets[size_t(t * batch.rows + row + 1)];
    HYP_CHECK(0 <= begin && begin <= end && end <= static_cast<int64_t>(batch.sparse_ids.size()),
              "synthetic_logit: batch.sparse_offsets of (table {}, row {}) = [{}, {}) is not a "
              "range of sparse_ids (size {})",
              t, row, begin, end, batch.sparse_ids.size());
  }
  return static_cast<float>(logit_of(spec, model_for(spec), batch, row));
}

}  // namespace hyperion::recsys
