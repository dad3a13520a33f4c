// `hyperion bench moe`: training-step throughput of mixture-of-experts models.
//
//   layer    the MoE MLP alone (forward + backward of one layer: router, dispatch, grouped
//            GEMMs, combine) dropless and capped, against a dense SwiGLU MLP with the same
//            active FLOPs (ffn = k x expert ffn) on the same tokens
//   paths    whole training steps of a preset: dropless vs capped (cf 1.0, 1.25, 2.0) and
//            the dense model with the same active FLOPs
//   scaling  the weak-scaling family moe-e4 .. moe-e32 (experts grow, per-expert size and
//            FLOPs per token fixed): step time per token, with the optimizer apart (its
//            cost grows with the parameters; expert parallelism shards it per rank)
//
// Tokens are uniform random ids (fixed seed) and the router is freshly initialised, so
// routing is near-balanced; the dropped fraction and load CV are reported beside.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "base/timer.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "kernels/peak.h"
#include "model/causal_lm.h"
#include "model/decoder.h"
#include "model/linear.h"
#include "model/moe_block.h"
#include "tensor/convert.h"
#include "train/optimizer.h"
#include "train/train_config.h"

namespace hyperion::cli {

namespace {

using json = nlohmann::ordered_json;

struct StepTiming {
  double fwd_bwd_s = 0, opt_s = 0;  // per step
  MoeStats moe;
};

// Mean time of `steps` training steps after `warmup` (fresh model from the config).
StepTiming time_steps(const TrainConfig& t, int64_t warmup, int64_t steps) {
  ParamStore params(t.model, t.bf16);
  params.init(1);
  CausalLM model(params, {t.per_device_batch_size, t.max_target_length, t.bf16, t.remat, t.moe});
  OptimizerOptions oo;
  AdamW opt(params, oo);
  const int64_t n = model.tokens_per_batch();
  std::vector<int32_t> in(static_cast<size_t>(n)), tg(static_cast<size_t>(n));
  std::mt19937 rng(7);
  StepTiming r;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    for (int64_t i = 0; i < n; ++i) {
      in[static_cast<size_t>(i)] = static_cast<int32_t>(rng() % t.model.vocab_size);
      tg[static_cast<size_t>(i)] = static_cast<int32_t>(rng() % t.model.vocab_size);
    }
    params.zero_grads();
    Timer fb;
    model.forward_backward(in.data(), tg.data(), 1.0f);
    const double fb_s = fb.seconds();
    Timer ot;
    opt.step(1e-4);
    const double opt_s = ot.seconds();
    if (s < warmup) continue;
    r.fwd_bwd_s += fb_s / double(steps);
    r.opt_s += opt_s / double(steps);
    const MoeStats& m = model.moe_stats();
    r.moe.dropped_fraction += m.dropped_fraction / double(steps);
    r.moe.load_cv += m.load_cv / double(steps);
    r.moe.load_max = std::max(r.moe.load_max, m.load_max);
  }
  return r;
}

TrainConfig preset(const std::string& name, std::vector<std::string> overrides) {
  return parse_train_config(load_train_config(name, overrides), name);
}

// The dense model with the same active FLOPs: every MoE MLP becomes a SwiGLU of ffn k x fe.
TrainConfig dense_peer(const std::string& name) {
  TrainConfig t = preset(name, {});
  return preset(
      name, {"num_experts=0",
             fmt::format("base_mlp_dim={}", t.model.n_experts_per_tok * t.model.expert_ffn_dim())});
}

// ---- layer: the MoE MLP block alone vs a dense MLP of equal active FLOPs (bf16). ----
struct LayerTiming {
  double fwd_s = 0, bwd_s = 0;
  MoeStats moe;
};

std::vector<bf16> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<bf16> v(n);
  for (auto& x : v) x = f32_to_bf16(nd(rng));
  return v;
}

LayerTiming time_moe_layer(const TrainConfig& t, double cf, int64_t warmup, int64_t reps) {
  DecoderConfig c = t.model;
  c.n_layers = 1;
  c.first_dense_layers = 0;
  c.moe_layer_step = 1;
  ParamStore ps(c, true);
  ps.init(3);
  MoeOptions o = t.moe;
  o.capacity_factor = cf;
  const MoeShape s = moe_shape(c, o, t.per_device_batch_size, t.max_target_length);
  auto sz = [](int64_t x) { return static_cast<size_t>(x); };
  std::vector<float> logits(sz(s.n * s.e)), probs(sz(s.n * s.e)), weights(sz(s.n * s.k));
  std::vector<int32_t> experts(sz(s.n * s.k));
  std::vector<bf16> xs(sz(s.rows * s.d)), g(sz(s.rows * s.f)), u(sz(s.rows * s.f)),
      a(sz(s.rows * s.f)), y(sz(s.rows * s.d)), dy(sz(s.rows * s.d)), da(sz(s.rows * s.f)),
      dlc(sz(s.n * s.e));
  std::vector<float> dxs(sz(s.rows * s.d)), dl(sz(s.n * s.e)), dp(sz(s.n * s.e)), dw(sz(s.n * s.k)),
      out(sz(s.n * s.d)), dh(sz(s.n * s.d));
  MoeDispatch plan;
  MoeActs m{logits.data(), probs.data(), experts.data(), weights.data(), &plan,
            xs.data(),     g.data(),     u.data(),       a.data(),       y.data()};
  MoeGradScratch sc{dy.data(), da.data(), dxs.data(), dl.data(), dp.data(), dlc.data(), dw.data()};
  const std::vector<bf16> h = random_bf16(sz(s.n * s.d), 1);
  std::vector<float> dout(sz(s.n * s.d));
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = bf16_to_f32(h[(i * 7) % h.size()]) * 1e-3f;
  LayerTiming r;
  for (int64_t i = 0; i < warmup + reps; ++i) {
    Timer f;
    moe::forward(ps, ps.layer(0), s, o, h.data(), DType::kBF16, m, out.data());
    const double fs = f.seconds();
    Timer b;
    moe::backward(ps, ps.layer(0), s, o, h.data(), DType::kBF16, m, dout.data(), 1.0f, sc,
                  dh.data());
    const double bs = b.seconds();
    if (i < warmup) continue;
    r.fwd_s += fs / double(reps);
    r.bwd_s += bs / double(reps);
    r.moe.dropped_fraction += double(plan.dropped) / double(s.n * s.k) / double(reps);
  }
  return r;
}

// The decoder's own dense MLP layer (Decoder::mlp and mlp_backward, the code training
// runs), ffn = k x expert ffn, on one bf16 layer of the same tokens.
LayerTiming time_dense_mlp(const TrainConfig& t, int64_t warmup, int64_t reps) {
  const int64_t n = t.per_device_batch_size * t.max_target_length, d = t.model.dim;
  const int64_t f = t.model.n_experts_per_tok * t.model.expert_ffn_dim();
  DecoderConfig c = t.model;
  c.n_layers = 1;
  c.n_experts = 0;
  c.ffn_dim = f;
  ParamStore ps(c, true);
  ps.init(3);
  LinearWeights weights(ps, WeightFormat::kBF16);
  Decoder dec(ps, weights, t.max_target_length);
  auto sz = [](int64_t x) { return static_cast<size_t>(x); };
  std::vector<bf16> h = random_bf16(sz(n * d), 1), g(sz(n * f)), u(sz(n * f)), a(sz(n * f)),
                    da(sz(n * f)), dres_c(sz(n * d));
  std::vector<float> out(sz(n * d)), x2(sz(n * d)), dres(sz(n * d)), dh(sz(n * d));
  for (size_t i = 0; i < dres.size(); ++i) dres[i] = bf16_to_f32(h[(i * 7) % h.size()]) * 1e-3f;
  DecoderActs s;
  s.x2 = x2.data();
  s.h2 = h.data();
  s.g = g.data();
  s.u = u.data();
  s.a = a.data();
  DecoderGrads gr;
  gr.dres = dres.data();
  gr.dres_c = dres_c.data();
  gr.dh = dh.data();
  gr.da = da.data();
  LayerTiming r;
  for (int64_t i = 0; i < warmup + reps; ++i) {
    Timer fw;
    dec.mlp(0, n, s, MoeShape{}, MoeOptions{}, out.data());
    const double fs = fw.seconds();
    Timer bw;
    dec.mlp_backward(0, n, s, gr, MoeShape{}, MoeOptions{}, 1.0f);
    const double bs = bw.seconds();
    if (i < warmup) continue;
    r.fwd_s += fs / double(reps);
    r.bwd_s += bs / double(reps);
  }
  return r;
}

std::string cf_name(double cf) {
  return cf > 0 ? fmt::format("capped cf {:g}", cf) : "dropless";
}

}  // namespace

const CommandSpec kBenchMoeSpec = {
    "bench moe",
    "",
    "mixture-of-experts layer and training-step throughput (capped vs dropless paths)",
    {{"suite", "NAME", "layer, paths, scaling or all (default)"},
     {"config", "PRESET", "MoE preset to measure (default moe-e8)"},
     {"steps", "N", "timed steps (default 5)"},
     {"warmup", "N", "untimed steps first (default 2)"},
     {"peak-tflops", "T", "bf16 peak for the ratios (default: measured now)"},
     {"json", "", "print the figures as one JSON object"}},
    "Guide: docs/MOE.md.",
    "bench moe --suite layer --json"};

int cmd_bench_moe(const Args& args) {
  const Flags f(kBenchMoeSpec, args);
  HYP_USAGE_CHECK(f.positional().empty(), "bench moe: unexpected argument '{}'", f.positional()[0]);
  const std::string suite = f.get("suite", "all");
  HYP_USAGE_CHECK(suite == "all" || suite == "layer" || suite == "paths" || suite == "scaling",
                  "bench moe: --suite must be layer, paths, scaling or all; got '{}'", suite);
  const std::string config = f.get("config", "moe-e8");
  const int64_t steps = f.integer("steps", 5), warmup = f.integer("warmup", 2);
  HYP_USAGE_CHECK(steps >= 1 && warmup >= 0, "bench moe: --steps must be >= 1 and --warmup >= 0");
  const bool as_json = f.has("json");
  double peak_gflops = f.number("peak-tflops", 0) * 1e3;
  if (peak_gflops <= 0) peak_gflops = measure_peak(0.2).bf16_gflops;

  json out;
  out["config"] = config;
  out["threads"] = num_threads();
  out["peak_bf16_gflops"] = peak_gflops;
  out["steps"] = steps;
  const std::vector<double> cfs = {-1.0, 1.0, 1.25, 2.0};

  if (suite == "all" || suite == "layer") {
    const TrainConfig t = preset(config, {});
    HYP_CHECK(t.model.is_moe(), "bench moe: config '{}' has no experts (num_experts = 0)", config);
    const int64_t n = t.per_device_batch_size * t.max_target_length;
    const double flops = 3.0 * 2.0 * 3.0 * double(n) * double(t.model.dim) *
                         double(t.model.expert_ffn_dim() * t.model.n_experts_per_tok);
    const LayerTiming dense = time_dense_mlp(t, warmup, steps * 4);
    json rows = json::array();
    auto add = [&](const std::string& name, const LayerTiming& l) {
      const double s = l.fwd_s + l.bwd_s;
      rows.push_back({{"name", name},
                      {"fwd_ms", l.fwd_s * 1e3},
                      {"bwd_ms", l.bwd_s * 1e3},
                      {"tokens_per_s", double(n) / s},
                      {"active_tflops", flops / s / 1e12},
                      {"vs_dense", (dense.fwd_s + dense.bwd_s) / s},
                      {"dropped_fraction", l.moe.dropped_fraction}});
    };
    add("dense mlp (same active FLOPs)", dense);
    for (double cf : cfs) add(cf_name(cf), time_moe_layer(t, cf, warmup, steps * 4));
    out["layer"] = rows;
    if (!as_json) {
      std::printf("MoE MLP of %s alone (%lld tokens, %lld experts, top-%lld, ffn %lld), bf16:\n",
                  config.c_str(), static_cast<long long>(n),
                  static_cast<long long>(t.model.n_experts),
                  static_cast<long long>(t.model.n_experts_per_tok),
                  static_cast<long long>(t.model.expert_ffn_dim()));
      for (const json& r : rows)
        std::printf(
            "  %-30s fwd %7.2f ms  bwd %7.2f ms  %7.3f TFLOP/s  %.2fx dense  dropped %.1f%%\n",
            r["name"].get<std::string>().c_str(), r["fwd_ms"].get<double>(),
            r["bwd_ms"].get<double>(), r["active_tflops"].get<double>(),
            r["vs_dense"].get<double>(), 100 * r["dropped_fraction"].get<double>());
    }
  }

  auto step_row = [&](const std::string& name, const TrainConfig& t) {
    const StepTiming s = time_steps(t, warmup, steps);
    const double tokens = double(t.per_device_batch_size * t.max_target_length);
    const double fpt = t.model.train_flops_per_token(t.max_target_length);
    const double total = s.fwd_bwd_s + s.opt_s;
    return json{{"name", name},
                {"params", t.model.total_params()},
                {"step_s", total},
                {"fwd_bwd_s", s.fwd_bwd_s},
                {"optimizer_s", s.opt_s},
                {"tokens_per_s", tokens / total},
                {"fwd_bwd_us_per_token", s.fwd_bwd_s / tokens * 1e6},
                {"step_us_per_token", total / tokens * 1e6},
                {"mfu", fpt * tokens / total / (peak_gflops * 1e9)},
                {"fwd_bwd_mfu", fpt * tokens / s.fwd_bwd_s / (peak_gflops * 1e9)},
                {"dropped_fraction", s.moe.dropped_fraction},
                {"expert_load_cv", s.moe.load_cv}};
  };
  auto print_steps = [&](const json& rows) {
    for (const json& r : rows)
      std::printf(
          "  %-30s %6.0f tok/s  step %6.1f ms (fwd+bwd %6.1f, adamw %5.1f)  %5.2f us/token "
          "fwd+bwd  MFU %4.1f%%  dropped %4.1f%%  load cv %.2f\n",
          r["name"].get<std::string>().c_str(), r["tokens_per_s"].get<double>(),
          r["step_s"].get<double>() * 1e3, r["fwd_bwd_s"].get<double>() * 1e3,
          r["optimizer_s"].get<double>() * 1e3, r["fwd_bwd_us_per_token"].get<double>(),
          100 * r["mfu"].get<double>(), 100 * r["dropped_fraction"].get<double>(),
          r["expert_load_cv"].get<double>());
  };

  if (suite == "all" || suite == "paths") {
    json rows = json::array();
    rows.push_back(step_row("dense (same active FLOPs)", dense_peer(config)));
    for (double cf : cfs)
      rows.push_back(
          step_row(cf_name(cf), preset(config, {fmt::format("capacity_factor={}", cf)})));
    out["paths"] = rows;
    if (!as_json) {
      std::printf("training steps of %s:\n", config.c_str());
      print_steps(rows);
    }
  }

  if (suite == "all" || suite == "scaling") {
    json rows = json::array();
    for (const char* name : {"moe-e4", "moe-e8", "moe-e16", "moe-e32"})
      rows.push_back(step_row(name, preset(name, {})));
    const double base = rows[0]["fwd_bwd_us_per_token"].get<double>();
    const double base_step = rows[0]["step_us_per_token"].get<double>();
    for (json& r : rows) {
      r["fwd_bwd_vs_e4"] = r["fwd_bwd_us_per_token"].get<double>() / base;
      r["step_vs_e4"] = r["step_us_per_token"].get<double>() / base_step;
    }
    out["scaling"] = rows;
    if (!as_json) {
      std::printf("weak scaling (experts grow, FLOPs per token fixed), dropless:\n");
      print_steps(rows);
      for (const json& r : rows)
        std::printf("  %-8s fwd+bwd per token %.3fx of moe-e4, whole step %.3fx\n",
                    r["name"].get<std::string>().c_str(), r["fwd_bwd_vs_e4"].get<double>(),
                    r["step_vs_e4"].get<double>());
    }
  }
  if (as_json) print_json(out, 2);
  return 0;
}

}  // namespace hyperion::cli
