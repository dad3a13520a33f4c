#include "recsys/dlrm_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "kernels/dense_ops.h"
#include "kernels/fill.h"
#include "kernels/gemm.h"
#include "kernels/global_norm.h"

namespace hyperion::recsys {

namespace {

constexpr int64_t kAlign = 16;  // floats: each tensor starts on a 64-byte boundary

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// y [rows, out] = x [rows, in] W^T + b, W [out, in].
void linear_forward(const float* x, int64_t rows, int64_t in, int64_t out, const float* w,
                    const float* b, float* y) {
  GemmArgs a = contiguous_gemm_args(Trans::kN, Trans::kT, rows, out, in, x, DType::kF32, w,
                                    DType::kF32, y, DType::kF32);
  a.bias = b;
  gemm(a);
}

// dW [out, in] = dy^T x; db = column sums of dy; dx [rows, in] = dy W (when dx is set).
void linear_backward(const float* x, const float* dy, int64_t rows, int64_t in, int64_t out,
                     const float* w, float* dw, float* db, float* dx) {
  gemm_contiguous(Trans::kT, Trans::kN, out, in, rows, dy, DType::kF32, x, DType::kF32, dw,
                  DType::kF32);
  column_sums(dy, rows, out, db, false);
  if (dx)
    gemm_contiguous(Trans::kN, Trans::kN, rows, in, out, dy, DType::kF32, w, DType::kF32, dx,
                    DType::kF32);
}

}  // namespace

int64_t DlrmModel::add(const std::string& name, Shape shape) {
  const int64_t offset = (int64_t(params_.size()) + kAlign - 1) / kAlign * kAlign;
  tensors_.push_back({name, shape, offset});
  params_.resize(size_t(offset + shape.numel()), 0.0f);
  return offset;
}

DlrmModel::DlrmModel(const DlrmConfig& config, int64_t max_batch, dist::Communicator& comm)
    : config_(config), max_batch_(max_batch), comm_(comm), embeddings_(config, comm) {
  HYP_CHECK(max_batch >= 1, "dlrm: batch {} < 1", max_batch);
  const int64_t N = config_.interaction_dim(), r = config_.cross_rank;
  int64_t in = config_.dense_features;
  for (size_t i = 0; i < config_.bottom_mlp.size(); ++i) {
    const int64_t out = config_.bottom_mlp[i];
    Linear l{in, out, 0, 0};
    l.w = add(fmt::format("bottom_mlp.{}.weight", i), {out, in});
    l.b = add(fmt::format("bottom_mlp.{}.bias", i), {out});
    bottom_.push_back(l);
    in = out;
  }
  for (int64_t l = 0; l < config_.cross_layers; ++l) {
    Cross c;
    c.u = add(fmt::format("cross.{}.U", l), {r, N});
    c.v = add(fmt::format("cross.{}.V", l), {N, r});
    c.b = add(fmt::format("cross.{}.bias", l), {N});
    cross_.push_back(c);
  }
  in = N;
  for (size_t i = 0; i < config_.top_mlp.size(); ++i) {
    const int64_t out = config_.top_mlp[i];
    Linear l{in, out, 0, 0};
    l.w = add(fmt::format("top_mlp.{}.weight", i), {out, in});
    l.b = add(fmt::format("top_mlp.{}.bias", i), {out});
    top_.push_back(l);
    in = out;
  }
  params_.resize((params_.size() + kAlign - 1) / kAlign * kAlign, 0.0f);
  grads_.assign(params_.size(), 0.0f);
  state_.assign(params_.size(), 0.0f);
  const size_t B = size_t(max_batch);
  int64_t widest = N;
  for (const Linear& l : bottom_)
    bottom_acts_.emplace_back(B * size_t(l.out)), widest = std::max(widest, l.out);
  for (const Linear& l : top_)
    top_acts_.emplace_back(B * size_t(l.out)), widest = std::max(widest, l.out);
  xs_.assign(size_t(config_.cross_layers + 1), std::vector<float>(B * size_t(N)));
  us_.assign(size_t(config_.cross_layers), std::vector<float>(B * size_t(r)));
  zs_.assign(size_t(config_.cross_layers), std::vector<float>(B * size_t(N)));
  g_.resize(B * size_t(widest));
  g2_.resize(B * size_t(widest));
  dx0_.resize(B * size_t(N));
  dz_.resize(B * size_t(N));
  du_.resize(B * size_t(r));
  dlogit_.resize(B);
}

void DlrmModel::init(uint64_t seed) {
  // PyTorch's Linear default for the MLPs (uniform +-1/sqrt(in), weights and biases);
  // Xavier-uniform for the cross layers' U and V, zero cross biases (TorchRec's).
  for (const DenseTensor& t : tensors_) {
    float bound = 0.0f;
    const bool cross = t.name.rfind("cross.", 0) == 0;
    if (cross && t.shape.rank() == 2) {
      bound = std::sqrt(6.0f / float(t.shape[0] + t.shape[1]));
    } else if (!cross) {
      // Biases use their layer's fan-in: the weight added just before them.
      const DenseTensor& w = t.shape.rank() == 2 ? t : *(&t - 1);
      bound = 1.0f / std::sqrt(float(w.shape[1]));
    }
    uint64_t h = splitmix64(seed ^ hash_name(t.name));
    float* p = params_.data() + t.offset;
    for (int64_t i = 0; i < t.shape.numel(); ++i) {
      h = splitmix64(h);
      p[i] = (2.0f * float(h >> 40) / 16777216.0f - 1.0f) * bound;
    }
  }
  std::fill(state_.begin(), state_.end(), 0.0f);
  embeddings_.init(seed);
}

void DlrmModel::forward(const Batch& batch) {
  const int64_t rows = batch.rows, F = config_.dense_features, D = config_.embedding_dim;
  const int64_t N = config_.interaction_dim(), r = config_.cross_rank;
  HYP_CHECK(rows >= 1 && rows <= max_batch_,
            "dlrm: a batch of {} examples (this model takes 1 to {})", rows, max_batch_);
  HYP_CHECK(
      int64_t(batch.dense.size()) == rows * F && int64_t(batch.labels.size()) == rows,
      "dlrm: the batch has {} dense values and {} labels for {} examples of {} dense features",
      batch.dense.size(), batch.labels.size(), rows, F);
  rows_ = rows;
  const float* x = batch.dense.data();
  for (size_t i = 0; i < bottom_.size(); ++i) {
    const Linear& l = bottom_[i];
    float* y = bottom_acts_[i].data();
    linear_forward(x, rows, l.in, l.out, params_.data() + l.w, params_.data() + l.b, y);
    relu_forward(y, rows * l.out);
    x = y;
  }
  float* x0 = xs_[0].data();
  for (int64_t b = 0; b < rows; ++b) std::memcpy(x0 + b * N, x + b * D, size_t(D) * sizeof(float));
  embeddings_.forward(batch, x0, N, D);
  for (size_t l = 0; l < cross_.size(); ++l) {
    const Cross& c = cross_[l];
    gemm_contiguous(Trans::kN, Trans::kT, rows, r, N, xs_[l].data(), DType::kF32,
                    params_.data() + c.u, DType::kF32, us_[l].data(), DType::kF32);
    linear_forward(us_[l].data(), rows, r, N, params_.data() + c.v, params_.data() + c.b,
                   zs_[l].data());
    cross_forward(x0, zs_[l].data(), xs_[l].data(), xs_[l + 1].data(), rows * N);
  }
  x = xs_.back().data();
  for (size_t i = 0; i < top_.size(); ++i) {
    const Linear& l = top_[i];
    float* y = top_acts_[i].data();
    linear_forward(x, rows, l.in, l.out, params_.data() + l.w, params_.data() + l.b, y);
    if (i + 1 < top_.size()) relu_forward(y, rows * l.out);
    x = y;
  }
}

// From dlogit_ to grads_ and dx0_ (the gradient of x0, whose embedding columns the
// tables' update reads).
void DlrmModel::backward(const Batch& batch, int64_t rows) {
  const int64_t D = config_.embedding_dim, N = config_.interaction_dim(), r = config_.cross_rank;
  float* g = g_.data();
  float* g2 = g2_.data();
  std::memcpy(g, dlogit_.data(), size_t(rows) * sizeof(float));
  for (size_t i = top_.size(); i-- > 0;) {
    const Linear& l = top_[i];
    if (i + 1 < top_.size()) relu_backward(top_acts_[i].data(), g, rows * l.out);
    const float* x = i == 0 ? xs_.back().data() : top_acts_[i - 1].data();
    linear_backward(x, g, rows, l.in, l.out, params_.data() + l.w, grads_.data() + l.w,
                    grads_.data() + l.b, g2);
    std::swap(g, g2);
  }
  // g: the gradient of x_L. Down the cross layers; dx0_ gathers the x0 terms.
  const float* x0 = xs_[0].data();
  std::fill(dx0_.begin(), dx0_.begin() + rows * N, 0.0f);
  for (size_t l = cross_.size(); l-- > 0;) {
    const Cross& c = cross_[l];
    cross_backward(g, x0, zs_[l].data(), dz_.data(), dx0_.data(), rows * N);
    // z = u V^T + b: dV = dz^T u, db, du = dz V.
    linear_backward(us_[l].data(), dz_.data(), rows, r, N, params_.data() + c.v,
                    grads_.data() + c.v, grads_.data() + c.b, du_.data());
    // u = x_l U^T: dU = du^T x_l; dx_l = dx_{l+1} (the residual) + du U.
    gemm_contiguous(Trans::kT, Trans::kN, r, N, rows, du_.data(), DType::kF32, xs_[l].data(),
                    DType::kF32, grads_.data() + c.u, DType::kF32);
    gemm_contiguous(Trans::kN, Trans::kN, rows, N, r, du_.data(), DType::kF32, params_.data() + c.u,
                    DType::kF32, g, DType::kF32, 1.0f);
  }
  add_to(dx0_.data(), g, rows * N);
  // The bottom MLP's output is x0's first D columns.
  for (int64_t b = 0; b < rows; ++b)
    std::memcpy(g2 + b * D, dx0_.data() + b * N, size_t(D) * sizeof(float));
  std::swap(g, g2);
  for (size_t i = bottom_.size(); i-- > 0;) {
    const Linear& l = bottom_[i];
    relu_backward(bottom_acts_[i].data(), g, rows * l.out);
    const float* x = i == 0 ? batch.dense.data() : bottom_acts_[i - 1].data();
    linear_backward(x, g, rows, l.in, l.out, params_.data() + l.w, grads_.data() + l.w,
                    grads_.data() + l.b, i == 0 ? nullptr : g2);
    std::swap(g, g2);
  }
}

DlrmStepResult DlrmModel::train_step(const Batch& batch, float lr) {
  forward(batch);
  const int64_t rows = rows_;
  const int world = comm_.world_size();
  DlrmStepResult res;
  const double loss = bce_with_logits(top_acts_.back().data(), batch.labels.data(), rows,
                                      dlogit_.data(), 1.0f / static_cast<float>(rows * world));
  res.loss = loss / double(rows);
  backward(batch, rows);
  embeddings_.backward_update(dx0_.data(), config_.interaction_dim(), config_.embedding_dim, lr);
  if (world > 1) comm_.all_reduce(grads_.data(), grads_.size(), dist::ReduceOp::kSum);
  const TensorView gv(grads_.data(), DType::kF32, {int64_t(grads_.size())});
  res.grad_norm = global_l2_norm({&gv, 1});
  adagrad_update(params_.data(), state_.data(), grads_.data(), int64_t(params_.size()), lr,
                 static_cast<float>(config_.adagrad_eps));
  return res;
}

void DlrmModel::predict(const Batch& batch, float* logits) {
  forward(batch);
  embeddings_.end_forward();
  std::memcpy(logits, top_acts_.back().data(), size_t(rows_) * sizeof(float));
}

}  // namespace hyperion::recsys
