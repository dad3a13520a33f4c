#include "train/parallel.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/system_memory.h"
#include "base/threads.h"
#include "tensor/convert.h"

namespace hyperion {

const char* parallel_mode_name(ParallelMode m) {
  switch (m) {
    case ParallelMode::kData:
      return "data";
    case ParallelMode::kZero1:
      return "zero1";
    case ParallelMode::kFsdp:
      return "fsdp";
    case ParallelMode::kExpert:
      return "expert";
  }
  return "invalid";
}

MemoryPlan rank_memory_plan(const MemoryPlan& full, const DecoderConfig& c, ParallelMode mode,
                            int world) {
  MemoryPlan p = full;
  if (world <= 1 || mode == ParallelMode::kData) return p;
  // Of `bytes`, `per_param` bytes for each of `sharded` parameters are split over the
  // ranks. Saturated counts stay saturated (the part is then no longer within them).
  auto shard = [&](int64_t& bytes, int64_t per_param, int64_t sharded) {
    if (bytes == kSaturatedBytes) return;
    const int64_t part = sat_mul(per_param, sharded);
    bytes = bytes - part + part / world;
  };
  const int64_t bf16_bytes = full.compute_weight_bytes > 0 ? 2 : 0;
  if (mode == ParallelMode::kZero1) {
    shard(p.optimizer_bytes, 8, p.params);
    return p;
  }
  const int64_t sharded =
      mode == ParallelMode::kFsdp
          ? p.params
          : sat_mul(sat_mul(c.n_moe_layers(), c.n_experts), sat_mul(3 * c.dim, c.expert_ffn_dim()));
  shard(p.weight_bytes, 4, sharded);
  shard(p.compute_weight_bytes, bf16_bytes, sharded);
  shard(p.grad_bytes, 4, sharded);
  shard(p.optimizer_bytes, 8, sharded);
  return p;
}

namespace {

// Piece boundaries of [0, n) over `world` ranks, on multiples of 16 elements.
std::vector<size_t> split_counts(int64_t n, int world) {
  std::vector<size_t> counts(static_cast<size_t>(world));
  int64_t prev = 0;
  for (int r = 0; r < world; ++r) {
    int64_t next = r + 1 == world ? n : (n * (r + 1) / world) / 16 * 16;
    next = std::max(next, prev);
    counts[static_cast<size_t>(r)] = static_cast<size_t>(next - prev);
    prev = next;
  }
  return counts;
}

}  // namespace

GradientSync::GradientSync(ParamStore& params, dist::Communicator& comm, ParallelMode mode,
                           bool overlap)
    : params_(params),
      comm_(comm),
      mode_(mode),
      overlap_(overlap),
      world_(comm.world_size()),
      rank_(comm.rank()) {
  const DecoderConfig& cfg = params.config();
  const auto& infos = params.infos();
  experts_of_rank_.resize(static_cast<size_t>(world_));
  if (mode == ParallelMode::kExpert) {
    HYP_CHECK(cfg.n_experts > 0, "expert_parallelism = {} needs an MoE model (n_experts > 0)",
              world_);
    HYP_CHECK(cfg.n_experts % world_ == 0,
              "expert_parallelism = {} must divide the model's n_experts = {}", world_,
              cfg.n_experts);
  }
  for (int b = 0; b < params.num_buckets(); ++b) {
    Bucket k;
    std::tie(k.begin, k.end) = params.bucket_range(b);
    k.reduce_end = k.end;
    const int l = b - 1;
    if (mode == ParallelMode::kExpert && l >= 0 && l < cfg.n_layers && params.layer(l).moe()) {
      const LayerParamIndex& p = params.layer(l);
      k.reduce_end = infos[static_cast<size_t>(p.gate)].offset;
      const int per = static_cast<int>(cfg.n_experts / world_);
      for (int q = 0; q < world_; ++q)
        for (int first : {p.gate, p.up, p.down}) {
          const ParamInfo& lo = infos[static_cast<size_t>(first + q * per)];
          const ParamInfo& hi = infos[static_cast<size_t>(first + (q + 1) * per - 1)];
          experts_of_rank_[static_cast<size_t>(q)].emplace_back(lo.offset, hi.offset + hi.numel);
        }
    }
    k.counts = split_counts(k.end - k.begin, world_);
    k.own_begin = k.begin;
    for (int r = 0; r < rank_; ++r)
      k.own_begin += static_cast<int64_t>(k.counts[static_cast<size_t>(r)]);
    k.own_end = k.own_begin + static_cast<int64_t>(k.counts[static_cast<size_t>(rank_)]);
    buckets_.push_back(std::move(k));
  }
  own_experts_ = experts_of_rank_[static_cast<size_t>(rank_)];
  // FSDP holds full-size gradients only bucket by bucket: start from released (zero)
  // pages, which cost no memory until a backward writes them.
  if (mode == ParallelMode::kFsdp && params_.has_grads())
    release_pages(params_.grads(), static_cast<size_t>(params_.size()) * sizeof(float), true);
}

std::vector<OwnedRange> GradientSync::owned_ranges() const {
  std::vector<OwnedRange> out;
  switch (mode_) {
    case ParallelMode::kData:
      out.push_back({0, params_.size(), true});
      break;
    case ParallelMode::kZero1:
    case ParallelMode::kFsdp:
      for (const Bucket& b : buckets_)
        if (b.own_end > b.own_begin) out.push_back({b.own_begin, b.own_end, false});
      break;
    case ParallelMode::kExpert: {
      // Everything outside every rank's experts is replicated; this rank's experts are its shard.
      std::vector<std::pair<int64_t, int64_t>> all;
      for (const auto& v : experts_of_rank_) all.insert(all.end(), v.begin(), v.end());
      std::sort(all.begin(), all.end());
      int64_t at = 0;
      for (const auto& [lo, hi] : all) {
        if (lo > at) out.push_back({at, lo, true});
        if (std::find(own_experts_.begin(), own_experts_.end(), std::make_pair(lo, hi)) !=
            own_experts_.end())
          out.push_back({lo, hi, false});
        at = hi;
      }
      if (at < params_.size()) out.push_back({at, params_.size(), true});
      break;
    }
  }
  return out;
}

std::vector<int> GradientSync::tensor_writers() const {
  const auto& infos = params_.infos();
  std::vector<int> writer(infos.size(), -1);
  int64_t total = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    for (int q = 0; q < world_ && writer[i] < 0; ++q)
      for (const auto& [lo, hi] : experts_of_rank_[static_cast<size_t>(q)])
        if (infos[i].offset >= lo && infos[i].offset < hi) writer[i] = q;
    if (writer[i] < 0) total += infos[i].numel;
  }
  int64_t cum = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    if (writer[i] >= 0) continue;
    const int64_t mid = cum + infos[i].numel / 2;
    writer[i] =
        static_cast<int>(std::min<int64_t>(world_ - 1, mid * world_ / std::max<int64_t>(total, 1)));
    cum += infos[i].numel;
  }
  return writer;
}

void GradientSync::zero_grads() {
  if (!params_.has_grads()) return;  // a frozen store
  switch (mode_) {
    case ParallelMode::kData:
    case ParallelMode::kZero1:
      params_.zero_grads();
      return;
    case ParallelMode::kFsdp:
      // The full-size gradient pages were zeroed and released after each reduction,
      // except this rank's pieces, which hold the reduced sums.
      for (const Bucket& k : buckets_)
        std::memset(params_.grads() + k.own_begin, 0,
                    static_cast<size_t>(k.own_end - k.own_begin) * sizeof(float));
      return;
    case ParallelMode::kExpert:
      for (const OwnedRange& r : owned_ranges())
        std::memset(params_.grads() + r.begin, 0, static_cast<size_t>(r.size()) * sizeof(float));
      return;
  }
}

void GradientSync::begin_micro_batch(bool last) {
  last_micro_ = last;
}

void GradientSync::issue_reduce(int b) {
  Bucket& k = buckets_[static_cast<size_t>(b)];
  float* g = params_.grads();
  if (mode_ == ParallelMode::kData || mode_ == ParallelMode::kExpert) {
    k.reduce = comm_.all_reduce_async(g + k.begin, static_cast<size_t>(k.reduce_end - k.begin),
                                      dist::ReduceOp::kSum);
  } else {
    // In place: this rank's piece of the sum lands in its own range of the gradient
    // buffer. FSDP accumulates micro-batches through it: the piece already holds the
    // earlier micro-batches' sum, and the other ranks' copies of it were zeroed.
    k.reduce =
        comm_.reduce_scatter_v_async(g + k.begin, g + k.own_begin, k.counts, dist::ReduceOp::kSum);
  }
  k.reduce_pending = true;
}

void GradientSync::grads_ready(int b) {
  if (!params_.has_grads()) return;  // a frozen store: gathers only
  // Data parallel and ZeRO-1 accumulate micro-batches locally and reduce once.
  if (mode_ != ParallelMode::kFsdp && !last_micro_) return;
  if (!overlap_) {
    pending_.push_back(b);  // reduced after the backward, in end_micro_batch
    return;
  }
  issue_reduce(b);
  // FSDP: finish the previous bucket's reduction (issued one bucket ago, normally done)
  // so at most two buckets of full-size gradients are alive.
  if (mode_ == ParallelMode::kFsdp && !pending_.empty()) {
    finish_reduce(pending_.back());
    pending_.clear();
  }
  pending_.push_back(b);
}

void GradientSync::finish_reduce(int b) {
  Bucket& k = buckets_[static_cast<size_t>(b)];
  if (!k.reduce_pending) return;
  comm_.wait(k.reduce);
  k.reduce_pending = false;
  if (mode_ == ParallelMode::kFsdp) {
    // Only this rank's piece is kept; the rest of the bucket's full-size gradient goes.
    release_pages(params_.grads() + k.begin,
                  static_cast<size_t>(k.own_begin - k.begin) * sizeof(float), true);
    release_pages(params_.grads() + k.own_end,
                  static_cast<size_t>(k.end - k.own_end) * sizeof(float), true);
  }
}

void GradientSync::end_micro_batch() {
  for (int b : pending_) {
    // Without overlap the collectives start only now, one at a time (the baseline).
    if (!overlap_) issue_reduce(b);
    finish_reduce(b);
  }
  pending_.clear();
}

void GradientSync::sync_bf16(int64_t begin, int64_t end) {
  if (!params_.has_bf16() || end <= begin) return;
  const float* src = params_.params() + begin;
  bf16* dst = params_.params_bf16() + begin;
  parallel_chunks(end - begin, 1 << 16, [&](int64_t b, int64_t e) {
    convert_f32_to_bf16(src + b, dst + b, static_cast<size_t>(e - b));
  });
}

void GradientSync::after_optimizer_step() {
  if (mode_ == ParallelMode::kZero1) {
    dist::Communicator::Request last = 0;
    for (Bucket& k : buckets_)
      last = comm_.all_gather_v_async(params_.params() + k.begin, k.counts);
    comm_.wait(last);
    for (const Bucket& k : buckets_) {
      sync_bf16(k.begin, k.own_begin);
      sync_bf16(k.own_end, k.end);
    }
  } else if (mode_ == ParallelMode::kFsdp) {
    for (Bucket& k : buckets_) {
      if (k.state == Bucket::kInFlight) comm_.wait(k.gather);
      if (k.state != Bucket::kReleased) release_params(k);
      k.state = Bucket::kReleased;
    }
  }
}

void GradientSync::issue_gather(Bucket& k) {
  k.gather = comm_.all_gather_v_async(params_.params() + k.begin, k.counts);
  k.state = Bucket::kInFlight;
}

void GradientSync::release_params(const Bucket& k) {
  release_pages(params_.params() + k.begin, static_cast<size_t>(k.own_begin - k.begin) * 4, false);
  release_pages(params_.params() + k.own_end, static_cast<size_t>(k.end - k.own_end) * 4, false);
  if (params_.has_bf16()) {
    release_pages(params_.params_bf16() + k.begin, static_cast<size_t>(k.own_begin - k.begin) * 2,
                  false);
    release_pages(params_.params_bf16() + k.own_end, static_cast<size_t>(k.end - k.own_end) * 2,
                  false);
  }
}

void GradientSync::use(int b, int next) {
  if (mode_ != ParallelMode::kFsdp) return;
  Bucket& k = buckets_[static_cast<size_t>(b)];
  if (k.state == Bucket::kReleased) issue_gather(k);
  if (k.state == Bucket::kInFlight) {
    comm_.wait(k.gather);
    sync_bf16(k.begin, k.own_begin);
    sync_bf16(k.own_end, k.end);
    k.state = Bucket::kResident;
  }
  if (overlap_ && next >= 0) {
    Bucket& n = buckets_[static_cast<size_t>(next)];
    if (n.state == Bucket::kReleased) issue_gather(n);
  }
}

void GradientSync::done(int b, bool again) {
  if (mode_ != ParallelMode::kFsdp || again) return;
  Bucket& k = buckets_[static_cast<size_t>(b)];
  if (k.state != Bucket::kResident) return;
  release_params(k);
  k.state = Bucket::kReleased;
}

void GradientSync::gather_all(bool experts) {
  if (mode_ == ParallelMode::kExpert && experts) {
    // Region i (one layer's w1, w3 or w2 stack) holds every rank's block in rank order.
    const size_t regions = own_experts_.size();
    for (size_t i = 0; i < regions; ++i) {
      std::vector<size_t> counts(static_cast<size_t>(world_));
      for (int q = 0; q < world_; ++q) {
        const auto& r = experts_of_rank_[static_cast<size_t>(q)][i];
        counts[static_cast<size_t>(q)] = static_cast<size_t>(r.second - r.first);
      }
      const int64_t begin = experts_of_rank_[0][i].first;
      const int64_t end = experts_of_rank_[static_cast<size_t>(world_ - 1)][i].second;
      comm_.all_gather_v(params_.params() + begin, counts);
      sync_bf16(begin, end);
    }
    return;
  }
  if (mode_ != ParallelMode::kFsdp) return;
  for (Bucket& k : buckets_)
    if (k.state == Bucket::kReleased) issue_gather(k);
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) use(b, -1);
}

void GradientSync::release_unowned() {
  if (mode_ == ParallelMode::kFsdp) {
    for (Bucket& k : buckets_) {
      release_params(k);
      k.state = Bucket::kReleased;
    }
  }
  if (mode_ == ParallelMode::kExpert) {
    // Other ranks' experts are never read or written here.
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      for (const auto& [lo, hi] : experts_of_rank_[static_cast<size_t>(q)]) {
        const size_t n = static_cast<size_t>(hi - lo);
        release_pages(params_.params() + lo, n * 4, false);
        if (params_.has_grads()) release_pages(params_.grads() + lo, n * 4, true);
        if (params_.has_bf16()) release_pages(params_.params_bf16() + lo, n * 2, false);
      }
    }
  }
}

}  // namespace hyperion
