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
//
// Expert parallelism (MoeOptions::ep, moe_expert_parallel.cc): the E experts are split
// evenly over the ranks of a communicator, rank q owning experts [q*E/W, (q+1)*E/W).
// Every rank routes its own tokens with the replicated router and builds its dispatch
// plan as above; the plan's rows are sorted by expert, so the rows bound for rank q are
// one contiguous block. all_to_all_v sends each block to its owner (after the per-expert
// group sizes), the owner runs the grouped GEMMs of its local experts once per source
// block, and a second all_to_all_v returns the outputs into the plan layout, where the
// combine runs locally. The backward mirrors it (dy out, dxs back). Consequences:
//   * a rank holds and updates only its local experts: their gradients are the SUM over
//     every rank's tokens, and the other experts' gradients are never written. A trainer
//     that averages data-parallel gradients (router, attention, ...) over W ranks must
//     divide the local experts' gradients by W to match, and must not all-reduce them.
//   * the router and aux losses stay rank-local (each rank's own tokens and sequences).
#pragma once

#include <cstdint>
#include <vector>

#include "base/aligned.h"

#include "kernels/moe_routing.h"
#include "model/decoder_config.h"
#include "model/param_store.h"

namespace hyperion::dist {
class Communicator;
}  // namespace hyperion::dist

namespace hyperion {
class KernelBackend;
}  // namespace hyperion

namespace hyperion {

// This rank's share of the experts under expert parallelism: experts
// [first, first + count) of every MoE layer, count = E / world, first = rank * count
// (the exchange relies on that equal, rank-ordered split; moe::forward checks it).
struct ExpertParallel {
  dist::Communicator* comm = nullptr;  // not owned; null = no expert parallelism
  int first = 0;
  int count = 0;
  bool enabled() const { return comm != nullptr; }
};
// The equal split of n_experts over comm's ranks. Throws (naming expert_parallelism and
// n_experts) unless the world size divides n_experts.
ExpertParallel make_expert_parallel(dist::Communicator* comm, int n_experts);

// Training-time choices of the MoE layers (not part of the checkpoint's shape).
struct MoeOptions {
  double capacity_factor = -1.0;  // > 0: capped experts; <= 0: dropless
  float load_balance_weight = 0.0f;
  float z_loss_weight = 0.0f;
  ExpertParallel ep;  // disabled by default
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
MoeShape moe_shape(const DecoderConfig& c, const MoeOptions& o, int64_t batch, int64_t seq_len,
                   int64_t row_align = kMoeTrainRowAlign);

// One MoE layer's expert-parallel state: the rows this rank received for its local
// experts and their activations, kept from the forward to the backward (the remat
// policies do not apply to them: moe::recompute leaves them alone). One per MoE layer,
// owned by the caller; the buffers grow as needed (the received row count varies with
// the routing of every rank) and are reused across steps.
struct MoeEpState {
  bool active = false;                // the last forward of this layer ran with EP
  std::vector<size_t> send_rows;      // [world] plan rows sent to each rank
  std::vector<size_t> recv_rows;      // [world] rows received from each rank
  std::vector<int64_t> recv_sizes;    // [world * count] group sizes, by source then expert
  int64_t recv_total = 0;             // sum of recv_rows
  AlignedBuffer<unsigned char> xs;    // [recv_total, d] act: received inputs
  AlignedBuffer<unsigned char> g, u;  // [recv_total, f] act (their gradients in backward)
  AlignedBuffer<unsigned char> a;     // [recv_total, f] act: silu(g) * u, then its gradient
  AlignedBuffer<unsigned char> y;     // [recv_total, d] act: outputs, then dy (transient)
  AlignedBuffer<float> dxs;           // [recv_total, d]: input gradients (transient)
};

// One MoE layer's forward state: what the backward needs (or what is recomputed).
// With expert parallelism xs is this rank's plan rows (the send buffer), y the outputs
// returned by the owners, g, u and a are unused, and ep_state must be set.
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
  MoeEpState* ep_state = nullptr;       // required with expert parallelism, else unused
};

// Owned buffers behind MoeActs for inference (the generator and the serving runner):
// one set, reused by every MoE layer of a forward pass.
struct MoeInferenceBuffers {
  // Sizes the buffers for shape `s` (dropless) and activation dtype `act`, from `alloc`
  // (the device the model runs on; the plan stays on the host).
  void reserve(const MoeShape& s, DType act, Allocator& alloc);
  MoeActs acts();
  DeviceBuffer logits, probs, weights, experts, xs, g, u, a, y;
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
// Nothing to do after an expert-parallel forward: its state is kept whole.
void recompute(KernelBackend& kern, const MoeShape& s, const void* h, DType act, MoeActs& m);
// dout: gradient w.r.t. the layer's update (f32 [n, d]). Accumulates the weight
// gradients (router, experts) and WRITES dh = gradient w.r.t. h (f32 [n, d]). The aux
// losses' gradients are scaled by dloss. g and u are overwritten by their gradients.
// With expert parallelism every rank must call it (same layer order as the forward);
// only the local experts' gradients are accumulated (see the top of this file).
void backward(const ParamStore& ps, const LayerParamIndex& p, const MoeShape& s,
              const MoeOptions& o, const void* h, DType act, MoeActs& m, const float* dout,
              float dloss, const MoeGradScratch& scratch, float* dh);

namespace detail {
// The expert computation under expert parallelism (moe_expert_parallel.cc), between the
// gather and the combine of moe::forward / moe::backward. Forward: m.xs (plan rows) ->
// m.y (plan rows), filling *m.ep_state. Backward: sc.dy (plan rows) -> sc.dxs (plan rows,
// f32), accumulating the local experts' weight gradients.
void ep_experts_forward(const ParamStore& ps, const LayerParamIndex& p, const MoeShape& s,
                        const ExpertParallel& ep, DType act, MoeActs& m);
void ep_experts_backward(const ParamStore& ps, const LayerParamIndex& p, const MoeShape& s,
                         const ExpertParallel& ep, DType act, MoeActs& m, const MoeGradScratch& sc);
}  // namespace detail

}  // namespace moe

}  // namespace hyperion
