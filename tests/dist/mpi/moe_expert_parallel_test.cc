// Expert parallelism of the MoE layer at the world size mpirun gives (CTest: 2 and 4
// ranks): each rank routes its own tokens and owns E / world experts. The reference is
// the single-process MoE over every rank's tokens concatenated, which each rank computes
// locally (every rank's inputs come from per-rank seeds). Checked: this rank's output and
// input-gradient rows, its local experts' gradients (the sum over all ranks' tokens), the
// router gradient summed over ranks, the aux losses averaged over ranks, and that the
// other experts' gradients are never written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/aligned.h"
#include "base/error.h"
#include "dist/communicator.h"
#include "kernels/backend.h"
#include "model/moe_block.h"
#include "model/param_store.h"
#include "mpi_test_env.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using dist::Communicator;
using dist::test_comm;

constexpr int64_t kExperts = 8;  // divides 2 and 4 ranks
constexpr int64_t kBatch = 2, kSeq = 8;

DecoderConfig ep_config(int64_t e) {
  DecoderConfig c;
  c.vocab_size = 11;
  c.dim = 32;
  c.n_layers = 1;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.ffn_dim = 40;
  c.max_seq_len = 16;
  c.n_experts = e;
  c.n_experts_per_tok = 2;
  c.moe_ffn_dim = 16;
  return c;
}

template <typename T>
AlignedBuffer<T> zeros(int64_t n) {
  AlignedBuffer<T> b(static_cast<size_t>(n));
  std::memset(b.data(), 0, b.size() * sizeof(T));
  return b;
}

// Buffers for one moe::forward / backward call; activation rows in `act`.
struct MoeRun {
  MoeShape s;
  MoeOptions o;
  DType act;
  MoeDispatch plan;
  MoeEpState ep;
  AlignedBuffer<float> logits, probs, weights, dxs, dlogits, dprobs, dweights;
  AlignedBuffer<int32_t> experts;
  AlignedBuffer<unsigned char> xs, g, u, a, y, dy, da, dlogits_c;
  MoeActs m;
  MoeGradScratch sc;

  MoeRun(const DecoderConfig& c, const MoeOptions& opt, int64_t b, int64_t t, DType act_dtype)
      : o(opt), act(act_dtype) {
    s = moe_shape(c, opt, b, t);
    const auto as = static_cast<int64_t>(dtype_size(act));
    logits = zeros<float>(s.n * s.e);
    probs = zeros<float>(s.n * s.e);
    weights = zeros<float>(s.n * s.k);
    experts = zeros<int32_t>(s.n * s.k);
    xs = zeros<unsigned char>(s.rows * s.d * as);
    y = zeros<unsigned char>(s.rows * s.d * as);
    g = zeros<unsigned char>(s.rows * s.f * as);
    u = zeros<unsigned char>(s.rows * s.f * as);
    a = zeros<unsigned char>(s.rows * s.f * as);
    dy = zeros<unsigned char>(s.rows * s.d * as);
    da = zeros<unsigned char>(s.rows * s.f * as);
    dxs = zeros<float>(s.rows * s.d);
    dlogits = zeros<float>(s.n * s.e);
    dprobs = zeros<float>(s.n * s.e);
    dlogits_c = zeros<unsigned char>(s.n * s.e * as);
    dweights = zeros<float>(s.n * s.k);
    m = {logits.data(), probs.data(), experts.data(), weights.data(), &plan,
         xs.data(),     g.data(),     u.data(),       a.data(),       y.data()};
    if (o.ep.enabled()) m.ep_state = &ep;
    sc = {dy.data(),     da.data(),        dxs.data(),     dlogits.data(),
          dprobs.data(), dlogits_c.data(), dweights.data()};
  }

  std::vector<float> forward(const ParamStore& ps, const void* h) {
    std::vector<float> out(static_cast<size_t>(s.n * s.d), 0.0f);
    moe::forward(ps, ps.layer(0), s, o, h, act, m, out.data());
    return out;
  }
  std::vector<float> backward(const ParamStore& ps, const void* h, const std::vector<float>& dout,
                              float dloss) {
    std::vector<float> dh(static_cast<size_t>(s.n * s.d), 0.0f);
    moe::backward(ps, ps.layer(0), s, o, h, act, m, dout.data(), dloss, sc, dh.data());
    return dh;
  }
};

// Rank q's inputs (h, dout: [b*t, d]), the same on every rank that rebuilds them.
std::vector<float> normals(uint32_t seed, int64_t n) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}
std::vector<float> rank_h(int q, int64_t n) {
  return normals(1000u + static_cast<uint32_t>(q), n);
}
std::vector<float> rank_dout(int q, int64_t n) {
  return normals(2000u + static_cast<uint32_t>(q), n);
}

// Rows in the activation dtype (bytes).
std::vector<unsigned char> as_act(const std::vector<float>& v, DType act) {
  std::vector<unsigned char> out(v.size() * dtype_size(act));
  if (act == DType::kF32)
    std::memcpy(out.data(), v.data(), out.size());
  else
    convert_f32_to_bf16(v.data(), reinterpret_cast<bf16*>(out.data()), v.size());
  return out;
}

// |got - want| <= rel * max|want| over the tensor (the GEMMs sum in other orders).
void expect_close(const float* got, const float* want, size_t n, double rel,
                  const std::string& what) {
  double scale = 1e-30;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(double(want[i])));
  int bad = 0;
  for (size_t i = 0; i < n && bad < 5; ++i) {
    const double diff = std::fabs(double(got[i]) - double(want[i]));
    if (!(diff <= rel * scale)) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs reference " << want[i]
                    << " (scale " << scale << ")";
      ++bad;
    }
  }
}

struct Case {
  const char* name;
  double capacity_factor;
  DType act;
  float lb_weight, z_weight;
  double rel;
  bool rerun_forward;  // the `full` remat pattern: forward again (no output) before backward
};

void run_case(const Case& cs) {
  SCOPED_TRACE(cs.name);
  Communicator& comm = test_comm();
  const int world = comm.world_size(), rank = comm.rank();
  const DecoderConfig c = ep_config(kExperts);
  const int64_t n = kBatch * kSeq, d = c.dim;
  ParamStore ps(c, cs.act == DType::kBF16);
  ps.init(7, 0.3);
  const LayerParamIndex& p = ps.layer(0);
  MoeOptions o;
  o.capacity_factor = cs.capacity_factor;
  o.load_balance_weight = cs.lb_weight;
  o.z_loss_weight = cs.z_weight;

  // Reference: every rank's tokens through the single-process layer.
  std::vector<float> h_all, dout_all;
  for (int q = 0; q < world; ++q) {
    const std::vector<float> h = rank_h(q, n * d), dout = rank_dout(q, n * d);
    h_all.insert(h_all.end(), h.begin(), h.end());
    dout_all.insert(dout_all.end(), dout.begin(), dout.end());
  }
  const std::vector<unsigned char> h_all_act = as_act(h_all, cs.act);
  ps.zero_grads();
  MoeRun ref(c, o, world * kBatch, kSeq, cs.act);
  const std::vector<float> out_ref = ref.forward(ps, h_all_act.data());
  const std::vector<float> dh_ref = ref.backward(ps, h_all_act.data(), dout_all, 1.0f);
  const std::vector<float> grads_ref(ps.grads(), ps.grads() + ps.size());
  if (cs.capacity_factor > 0) {
    EXPECT_GT(ref.plan.dropped, 0) << "the capped case drops nothing";
  }

  // Expert parallel: this rank's tokens only.
  ps.zero_grads();
  MoeOptions oe = o;
  oe.ep = make_expert_parallel(&comm, static_cast<int>(kExperts));
  MoeRun ep(c, oe, kBatch, kSeq, cs.act);
  const std::vector<unsigned char> h = as_act(rank_h(rank, n * d), cs.act);
  const std::vector<float> out = ep.forward(ps, h.data());
  if (cs.rerun_forward)
    moe::forward(ps, p, ep.s, ep.o, h.data(), cs.act, ep.m, nullptr);
  else
    moe::recompute(host_backend(), ep.s, h.data(), cs.act, ep.m);  // minimal remat: a no-op
  // Each rank's aux losses are means over its own tokens: 1/world of their gradient is
  // what a trainer averaging over ranks applies.
  const std::vector<float> dh =
      ep.backward(ps, h.data(), rank_dout(rank, n * d), 1.0f / static_cast<float>(world));

  for (int64_t i = 0; i < n * c.n_experts_per_tok; ++i)
    EXPECT_EQ(ep.experts[static_cast<size_t>(i)],
              ref.experts[static_cast<size_t>(rank * n * c.n_experts_per_tok + i)])
        << "routing of pair " << i;
  const size_t rows = static_cast<size_t>(n * d), off = static_cast<size_t>(rank) * rows;
  expect_close(out.data(), out_ref.data() + off, rows, cs.rel, "out");
  expect_close(dh.data(), dh_ref.data() + off, rows, cs.rel, "dh");

  // Router gradient: the sum over ranks; aux losses: the mean over ranks.
  const ParamInfo& router = ps.infos()[static_cast<size_t>(p.router)];
  std::vector<float> drouter(ps.grads() + router.offset, ps.grads() + router.offset + router.numel);
  comm.all_reduce(drouter.data(), drouter.size(), dist::ReduceOp::kSum);
  expect_close(drouter.data(), grads_ref.data() + router.offset, drouter.size(), cs.rel, "router");
  float losses[3] = {ep.m.lb_loss, ep.m.z_loss, static_cast<float>(ep.plan.dropped)};
  comm.all_reduce(losses, 3, dist::ReduceOp::kSum);
  EXPECT_NEAR(losses[0] / float(world), ref.m.lb_loss, 1e-5 * std::fabs(ref.m.lb_loss) + 1e-7);
  EXPECT_NEAR(losses[1] / float(world), ref.m.z_loss, 1e-5 * std::fabs(ref.m.z_loss) + 1e-7);
  EXPECT_EQ(static_cast<int64_t>(losses[2]), ref.plan.dropped);

  // Experts: local ones match the reference, the others stay untouched (zero).
  for (int first : {p.gate, p.up, p.down})
    for (int x = 0; x < static_cast<int>(kExperts); ++x) {
      const ParamInfo& info = ps.infos()[static_cast<size_t>(first + x)];
      const float* got = ps.grads() + info.offset;
      const size_t numel = static_cast<size_t>(info.numel);
      if (x >= oe.ep.first && x < oe.ep.first + oe.ep.count) {
        expect_close(got, grads_ref.data() + info.offset, numel, cs.rel, info.name);
      } else {
        const bool untouched = std::all_of(got, got + numel, [](float v) { return v == 0.0f; });
        EXPECT_TRUE(untouched) << info.name << " is not local to rank " << rank;
      }
    }
}

TEST(MoeExpertParallel, DroplessMatchesSingleProcess) {
  run_case({"dropless f32", -1.0, DType::kF32, 0.01f, 0.001f, 1e-5, false});
}

TEST(MoeExpertParallel, CappedMatchesSingleProcess) {
  run_case({"capped f32", 1.0, DType::kF32, 0.01f, 0.0f, 1e-5, true});
}

TEST(MoeExpertParallel, Bf16MatchesSingleProcess) {
  run_case({"dropless bf16", -1.0, DType::kBF16, 0.0f, 0.0f, 3e-2, false});
}

// World of one: the exchange is a copy and the GEMMs are the non-EP ones, so the
// results are the same bits.
TEST(MoeExpertParallel, SingleRankEqualsLocalBitForBit) {
  std::unique_ptr<Communicator> single = dist::make_single_process_communicator();
  const DecoderConfig c = ep_config(kExperts);
  const int64_t n = kBatch * kSeq;
  ParamStore ps(c, false);
  ps.init(11, 0.3);
  MoeOptions o;
  const std::vector<float> h = rank_h(0, n * c.dim), dout = rank_dout(0, n * c.dim);
  ps.zero_grads();
  MoeRun local(c, o, kBatch, kSeq, DType::kF32);
  const std::vector<float> out_local = local.forward(ps, h.data());
  const std::vector<float> dh_local = local.backward(ps, h.data(), dout, 1.0f);
  const std::vector<float> grads_local(ps.grads(), ps.grads() + ps.size());
  ps.zero_grads();
  o.ep = make_expert_parallel(single.get(), static_cast<int>(kExperts));
  EXPECT_EQ(o.ep.first, 0);
  EXPECT_EQ(o.ep.count, kExperts);
  MoeRun ep(c, o, kBatch, kSeq, DType::kF32);
  const std::vector<float> out = ep.forward(ps, h.data());
  const std::vector<float> dh = ep.backward(ps, h.data(), dout, 1.0f);
  EXPECT_EQ(out, out_local);
  EXPECT_EQ(dh, dh_local);
  EXPECT_TRUE(std::equal(grads_local.begin(), grads_local.end(), ps.grads()));
}

TEST(MoeExpertParallel, RejectsUnevenSplitAndMissingState) {
  Communicator& comm = test_comm();
  const int world = comm.world_size();
  try {
    make_expert_parallel(&comm, world + 1);
    ADD_FAILURE() << "n_experts " << world + 1 << " over " << world << " ranks was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("expert_parallelism"), std::string::npos) << msg;
    EXPECT_NE(msg.find("n_experts"), std::string::npos) << msg;
  }

  // Both checks run before any collective, so every rank throws alike.
  const DecoderConfig c = ep_config(kExperts);
  ParamStore ps(c, false);
  ps.init(3, 0.3);
  const std::vector<float> h = rank_h(comm.rank(), kBatch * kSeq * c.dim);
  MoeOptions o;
  o.ep = make_expert_parallel(&comm, static_cast<int>(kExperts));
  MoeRun run(c, o, kBatch, kSeq, DType::kF32);
  run.m.ep_state = nullptr;
  EXPECT_THROW(run.forward(ps, h.data()), Error);
  run.m.ep_state = &run.ep;
  run.o.ep.first = (run.o.ep.first + run.o.ep.count) % static_cast<int>(kExperts);
  EXPECT_THROW(run.forward(ps, h.data()), Error);
}

}  // namespace
}  // namespace hyperion
