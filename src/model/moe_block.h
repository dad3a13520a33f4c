// The mixture-of-experts MLP of one decoder layer (Mixtral / MaxText moe.py), shared by
// the training model and the generator:
//
//   logits = h W_router^T                     [N, E] f32
//   top-k of softmax(logits); combine weights = the chosen probabilities, renormalised
//     over the k (norm_topk_prob) or not
//   dispatch: the N*k (token, choice) pairs are laid out by expert in a permuted row
//     buffer (see MoeDispatch):
//       dropless  every pair kept, rows sorted by expert, group sizes = loads
//       capped    each expert owns B * capacity rows (capacity per sequence, MaxText's
//                 formula); pairs past an expert's capacity in token order are dropped
//                 and their share of the token's update is zero (the residual passes)
//   experts: xs = gather(h); g = gmm(xs, W1), u = gmm(xs, W3), a = silu(g) * u,
//            y = gmm(a, W2)                    one grouped GEMM per projection
//   out[t] += sum_j weight[t, j] * y[row(t, j)]     (f32, fused into the residual)
//
// Auxiliary losses (added to the training objective, logged apart): the Switch
// load-balance loss (MaxText's per-sequence form, weight load_balance_loss_weight) and
// the router z-loss (ST-MoE, weight router_z_loss_weight).
#pragma once

#include <cstdint>

#include "base/aligned.h"

#include "kernels/moe_routing.h"
#include "model/llama_config.h"
#include "model/param_store.h"

namespace hyperion {

// Training-time choices of the MoE layers (not part of the checkpoint's shape).
struct MoeOptions {
  double capacity_factor = -1.0;  // > 0: capped experts; <= 0: dropless
  float load_balance_weight = 0.0f;
  float z_loss_weight = 0.0f;
};

// Sizes of one MoE layer for micro-batches of batch x seq_len tokens.
struct MoeShape {
  int64_t b = 1, t = 1, n = 1;  // sequences, tokens per sequence, n = b * t
  int64_t d = 0, f = 0;         // model dim, expert intermediate size
  int64_t e = 0, k = 0;         // experts, experts per token
  int64_t capacity = -1;        // per expert and sequence; -1 = dropless
  int64_t row_align = 1;        // dropless: each expert's rows padded to a multiple of this
  int64_t rows = 0;             // most rows of the permuted buffer (its allocation)
  bool normalize = true;
};
// Dropless training pads each expert's rows to a multiple of 32 (see moe_dispatch_plan):
// at most 31 zero rows per expert, against a JIT-compiled GEMM kernel per new row count.
inline constexpr int64_t kMoeTrainRowAlign = 32;
MoeShape moe_shape(const LlamaConfig& c, const MoeOptions& o, int64_t batch, int64_t seq_len,
                   int64_t row_align = kMoeTrainRowAlign);

// One MoE layer's forward state: what the backward needs (or what is recomputed).
struct MoeActs {
  float* logits = nullptr;     // [n, e]
  float* probs = nullptr;      // [n, e]
  int32_t* experts = nullptr;  // [n, k]
  float* weights = nullptr;    // [n, k]
  MoeDispatch* plan = nullptr;
  void* xs = nullptr;                   // gathered inputs [rows, d]
  void* g = nullptr;                    // [rows, f]
  void* u = nullptr;                    // [rows, f]
  void* a = nullptr;                    // silu(g) * u [rows, f]
  void* y = nullptr;                    // expert outputs [rows, d]
  float lb_loss = 0.0f, z_loss = 0.0f;  // weighted, as added to the loss
};

// Owned buffers behind MoeActs for inference (the generator and the serving runner):
// one set, reused by every MoE layer of a forward pass.
struct MoeInferenceBuffers {
  // Sizes the buffers for shape `s` (dropless) and activation dtype `act`.
  void reserve(const MoeShape& s, DType act);
  MoeActs acts();
  AlignedBuffer<float> logits, probs, weights;
  AlignedBuffer<int32_t> experts;
  AlignedBuffer<unsigned char> xs, g, u, a, y;
  MoeDispatch plan;
};

// Scratch the backward needs (sized by moe_shape; shareable by all layers).
struct MoeGradScratch {
  void* dy = nullptr;         // [rows, d] act
  void* da = nullptr;         // [rows, f] act
  float* dxs = nullptr;       // [rows, d]
  float* dlogits = nullptr;   // [n, e]
  float* dprobs = nullptr;    // [n, e]
  void* dlogits_c = nullptr;  // [n, e] act
  float* dweights = nullptr;  // [n, k]
};

namespace moe {

// Routing, dispatch and experts from h (act [n, d]); when out is not null, adds the
// combined expert outputs to it (f32 [n, d]). Fills every MoeActs buffer and the aux
// losses.
void forward(const ParamStore& ps, const LayerParamIndex& p, const MoeShape& s, const MoeOptions& o,
             const void* h, DType act, MoeActs& m, float* out);
// Recomputes xs and a from h and the saved g, u and plan (the minimal remat policy).
void recompute(const MoeShape& s, const void* h, DType act, MoeActs& m);
// dout: gradient w.r.t. the layer's update (f32 [n, d]). Accumulates the weight
// gradients (router, experts) and WRITES dh = gradient w.r.t. h (f32 [n, d]). The aux
// losses' gradients are scaled by dloss. g and u are overwritten by their gradients.
void backward(const ParamStore& ps, const LayerParamIndex& p, const MoeShape& s,
              const MoeOptions& o, const void* h, DType act, MoeActs& m, const float* dout,
              float dloss, const MoeGradScratch& scratch, float* dh);

}  // namespace moe

}  // namespace hyperion
