// `hyperion bench embedding`: the table-batched embedding bags (kernels/embedding_bag.h)
// on a few table shapes and bag sizes, forward and backward + fused update, as lookups/s
// and GB/s against this machine's measured memory bandwidth. The cases and the byte
// counts are those of bench/embedding_torch.py, the PyTorch nn.EmbeddingBag peer:
//   forward bytes   per table: ids * dim * sizeof(row) + batch * dim * 4 (pooled output)
//   update bytes    per table: distinct rows * (dim * sizeof(row) * 2 for the row read and
//                   written, + dim * 4 * 2 for Adagrad's state, + 8 for row-wise Adagrad's)
//                   + batch * dim * 4 (the pooled gradient read)
// Ids are uniform over the rows (or a power law with --zipf); --id-sets batches of them
// are drawn up front and cycled, so calls keep reaching new rows (set it so that the rows
// they touch exceed the last-level cache).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "base/aligned.h"
#include "base/cpu.h"
#include "base/error.h"
#include "base/system_memory.h"
#include "base/threads.h"
#include "base/timer.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "kernels/embedding_bag.h"
#include "kernels/peak.h"
#include "tensor/convert.h"

namespace hyperion::cli {

const CommandSpec kBenchEmbeddingSpec = {
    "bench embedding",
    "",
    "embedding-bag lookups and fused sparse updates: lookups/s and GB/s against the measured "
    "memory bandwidth",
    {{"seconds", "S", "timed seconds per phase per case (default 1)"},
     {"cases", "LIST", "comma-separated case names (default: all)"},
     {"dtype", "T", "table rows: f32, bf16 or int8 (int8: forward only; default f32)"},
     {"id-sets", "K", "id batches drawn per table and cycled (default 64)"},
     {"zipf", "A", "power-law ids with exponent A (default 0: uniform)"},
     {"json", "", "print the figures as one JSON object"}},
    "Cases (as bench/embedding_torch.py, the PyTorch peer): small-d64-bag1, small-d128-bag20,\n"
    "large-d128-bag1, large-d128-bag20 (the large ones hold 2 x 4M x 128 rows: 4 GB in f32,\n"
    "8 GB with Adagrad state).",
    "bench embedding --cases small-d64-bag1 --seconds 0.5 --json"};

namespace {

struct Case {
  const char* name;
  int64_t rows, dim, bag, batch, tables;
};
constexpr Case kCases[] = {
    {"small-d64-bag1", 100000, 64, 1, 4096, 8},
    {"small-d128-bag20", 100000, 128, 20, 2048, 4},
    {"large-d128-bag1", 4000000, 128, 1, 8192, 2},
    {"large-d128-bag20", 4000000, 128, 20, 2048, 2},
};

// Median seconds per call of fn(i), i the call number: 2 warm-up calls, then calls until
// `seconds` have passed (at least 3).
template <typename Fn>
double median_seconds(double seconds, Fn&& fn) {
  fn(0);
  fn(1);
  std::vector<double> t;
  Timer total;
  for (int64_t i = 2; t.size() < 3 || total.seconds() < seconds; ++i) {
    Timer one;
    fn(i);
    t.push_back(one.seconds());
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

// Ids of `n` draws over [0, rows): uniform, or rank k with probability ~ 1 / (k + 1)^a
// (inverse CDF of the continuous power law) scattered by a multiplicative hash.
void draw_ids(std::mt19937_64& rng, int64_t rows, double zipf, int32_t* out, int64_t n) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t k;
    if (zipf <= 0) {
      k = static_cast<int64_t>(u(rng) * double(rows));
    } else if (std::fabs(zipf - 1.0) < 1e-9) {
      k = static_cast<int64_t>(std::exp(u(rng) * std::log(double(rows) + 1.0))) - 1;
    } else {
      const double top = std::pow(double(rows) + 1.0, 1.0 - zipf);
      k = static_cast<int64_t>(std::pow(1.0 + u(rng) * (top - 1.0), 1.0 / (1.0 - zipf))) - 1;
    }
    k = std::clamp<int64_t>(k, 0, rows - 1);
    out[i] = static_cast<int32_t>((uint64_t(k) * 0x9E3779B1ull + 12345) % uint64_t(rows));
  }
}

struct Figures {
  double seconds = 0, lookups_per_s = 0, gbps = 0, of_memory = 0;
};

nlohmann::ordered_json to_json(const Figures& f) {
  return {{"seconds", f.seconds},
          {"lookups_per_s", f.lookups_per_s},
          {"gbps", f.gbps},
          {"of_memory_bandwidth", f.of_memory}};
}

}  // namespace

int cmd_bench_embedding(const Args& args) {
  const Flags f(kBenchEmbeddingSpec, args);
  HYP_USAGE_CHECK(f.positional().empty(), "bench embedding: unexpected argument '{}'",
                  f.positional()[0]);
  const double seconds = f.number("seconds", 1.0);
  HYP_USAGE_CHECK(seconds > 0 && seconds < 600, "bench embedding: --seconds must be in (0, 600)");
  const int64_t id_sets = f.integer("id-sets", 64);
  HYP_USAGE_CHECK(id_sets >= 1 && id_sets <= 4096,
                  "bench embedding: --id-sets must be in [1, 4096]");
  const double zipf = f.number("zipf", 0.0);
  HYP_USAGE_CHECK(zipf >= 0 && zipf < 10, "bench embedding: --zipf must be in [0, 10)");
  const std::string dtype_name_arg = f.get("dtype", "f32");
  HYP_USAGE_CHECK(dtype_name_arg == "f32" || dtype_name_arg == "bf16" || dtype_name_arg == "int8",
                  "bench embedding: --dtype must be f32, bf16 or int8, got '{}'", dtype_name_arg);
  const DType dtype = dtype_name_arg == "f32"    ? DType::kF32
                      : dtype_name_arg == "bf16" ? DType::kBF16
                                                 : DType::kI8;
  // Every case when --cases is left out; a list names each case it runs (in its order),
  // and an empty list or an unknown name is a usage error, never "all".
  std::vector<Case> cases;
  if (!f.has("cases")) cases.assign(std::begin(kCases), std::end(kCases));
  for (const std::string& name : f.list("cases")) {
    const Case* found = nullptr;
    for (const Case& c : kCases)
      if (name == c.name) found = &c;
    HYP_USAGE_CHECK(found != nullptr,
                    "bench embedding: --cases: no case '{}' (small-d64-bag1, small-d128-bag20, "
                    "large-d128-bag1, large-d128-bag20)",
                    name);
    cases.push_back(*found);
  }
  const bool json = f.has("json");
  const PeakResult& peak = cached_peak();
  const double mem = peak.mem_gbps;
  nlohmann::ordered_json out;
  out["cpu"] = cpu_features().model_name;
  out["threads"] = num_threads();
  out["mem_gbps"] = mem;
  out["dtype"] = dtype_name_arg;
  out["id_sets"] = id_sets;
  out["zipf"] = zipf;
  out["cases"] = nlohmann::ordered_json::array();
  if (!json)
    std::printf("machine: %s, %d threads, memory %.1f GB/s; rows %s, %lld id sets%s\n",
                cpu_summary().c_str(), num_threads(), mem, dtype_name_arg.c_str(),
                static_cast<long long>(id_sets),
                zipf > 0 ? fmt::format(", zipf {}", zipf).c_str() : "");
  for (const Case& c : cases) {
    const int64_t T = c.tables, B = c.batch, L = c.bag, D = c.dim, R = c.rows;
    const size_t elem = dtype_size(dtype);
    check_fits_in_memory(T * R * D * int64_t(elem + 4) + id_sets * T * B * L * 4,
                         fmt::format("bench embedding case {}", c.name),
                         "run the small cases (--cases small-d64-bag1,small-d128-bag20)");
    // Tables (small random values; int8 with per-row scales) and Adagrad state.
    std::vector<AlignedBuffer<unsigned char>> weights;
    std::vector<AlignedBuffer<float>> state, scales;
    std::vector<EmbeddingBagTable> tables;
    for (int64_t t = 0; t < T; ++t) {
      weights.push_back(AlignedBuffer<unsigned char>::huge_pages(size_t(R * D) * elem));
      state.push_back(AlignedBuffer<float>::huge_pages(size_t(R * D)));
      scales.emplace_back(size_t(R));
      unsigned char* w = weights.back().data();
      float* s = scales.back().data();
      parallel_chunks(R, 4096, [&](int64_t b, int64_t e) {
        std::vector<float> row(static_cast<size_t>(D));
        for (int64_t r = b; r < e; ++r) {
          for (int64_t j = 0; j < D; ++j)
            row[size_t(j)] = float((r * 131 + j * 7) % 97) * 1e-3f - 0.048f;
          if (dtype == DType::kI8) {
            s[r] = 0.048f / 127.0f;
            for (int64_t j = 0; j < D; ++j)
              reinterpret_cast<int8_t*>(w)[r * D + j] =
                  static_cast<int8_t>(std::lround(row[size_t(j)] / s[r]));
          } else {
            convert_any(row.data(), DType::kF32, w + size_t(r * D) * elem, dtype, size_t(D));
          }
        }
      });
      std::fill(state.back().begin(), state.back().end(), 0.0f);
      EmbeddingBagTable tab;
      tab.weights = w;
      tab.dtype = dtype;
      tab.row_scales = s;
      tab.state = state.back().data();
      tab.rows = R;
      tab.dim = D;
      tab.out_column = t * D;
      tables.push_back(tab);
    }
    // id_sets batches of ids (table-major, like a Batch), fixed bag sizes.
    std::mt19937_64 rng(7);
    const int64_t per_call = T * B * L;
    std::vector<int32_t> ids(static_cast<size_t>(id_sets * per_call));
    for (int64_t k = 0; k < id_sets; ++k)
      for (int64_t t = 0; t < T; ++t)
        draw_ids(rng, R, zipf, ids.data() + k * per_call + t * B * L, B * L);
    std::vector<int64_t> offsets(static_cast<size_t>(T * B + 1));
    for (size_t i = 0; i < offsets.size(); ++i) offsets[i] = int64_t(i) * L;
    std::vector<float> pooled(static_cast<size_t>(B * T * D)), dout(static_cast<size_t>(B * T * D));
    for (size_t i = 0; i < dout.size(); ++i) dout[i] = float(i % 13) * 1e-3f - 6e-3f;
    auto bags = [&](int64_t i) {
      return BagBatch{T, B, ids.data() + (i % id_sets) * per_call, offsets.data(), nullptr};
    };
    const double fwd_s = median_seconds(
        seconds, [&](int64_t i) { embedding_bag_forward(tables, bags(i), pooled.data(), T * D); });
    auto figures = [&](double s, double bytes) {
      Figures fig;
      fig.seconds = s;
      fig.lookups_per_s = double(per_call) / s;
      fig.gbps = bytes / s / 1e9;
      fig.of_memory = fig.gbps / mem;
      return fig;
    };
    const Figures fwd = figures(fwd_s, double(per_call * D) * double(elem) + double(T * B * D) * 4);
    nlohmann::ordered_json j = {
        {"name", c.name},         {"rows", R}, {"dim", D}, {"bag", L}, {"batch", B}, {"tables", T},
        {"forward", to_json(fwd)}};
    if (!json)
      std::printf("%-18s forward  %8.3f ms  %7.1f M lookups/s  %6.1f GB/s  %5.1f%% of memory\n",
                  c.name, 1e3 * fwd.seconds, fwd.lookups_per_s / 1e6, fwd.gbps,
                  100 * fwd.of_memory);
    if (dtype != DType::kI8) {
      EmbeddingBagScratch scratch;
      for (SparseOptimizer opt :
           {SparseOptimizer::kAdagrad, SparseOptimizer::kRowwiseAdagrad, SparseOptimizer::kSgd}) {
        int64_t distinct = 0, calls = 0;
        const double s = median_seconds(seconds, [&](int64_t i) {
          distinct += embedding_bag_backward_update(tables, bags(i), dout.data(), T * D,
                                                    {opt, 1e-6f, 1e-8f}, &scratch);
          ++calls;
        });
        const double rows_per_call = double(distinct) / double(calls);
        // The row read and written in its dtype, Adagrad's f32 state likewise.
        const double row = 2.0 * double(D) * double(elem);
        const double per_row = opt == SparseOptimizer::kAdagrad          ? row + 2.0 * double(D) * 4
                               : opt == SparseOptimizer::kRowwiseAdagrad ? row + 8
                                                                         : row;
        const Figures up = figures(s, rows_per_call * per_row + double(T * B * D) * 4);
        j[sparse_optimizer_name(opt)] = to_json(up);
        j[sparse_optimizer_name(opt)]["distinct_rows_per_call"] = rows_per_call;
        if (!json)
          std::printf(
              "%-18s %-16s %8.3f ms  %7.1f M lookups/s  %6.1f GB/s  %5.1f%% of memory  (%.0f "
              "distinct rows)\n",
              "", sparse_optimizer_name(opt), 1e3 * up.seconds, up.lookups_per_s / 1e6, up.gbps,
              100 * up.of_memory, rows_per_call);
      }
    }
    out["cases"].push_back(j);
  }
  if (json) print_json(out, 2);
  return 0;
}

}  // namespace hyperion::cli
