#include "recsys/embedding_collection.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "base/error.h"
#include "base/threads.h"
#include "kernels/fill.h"
#include "tensor/convert.h"

namespace hyperion::recsys {

namespace {

std::string table_name(int64_t t) {
  return fmt::format("embedding_bags.t_cat_{}.weight", t);
}

// A name of this collection's tensors: table, first row (-1: whole table), state or not.
struct PieceName {
  int64_t table = -1;
  int64_t first_row = 0;
  bool whole = true;
  bool state = false;
};

bool parse_piece_name(const std::string& name, PieceName& out) {
  static const std::string prefix = "embedding_bags.t_cat_";
  if (name.rfind(prefix, 0) != 0) return false;
  size_t pos = prefix.size();
  size_t end = name.find(".weight", pos);
  if (end == std::string::npos || end == pos) return false;
  try {
    out.table = std::stoll(name.substr(pos, end - pos));
  } catch (const std::exception&) {
    return false;
  }
  std::string rest = name.substr(end + 7);  // after ".weight"
  out.whole = true;
  out.first_row = 0;
  if (!rest.empty() && rest[0] == '@') {
    size_t dot = rest.find('.');
    try {
      out.first_row = std::stoll(rest.substr(1, dot == std::string::npos ? dot : dot - 1));
    } catch (const std::exception&) {
      return false;
    }
    out.whole = false;
    rest = dot == std::string::npos ? "" : rest.substr(dot);
  }
  out.state = rest == ".sum";
  return rest.empty() || out.state;
}

}  // namespace

std::vector<TableShard> EmbeddingCollection::placement(const DlrmConfig& config, int world,
                                                       int rank) {
  const int64_t T = config.tables();
  std::vector<TableShard> shards(static_cast<size_t>(T));
  if (config.sharding == Sharding::kTable || world == 1) {
    // Largest first onto the least loaded rank (ties: the lowest rank).
    std::vector<int64_t> order(static_cast<size_t>(T));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return config.table_rows[size_t(a)] > config.table_rows[size_t(b)];
    });
    std::vector<int64_t> load(static_cast<size_t>(world), 0);
    for (int64_t t : order) {
      const int owner = int(std::min_element(load.begin(), load.end()) - load.begin());
      load[size_t(owner)] += config.table_rows[size_t(t)];
      TableShard& s = shards[size_t(t)];
      s.rows = config.table_rows[size_t(t)];
      s.owner = owner;
      s.block = s.rows;
      s.first_row = 0;
      s.local_rows = owner == rank ? s.rows : 0;
    }
  } else {
    for (int64_t t = 0; t < T; ++t) {
      TableShard& s = shards[size_t(t)];
      s.rows = config.table_rows[size_t(t)];
      s.block = (s.rows + world - 1) / world;
      s.first_row = std::min(s.rows, s.block * rank);
      s.local_rows = std::min(s.rows, s.first_row + s.block) - s.first_row;
    }
  }
  return shards;
}

int64_t EmbeddingCollection::max_rank_bytes(const DlrmConfig& config, int world) {
  const int64_t D = config.embedding_dim;
  const int64_t row_bytes = D * int64_t(dtype_size(config.embedding_dtype)) +
                            4 * sparse_optimizer_state_per_row(config.sparse_optimizer, D);
  int64_t most = 0;
  for (int r = 0; r < world; ++r) {
    int64_t rows = 0;
    for (const TableShard& s : placement(config, world, r)) rows += s.local_rows;
    most = std::max(most, rows * row_bytes);
  }
  return most;
}

EmbeddingCollection::EmbeddingCollection(const DlrmConfig& config, dist::Communicator& comm)
    : config_(config),
      comm_(comm),
      rank_(comm.rank()),
      world_(comm.world_size()),
      shards_(placement(config, comm.world_size(), comm.rank())) {
  const int64_t T = config_.tables(), D = config_.embedding_dim;
  const int64_t per_row = sparse_optimizer_state_per_row(config_.sparse_optimizer, D);
  for (int64_t t = 0; t < T; ++t) {
    const TableShard& s = shards_[size_t(t)];
    weights_.push_back(AlignedBuffer<unsigned char>::huge_pages(
        size_t(s.local_rows * D) * dtype_size(config_.embedding_dtype)));
    state_.push_back(AlignedBuffer<float>::huge_pages(size_t(s.local_rows * per_row)));
  }
}

int64_t EmbeddingCollection::local_bytes() const {
  int64_t n = 0;
  for (size_t t = 0; t < weights_.size(); ++t)
    n += int64_t(weights_[t].size() + state_[t].size() * sizeof(float));
  return n;
}

int EmbeddingCollection::owner_of(int64_t t, int32_t id) const {
  const TableShard& s = shards_[size_t(t)];
  return config_.sharding == Sharding::kTable || world_ == 1 ? s.owner : int(id / s.block);
}

EmbeddingBagTable EmbeddingCollection::local_table(int64_t t) const {
  EmbeddingBagTable tab;
  tab.weights = const_cast<unsigned char*>(weights_[size_t(t)].data());
  tab.dtype = config_.embedding_dtype;
  tab.state = const_cast<float*>(state_[size_t(t)].data());
  tab.rows = shards_[size_t(t)].local_rows;
  tab.dim = config_.embedding_dim;
  tab.pooling = config_.pooling;
  return tab;
}

// Every table this rank holds, its pooled vector at first_column + t * dim.
std::vector<EmbeddingBagTable> EmbeddingCollection::local_tables(int64_t first_column) const {
  std::vector<EmbeddingBagTable> tabs;
  for (int64_t t = 0; t < config_.tables(); ++t) {
    tabs.push_back(local_table(t));
    tabs.back().out_column = first_column + t * config_.embedding_dim;
  }
  return tabs;
}

// The rows received for this rank's distinct ids (rows_, one buffer per table) as tables
// the kernels pool from (their row i is the row of unique_[t][i]).
std::vector<EmbeddingBagTable> EmbeddingCollection::received_tables(int64_t first_column) {
  const int64_t D = config_.embedding_dim;
  std::vector<EmbeddingBagTable> tabs(rows_.size());
  for (size_t t = 0; t < rows_.size(); ++t) {
    EmbeddingBagTable& tab = tabs[t];
    tab.weights = rows_[t].data();
    tab.rows = int64_t(unique_[t].size());
    tab.dim = D;
    tab.pooling = config_.pooling;
    tab.out_column = first_column + int64_t(t) * D;
  }
  return tabs;
}

void EmbeddingCollection::init(uint64_t seed) {
  const int64_t D = config_.embedding_dim;
  for (int64_t t = 0; t < config_.tables(); ++t) {
    const TableShard& s = shards_[size_t(t)];
    const float bound = 1.0f / std::sqrt(static_cast<float>(s.rows));
    unsigned char* w = weights_[size_t(t)].data();
    const DType dt = config_.embedding_dtype;
    parallel_chunks(s.local_rows, 256, [&](int64_t begin, int64_t end) {
      std::vector<float> row(static_cast<size_t>(D));
      for (int64_t r = begin; r < end; ++r) {
        uint64_t h = splitmix64(seed ^ splitmix64(uint64_t(t) << 40 ^ uint64_t(s.first_row + r)));
        for (int64_t j = 0; j < D; ++j) {
          h = splitmix64(h);
          const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
          row[size_t(j)] = (2.0f * u - 1.0f) * bound;
        }
        convert_any(row.data(), DType::kF32, w + size_t(r * D) * dtype_size(dt), dt, size_t(D));
      }
    });
    std::fill(state_[size_t(t)].begin(), state_[size_t(t)].end(), 0.0f);
  }
}

void EmbeddingCollection::forward(const Batch& batch, float* out, int64_t out_stride,
                                  int64_t first_column) {
  const int64_t T = config_.tables();
  HYP_CHECK(int64_t(batch.sparse_offsets.size()) == T * batch.rows + 1,
            "embedding lookup: the batch has {} bag offsets for {} examples and {} tables "
            "(expected {})",
            batch.sparse_offsets.size(), batch.rows, T, T * batch.rows + 1);
  // The ids the offsets point into are all there (the kernels see only the pointer).
  HYP_CHECK(batch.sparse_offsets.front() == 0 &&
                batch.sparse_offsets.back() == int64_t(batch.sparse_ids.size()),
            "embedding lookup: the bag offsets run from {} to {} over {} ids (expected 0 to {})",
            batch.sparse_offsets.front(), batch.sparse_offsets.back(), batch.sparse_ids.size(),
            batch.sparse_ids.size());
  batch_ = &batch;
  if (world_ == 1) {
    embedding_bag_forward(
        local_tables(first_column),
        {T, batch.rows, batch.sparse_ids.data(), batch.sparse_offsets.data(), nullptr}, out,
        out_stride);
    return;
  }
  forward_sharded(batch, out, out_stride, first_column);
}

void EmbeddingCollection::backward_update(const float* dout, int64_t dout_stride,
                                          int64_t first_column, float lr) {
  HYP_CHECK(batch_, "embedding backward: no forward pass before it");
  if (world_ == 1) {
    const int64_t T = config_.tables();
    last_updated_ = embedding_bag_backward_update(
        local_tables(first_column),
        {T, batch_->rows, batch_->sparse_ids.data(), batch_->sparse_offsets.data(), nullptr}, dout,
        dout_stride, {config_.sparse_optimizer, lr, static_cast<float>(config_.adagrad_eps)},
        &scratch_);
  } else {
    backward_sharded(dout, dout_stride, first_column, lr);
  }
  batch_ = nullptr;
}

void EmbeddingCollection::forward_sharded(const Batch& batch, float* out, int64_t out_stride,
                                          int64_t first_column) {
  const int64_t T = config_.tables(), D = config_.embedding_dim, B = batch.rows;
  const int W = world_;
  const int64_t* off = batch.sparse_offsets.data();
  // The kernels check the bags only after the exchange, which reads them first.
  const int64_t nbags = T * B;
  for (int64_t i = 0; i < nbags; ++i)
    HYP_CHECK(batch.sparse_offsets[size_t(i)] <= batch.sparse_offsets[size_t(i + 1)],
              "embedding lookup: the bag offsets decrease at bag {}", i);
  inverse_.resize(batch.sparse_ids.size());
  unique_.resize(size_t(T));
  rows_.resize(size_t(T));
  send_counts_.assign(size_t(W * T), 0);
  // 1. Distinct ids per table, counted per owner (ascending ids meet ascending owners).
  std::vector<int32_t> inv;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t first = off[t * B], n = off[(t + 1) * B] - first;
    for (int64_t p = first; p < first + n; ++p)
      HYP_CHECK(
          batch.sparse_ids[size_t(p)] >= 0 && batch.sparse_ids[size_t(p)] < shards_[size_t(t)].rows,
          "embedding lookup: id {} at position {} is out of range for table {} ({} rows)",
          batch.sparse_ids[size_t(p)], p, t, shards_[size_t(t)].rows);
    dedup_ids(batch.sparse_ids.data() + first, n, unique_[size_t(t)], inv);
    std::copy(inv.begin(), inv.end(), inverse_.begin() + first);
    for (int32_t id : unique_[size_t(t)]) ++send_counts_[size_t(owner_of(t, id) * T + t)];
  }
  // The counts both ways, then the ids.
  recv_counts_.assign(size_t(W * T), 0);
  std::vector<size_t> count_bytes(static_cast<size_t>(W), size_t(T) * sizeof(int64_t));
  comm_.all_to_all_v(send_counts_.data(), count_bytes, recv_counts_.data(), count_bytes);
  std::vector<int32_t> send_ids;
  std::vector<size_t> send_bytes(static_cast<size_t>(W), 0), recv_bytes(static_cast<size_t>(W), 0);
  std::vector<int64_t> cursor(static_cast<size_t>(T), 0);
  for (int p = 0; p < W; ++p)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t c = send_counts_[size_t(p * T + t)];
      const int32_t* u = unique_[size_t(t)].data() + cursor[size_t(t)];
      send_ids.insert(send_ids.end(), u, u + c);
      cursor[size_t(t)] += c;
      send_bytes[size_t(p)] += size_t(c) * sizeof(int32_t);
      recv_bytes[size_t(p)] += size_t(recv_counts_[size_t(p * T + t)]) * sizeof(int32_t);
    }
  int64_t total_recv = 0;
  for (int64_t c : recv_counts_) total_recv += c;
  recv_ids_.assign(size_t(total_recv), 0);
  comm_.all_to_all_v(send_ids.data(), send_bytes, recv_ids_.data(), recv_bytes);
  // 2. Gather the asked-for rows (as f32) and send them back.
  std::vector<float> send_rows(static_cast<size_t>(total_recv * D));
  std::vector<int32_t> local(static_cast<size_t>(total_recv));
  std::vector<int64_t> ones(static_cast<size_t>(total_recv + 1));
  std::iota(ones.begin(), ones.end(), 0);
  int64_t pos = 0;
  for (int p = 0; p < W; ++p)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t c = recv_counts_[size_t(p * T + t)];
      if (c == 0) continue;
      const TableShard& s = shards_[size_t(t)];
      for (int64_t i = pos; i < pos + c; ++i) {
        const int64_t id = recv_ids_[size_t(i)];
        HYP_CHECK(id >= s.first_row && id < s.first_row + s.local_rows,
                  "embedding lookup: rank {} asked rank {} for row {} of table {}, which it does "
                  "not hold",
                  p, rank_, id, t);
        local[size_t(i)] = static_cast<int32_t>(id - s.first_row);
      }
      EmbeddingBagTable tab = local_table(t);
      tab.pooling = Pooling::kSum;
      embedding_bag_forward({&tab, 1}, {1, c, local.data() + pos, ones.data(), nullptr},
                            send_rows.data() + pos * D, D);
      pos += c;
    }
  std::vector<size_t> row_send(static_cast<size_t>(W)), row_recv(static_cast<size_t>(W));
  int64_t want = 0;
  for (int p = 0; p < W; ++p) {
    row_send[size_t(p)] = recv_bytes[size_t(p)] / sizeof(int32_t) * size_t(D) * sizeof(float);
    row_recv[size_t(p)] = send_bytes[size_t(p)] / sizeof(int32_t) * size_t(D) * sizeof(float);
    want += int64_t(send_bytes[size_t(p)] / sizeof(int32_t));
  }
  std::vector<float> got(static_cast<size_t>(want * D));
  comm_.all_to_all_v(send_rows.data(), row_send, got.data(), row_recv);
  // 3. Each table's rows in its distinct-id order, then pool from them.
  std::fill(cursor.begin(), cursor.end(), 0);
  for (int64_t t = 0; t < T; ++t) rows_[size_t(t)].resize(unique_[size_t(t)].size() * size_t(D));
  const float* src = got.data();
  for (int p = 0; p < W; ++p)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t c = send_counts_[size_t(p * T + t)];
      std::memcpy(rows_[size_t(t)].data() + cursor[size_t(t)] * D, src,
                  size_t(c * D) * sizeof(float));
      src += c * D;
      cursor[size_t(t)] += c;
    }
  embedding_bag_forward(received_tables(first_column), {T, B, inverse_.data(), off, nullptr}, out,
                        out_stride);
}

void EmbeddingCollection::backward_sharded(const float* dout, int64_t dout_stride,
                                           int64_t first_column, float lr) {
  const int64_t T = config_.tables(), D = config_.embedding_dim, B = batch_->rows;
  const int W = world_;
  // The summed gradient of every distinct row this rank used (rows_ is reused for it).
  for (std::vector<float>& r : rows_) std::fill(r.begin(), r.end(), 0.0f);
  embedding_bag_backward_update(received_tables(first_column),
                                {T, B, inverse_.data(), batch_->sparse_offsets.data(), nullptr},
                                dout, dout_stride, {SparseOptimizer::kAccumulate, 0, 0}, &scratch_);
  // To the owners, in the order the ids went.
  std::vector<float> send;
  std::vector<size_t> send_bytes(static_cast<size_t>(W), 0), recv_bytes(static_cast<size_t>(W), 0);
  std::vector<int64_t> cursor(static_cast<size_t>(T), 0);
  int64_t total_recv = 0;
  for (int p = 0; p < W; ++p)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t c = send_counts_[size_t(p * T + t)];
      const float* g = rows_[size_t(t)].data() + cursor[size_t(t)] * D;
      send.insert(send.end(), g, g + c * D);
      cursor[size_t(t)] += c;
      send_bytes[size_t(p)] += size_t(c * D) * sizeof(float);
      recv_bytes[size_t(p)] += size_t(recv_counts_[size_t(p * T + t)] * D) * sizeof(float);
      total_recv += recv_counts_[size_t(p * T + t)];
    }
  std::vector<float> got(static_cast<size_t>(total_recv * D));
  comm_.all_to_all_v(send.data(), send_bytes, got.data(), recv_bytes);
  // Per table: the rows asked for by every rank (rank order), one update per distinct row.
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(T));
  std::vector<std::vector<float>> grads(static_cast<size_t>(T));
  int64_t pos = 0;
  for (int p = 0; p < W; ++p)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t c = recv_counts_[size_t(p * T + t)];
      const int64_t first = shards_[size_t(t)].first_row;
      for (int64_t i = pos; i < pos + c; ++i)
        ids[size_t(t)].push_back(static_cast<int32_t>(recv_ids_[size_t(i)] - first));
      grads[size_t(t)].insert(grads[size_t(t)].end(), got.begin() + pos * D,
                              got.begin() + (pos + c) * D);
      pos += c;
    }
  last_updated_ = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = int64_t(ids[size_t(t)].size());
    if (n == 0) continue;
    std::vector<int64_t> offsets(static_cast<size_t>(n + 1));
    std::iota(offsets.begin(), offsets.end(), 0);
    EmbeddingBagTable tab = local_table(t);
    tab.pooling = Pooling::kSum;
    last_updated_ += embedding_bag_backward_update(
        {&tab, 1}, {1, n, ids[size_t(t)].data(), offsets.data(), nullptr}, grads[size_t(t)].data(),
        D, {config_.sparse_optimizer, lr, static_cast<float>(config_.adagrad_eps)}, &scratch_);
  }
}

void EmbeddingCollection::add_tensors(io::SafetensorsWriter& model,
                                      io::SafetensorsWriter& optimizer) const {
  const int64_t D = config_.embedding_dim;
  const int64_t per_row = sparse_optimizer_state_per_row(config_.sparse_optimizer, D);
  for (int64_t t = 0; t < config_.tables(); ++t) {
    const TableShard& s = shards_[size_t(t)];
    if (s.local_rows == 0) continue;
    const std::string name =
        s.local_rows == s.rows ? table_name(t) : fmt::format("{}@{}", table_name(t), s.first_row);
    model.add(name, config_.embedding_dtype, {s.local_rows, D}, weights_[size_t(t)].data());
    if (per_row > 0)
      optimizer.add(name + ".sum", DType::kF32,
                    per_row == 1 ? Shape{s.local_rows} : Shape{s.local_rows, D},
                    state_[size_t(t)].data());
  }
}

void EmbeddingCollection::load(std::span<const io::SafetensorsFile* const> model_files,
                               std::span<const io::SafetensorsFile* const> optimizer_files) {
  const int64_t T = config_.tables(), D = config_.embedding_dim;
  const int64_t per_row = sparse_optimizer_state_per_row(config_.sparse_optimizer, D);
  // The row ranges each table's pieces filled here, to find gaps and overlaps.
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  std::vector<Ranges> covered(static_cast<size_t>(T)), covered_state(static_cast<size_t>(T));
  auto visit = [&](const io::SafetensorsFile& file, bool state_file) {
    for (const io::SafetensorsTensor& x : file.tensors()) {
      const std::string& name = x.name;
      PieceName pn;
      if (!parse_piece_name(name, pn) || pn.state != state_file) continue;
      // SGD keeps no state: a previous optimizer's is left behind.
      if (state_file && per_row == 0) continue;
      HYP_CHECK(x.dtype == DType::kF32 || x.dtype == DType::kBF16 || x.dtype == DType::kF16,
                "checkpoint {}: tensor {} is {}; table rows and state load from f32, bf16 or f16 "
                "(an int8 serving table cannot resume training)",
                file.path(), name, dtype_name(x.dtype));
      HYP_CHECK(pn.table >= 0 && pn.table < T,
                "checkpoint {}: tensor {} is for table {}, but the model has {} tables",
                file.path(), name, pn.table, T);
      const TableShard& s = shards_[size_t(pn.table)];
      const int64_t width = state_file ? per_row : D;
      const int64_t rows = x.shape.rank() == 0 ? 0 : x.shape[0];
      const bool shape_ok = state_file && per_row == 1 ? x.shape.rank() == 1
                                                       : x.shape.rank() == 2 && x.shape[1] == width;
      HYP_CHECK(shape_ok && pn.first_row + rows <= s.rows && (!pn.whole || rows == s.rows),
                "checkpoint {}: tensor {} has shape {} which does not fit table {} ({} rows, "
                "dim {}{})",
                file.path(), name, x.shape.str(), pn.table, s.rows, D,
                state_file ? fmt::format(", {} state floats per row ({})", per_row,
                                         sparse_optimizer_name(config_.sparse_optimizer))
                           : std::string());
      const int64_t lo = std::max(pn.first_row, s.first_row);
      const int64_t hi = std::min(pn.first_row + rows, s.first_row + s.local_rows);
      if (lo >= hi) continue;
      const size_t src_elem = dtype_size(x.dtype);
      const auto* src = static_cast<const unsigned char*>(x.data) +
                        size_t((lo - pn.first_row) * width) * src_elem;
      if (state_file) {
        convert_any(src, x.dtype, state_[size_t(pn.table)].data() + (lo - s.first_row) * width,
                    DType::kF32, size_t((hi - lo) * width));
        covered_state[size_t(pn.table)].emplace_back(lo, hi);
      } else {
        const DType dt = config_.embedding_dtype;
        convert_any(
            src, x.dtype,
            weights_[size_t(pn.table)].data() + size_t((lo - s.first_row) * D) * dtype_size(dt), dt,
            size_t((hi - lo) * D));
        covered[size_t(pn.table)].emplace_back(lo, hi);
      }
    }
  };
  for (const io::SafetensorsFile* f : model_files) visit(*f, false);
  for (const io::SafetensorsFile* f : optimizer_files) visit(*f, true);
  // Ranges sorted must tile [first_row, first_row + local_rows) exactly.
  auto check = [&](Ranges& r, int64_t t, const char* what) {
    const TableShard& s = shards_[size_t(t)];
    std::sort(r.begin(), r.end());
    int64_t at = s.first_row;
    for (const auto& [lo, hi] : r) {
      HYP_CHECK(
          lo == at,
          "checkpoint: the {} of {} {} rows [{}, {}) this rank needs (pieces overlap or leave "
          "a gap at row {})",
          what, table_name(t), lo < at ? "overlap within" : "miss part of", s.first_row,
          s.first_row + s.local_rows, std::min(lo, at));
      at = hi;
    }
    HYP_CHECK(
        at == s.first_row + s.local_rows,
        "checkpoint: the {} of {} stop at row {} of the rows [{}, {}) this rank needs{}", what,
        table_name(t), at, s.first_row, s.first_row + s.local_rows,
        std::string(what) == "state"
            ? fmt::format(" (was the run trained with another dlrm.sparse_optimizer than {}?)",
                          sparse_optimizer_name(config_.sparse_optimizer))
            : std::string());
  };
  for (int64_t t = 0; t < T; ++t) {
    check(covered[size_t(t)], t, "rows");
    if (per_row > 0) check(covered_state[size_t(t)], t, "state");
  }
}

}  // namespace hyperion::recsys
