// Expert parallelism of the MoE layer (see moe_block.h): the all_to_all_v exchanges
// around the grouped GEMMs of this rank's experts.
//
// Layouts. A rank's dispatch plan sorts its rows by expert, so the rows for rank q's
// experts [q*c, (q+1)*c) are one contiguous block and the blocks are in rank order:
// exactly all_to_all_v's packed send layout. The receiver gets one block per source rank,
// each grouped by its c local experts (source-major). The GEMMs run once per source
// block with that block's c group sizes against the same c stacked expert matrices;
// this avoids a second permutation to expert-major order at the cost of W smaller GEMMs
// per projection. Padding rows of the plan (dropless alignment, unused capacity slots)
// travel too: they are zero, give zero outputs and zero gradients, and keep every block
// aligned the way the plan aligned it.
#include <algorithm>
#include <span>
#include <vector>

#include "base/error.h"
#include "dist/communicator.h"
#include "kernels/backend.h"
#include "model/moe_block.h"

namespace hyperion {

ExpertParallel make_expert_parallel(dist::Communicator* comm, int n_experts) {
  HYP_CHECK(comm != nullptr, "expert_parallelism: no communicator");
  const int world = comm->world_size();
  HYP_CHECK(n_experts > 0 && n_experts % world == 0,
            "expert_parallelism: n_experts {} is not divisible by the world size {} (every rank "
            "owns n_experts / world experts)",
            n_experts, world);
  ExpertParallel ep;
  ep.comm = comm;
  ep.count = n_experts / world;
  ep.first = comm->rank() * ep.count;
  return ep;
}

namespace moe::detail {

namespace {

// Grows b to hold at least n elements (contents not kept). The received row count changes
// with every step's routing, so it grows by at least half to settle quickly.
template <typename T>
T* reserve(AlignedBuffer<T>& b, size_t n) {
  if (b.size() < n) b = AlignedBuffer<T>(std::max(n, b.size() + b.size() / 2));
  return b.data();
}

void check_ep(const MoeShape& s, const ExpertParallel& ep, const MoeActs& m) {
  const int world = ep.comm->world_size(), rank = ep.comm->rank();
  HYP_CHECK(ep.count > 0 && int64_t{ep.count} * world == s.e && ep.first == rank * ep.count,
            "expert_parallelism: rank {} of {} owns experts [{}, {}), but the exchange needs the "
            "equal split of n_experts {} (see make_expert_parallel)",
            rank, world, ep.first, ep.first + ep.count, s.e);
  HYP_CHECK(m.ep_state != nullptr,
            "moe: expert_parallelism needs MoeActs::ep_state (one MoeEpState per MoE layer)");
}

// Byte counts of per-rank row counts, `width` elements of `elem` bytes per row.
std::vector<size_t> bytes_of(const std::vector<size_t>& rows, int64_t width, size_t elem) {
  std::vector<size_t> b(rows.size());
  for (size_t q = 0; q < rows.size(); ++q) b[q] = rows[q] * static_cast<size_t>(width) * elem;
  return b;
}

// Rows [row0, row0 + rows) of a [*, width] buffer.
TensorView rows_of(void* base, DType dt, int64_t row0, int64_t rows, int64_t width) {
  return TensorView(
      static_cast<unsigned char*>(base) + static_cast<size_t>(row0 * width) * dtype_size(dt), dt,
      {rows, width});
}

// fn(first row, rows, group sizes of the local experts) for every non-empty source block
// of the received rows (the grouped GEMM takes no empty matrices).
template <typename Fn>
void for_each_source(const MoeEpState& st, int count, Fn&& fn) {
  int64_t row = 0;
  for (size_t q = 0; q < st.recv_rows.size(); ++q) {
    const auto rows = static_cast<int64_t>(st.recv_rows[q]);
    if (rows > 0)
      fn(row, rows,
         std::span<const int64_t>(st.recv_sizes.data() + q * static_cast<size_t>(count),
                                  static_cast<size_t>(count)));
    row += rows;
  }
}

// This rank's experts as stacked [count, out, in] views: compute weights, or gradients.
struct LocalExperts {
  TensorView w1, w3, w2;
};
LocalExperts local_experts(const ParamStore& ps, const LayerParamIndex& p, const ExpertParallel& ep,
                           bool grads) {
  auto view = [&](int first) {
    return grads ? ps.stacked_grad(first + ep.first, ep.count)
                 : ps.stacked_compute_weight(first + ep.first, ep.count);
  };
  return {view(p.gate), view(p.up), view(p.down)};
}

// One source rank's block of the received rows in each per-row buffer.
struct SourceRows {
  TensorView xs, g, u, a, y;
};
SourceRows source_rows(MoeEpState& st, DType act, const MoeShape& s, int64_t row, int64_t rows) {
  return {rows_of(st.xs.data(), act, row, rows, s.d), rows_of(st.g.data(), act, row, rows, s.f),
          rows_of(st.u.data(), act, row, rows, s.f), rows_of(st.a.data(), act, row, rows, s.f),
          rows_of(st.y.data(), act, row, rows, s.d)};
}

}  // namespace

void ep_experts_forward(const ParamStore& ps, const LayerParamIndex& p, const MoeShape& s,
                        const ExpertParallel& ep, DType act, MoeActs& m) {
  check_ep(s, ep, m);
  dist::Communicator& comm = *ep.comm;
  MoeEpState& st = *m.ep_state;
  const auto world = static_cast<size_t>(comm.world_size());
  const int c = ep.count;
  const size_t as = dtype_size(act), uc = static_cast<size_t>(c);
  const std::vector<int64_t>& sizes = m.plan->group_sizes;

  // Group sizes first: rank q gets this rank's sizes of q's experts, which is where the
  // plan's group_sizes already keeps them (block q = entries [q*c, (q+1)*c)).
  st.send_rows.assign(world, 0);
  for (size_t q = 0; q < world; ++q)
    for (size_t x = 0; x < uc; ++x) st.send_rows[q] += static_cast<size_t>(sizes[q * uc + x]);
  st.recv_sizes.resize(world * uc);
  const std::vector<size_t> size_bytes(world, uc * sizeof(int64_t));
  comm.all_to_all_v(sizes.data(), size_bytes, st.recv_sizes.data(), size_bytes);
  st.recv_rows.assign(world, 0);
  for (size_t q = 0; q < world; ++q)
    for (size_t x = 0; x < uc; ++x) {
      const int64_t n = st.recv_sizes[q * uc + x];
      HYP_CHECK(n >= 0, "moe: rank {} sent a negative group size {} for expert {}", q, n,
                ep.first + static_cast<int>(x));
      st.recv_rows[q] += static_cast<size_t>(n);
    }
  size_t total = 0;
  for (size_t r : st.recv_rows) total += r;
  st.recv_total = static_cast<int64_t>(total);
  const size_t ud = static_cast<size_t>(s.d), uf = static_cast<size_t>(s.f);
  reserve(st.xs, total * ud * as);
  reserve(st.g, total * uf * as);
  reserve(st.u, total * uf * as);
  reserve(st.a, total * uf * as);
  reserve(st.y, total * ud * as);

  comm.all_to_all_v(m.xs, bytes_of(st.send_rows, s.d, as), st.xs.data(),
                    bytes_of(st.recv_rows, s.d, as));
  const LocalExperts w = local_experts(ps, p, ep, false);
  KernelBackend& kern = backend_for(ps.device());
  for_each_source(st, c, [&](int64_t row, int64_t rows, std::span<const int64_t> gs) {
    const SourceRows r = source_rows(st, act, s, row, rows);
    kern.grouped_gemm(r.xs, w.w1, gs, r.g, 0.0f);
    kern.grouped_gemm(r.xs, w.w3, gs, r.u, 0.0f);
    kern.gated_forward(GatedActivation::kSilu, r.g, r.u, r.a);
    kern.grouped_gemm(r.a, w.w2, gs, r.y, 0.0f);
  });
  // The outputs go back to the plan layout of the rank that routed them.
  comm.all_to_all_v(st.y.data(), bytes_of(st.recv_rows, s.d, as), m.y,
                    bytes_of(st.send_rows, s.d, as));
}

void ep_experts_backward(const ParamStore& ps, const LayerParamIndex& p, const MoeShape& s,
                         const ExpertParallel& ep, DType act, MoeActs& m,
                         const MoeGradScratch& sc) {
  check_ep(s, ep, m);
  dist::Communicator& comm = *ep.comm;
  MoeEpState& st = *m.ep_state;
  const auto world = static_cast<size_t>(comm.world_size());
  HYP_CHECK(st.active && st.recv_rows.size() == world && st.send_rows.size() == world,
            "moe: expert-parallel backward without an expert-parallel forward of this layer");
  const int c = ep.count;
  const size_t as = dtype_size(act);
  const auto total = static_cast<size_t>(st.recv_total);

  // dy rows to their experts' owners, into y (the outputs were returned in the forward).
  comm.all_to_all_v(sc.dy, bytes_of(st.send_rows, s.d, as), st.y.data(),
                    bytes_of(st.recv_rows, s.d, as));
  float* dxs = reserve(st.dxs, total * static_cast<size_t>(s.d));
  const LocalExperts w = local_experts(ps, p, ep, false), dw = local_experts(ps, p, ep, true);
  KernelBackend& kern = backend_for(ps.device());
  for_each_source(st, c, [&](int64_t row, int64_t rows, std::span<const int64_t> gs) {
    const SourceRows r = source_rows(st, act, s, row, rows);  // y holds dy here
    kern.grouped_gemm_weight_grad(r.a, r.y, gs, dw.w2);
    // da overwrites a (read just above, never needed again); dg and du overwrite g and u.
    kern.grouped_gemm_input_grad(r.y, w.w2, gs, r.a, 0.0f);
    kern.gated_backward(GatedActivation::kSilu, r.a, r.g, r.u, r.g, r.u);
    kern.grouped_gemm_weight_grad(r.xs, r.g, gs, dw.w1);
    kern.grouped_gemm_weight_grad(r.xs, r.u, gs, dw.w3);
    const TensorView dx = rows_of(dxs, DType::kF32, row, rows, s.d);
    kern.grouped_gemm_input_grad(r.g, w.w1, gs, dx, 0.0f);
    kern.grouped_gemm_input_grad(r.u, w.w3, gs, dx, 1.0f);
  });
  // Input gradients back to the plan layout (f32), where moe::backward scatter-adds them.
  comm.all_to_all_v(dxs, bytes_of(st.recv_rows, s.d, sizeof(float)), sc.dxs,
                    bytes_of(st.send_rows, s.d, sizeof(float)));
}

}  // namespace moe::detail

}  // namespace hyperion
