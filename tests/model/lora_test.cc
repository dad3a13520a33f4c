// LoRA adapters in the decoder (model/lora.h): a fresh adapter (B = 0) leaves the model's
// outputs unchanged; an adapter's forward equals the merged model's (W + s B A); the
// adapter's gradients on a frozen base agree with finite differences under every remat
// policy; bf16, int8-base (QLoRA) and device runs agree with the f32 host; bad target
// specs are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../kernels/simulated_device.h"
#include "base/error.h"
#include "kernels/fill.h"
#include "model/causal_lm.h"
#include "model/generator.h"
#include "model/lora.h"
#include "model/param_store.h"
#include "model_test_util.h"

namespace hyperion {
namespace {

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

DecoderConfig config_of(const std::string& arch) {
  DecoderConfig c = testing_util::tiny_test_config();
  if (arch == "gemma3") testing_util::use_gemma3_features(c, 4);
  if (arch == "qwen2") c.arch = family_info(DecoderFamily::kQwen2).defaults;
  return c;
}

LoraConfig lora_config(int64_t rank, std::vector<LoraModule> targets = {}) {
  LoraConfig l;
  l.rank = rank;
  l.alpha = 2.0 * static_cast<double>(rank);
  l.targets = targets.empty() ? parse_lora_targets("all-linear", "test") : targets;
  return l;
}

// Gives every B values (a trained adapter), keyed by `seed`.
void randomize_b(LoraAdapter& a, uint64_t seed) {
  ParamStore& s = a.store();
  for (size_t i = 1; i < s.infos().size(); i += 2)
    fill_normal(s.param(static_cast<int>(i)), seed + i, 0.0f, 0.3f);
  s.sync_bf16();
}

std::vector<float> logits_of(ParamStore& ps, const LoraAdapter* adapter, const std::vector<int32_t>& tok, int64_t b,
                             int64_t t, bool bf16 = false) {
  CausalLM m(ps, ModelOptions(b, t, bf16, RematPolicy::kNone));
  m.set_lora(adapter);
  std::vector<float> out(static_cast<size_t>(b * t * ps.config().vocab_size));
  m.forward_logits(tok.data(), out.data());
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

class LoraModel : public testing::TestWithParam<const char*> {};

TEST_P(LoraModel, FreshAdapterChangesNothingAndTrainedOneEqualsTheMergedModel) {
  const DecoderConfig c = config_of(GetParam());
  ParamStore base(c, false, false);  // frozen: no gradients
  base.init(3, 0.3);
  const int64_t b = 2, t = 7;
  const auto tok = random_tokens(b * t, c.vocab_size, 1);
  const std::vector<float> plain = logits_of(base, nullptr, tok, b, t);

  LoraAdapter adapter(base, lora_config(3), false, false);
  adapter.init(7);
  EXPECT_EQ(logits_of(base, &adapter, tok, b, t), plain);  // B = 0: exactly the base

  randomize_b(adapter, 11);
  const std::vector<float> adapted = logits_of(base, &adapter, tok, b, t);
  EXPECT_GT(max_abs_diff(adapted, plain), 1e-2);  // the adapter does something
  ParamStore merged(c, false, false);
  std::copy(base.params(), base.params() + base.size(), merged.params());
  merge_lora(adapter, merged);
  const std::vector<float> want = logits_of(merged, nullptr, tok, b, t);
  EXPECT_LT(max_abs_diff(adapted, want), 2e-4);

  // Generation (the contiguous KV cache) applies it too: the last position's logits.
  Generator gen(base, t);
  gen.set_lora(&adapter);
  const float* last = gen.feed(tok.data(), t);
  for (int64_t j = 0; j < c.vocab_size; ++j)
    ASSERT_NEAR(last[j], want[static_cast<size_t>((t - 1) * c.vocab_size + j)], 2e-4);
}

// The adapters' gradients on a frozen base (with `dropout`, under the mask of one key)
// against finite differences of the loss, equal under every remat policy.
void check_adapter_gradients(const char* arch, double dropout) {
  const DecoderConfig c = config_of(arch);
  ParamStore base(c, false, false);
  base.init(5, 0.3);
  LoraConfig lc = lora_config(2);
  lc.dropout = dropout;
  LoraAdapter adapter(base, lc, true, false);
  adapter.init(9);
  randomize_b(adapter, 4);  // B = 0 would make A's gradient zero
  const int64_t b = 2, t = 6;
  const auto in = random_tokens(b * t, c.vocab_size, 2);
  auto tg = random_tokens(b * t, c.vocab_size, 3);
  tg[4] = kIgnoreIndex;
  ParamStore& s = adapter.store();
  std::vector<float> first;
  for (RematPolicy r : {RematPolicy::kNone, RematPolicy::kMinimal, RematPolicy::kFull}) {
    CausalLM m(base, ModelOptions(b, t, false, r));
    m.set_lora(&adapter);
    m.set_lora_dropout_key(dropout > 0 ? 0x5eed : 0);
    s.zero_grads();
    m.forward_backward(in.data(), tg.data(), 1.0f);
    std::vector<float> g(s.grads(), s.grads() + s.size());
    if (first.empty()) {
      first = g;
      const int checked = testing_util::check_gradients_fd(
          s, in, [&] { return m.forward_loss(in.data(), tg.data()).loss; }, testing_util::FdOptions{});
      EXPECT_GE(checked, 4 * 2 * 7 * 2);
    } else {
      EXPECT_EQ(g, first) << remat_policy_name(r);
    }
  }
}

TEST_P(LoraModel, AdapterGradientsOnAFrozenBaseMatchFiniteDifferences) {
  check_adapter_gradients(GetParam(), 0.0);
}

// lora_dropout: with a key the adapters see D(x) (one mask per matrix, the same in the
// backward and in a rematerialised forward), so the gradients are those of the loss under
// that mask; without a key (evaluation) the adapter runs undropped; another key, another
// mask.
TEST_P(LoraModel, AdapterDropoutGradientsMatchFiniteDifferencesUnderItsMask) {
  check_adapter_gradients(GetParam(), 0.3);
  const DecoderConfig c = config_of(GetParam());
  ParamStore base(c, false, false);
  base.init(5, 0.3);
  LoraConfig lc = lora_config(2);
  lc.dropout = 0.3;
  LoraAdapter adapter(base, lc, false, false);
  adapter.init(9);
  randomize_b(adapter, 4);
  const int64_t b = 2, t = 6;
  const auto in = random_tokens(b * t, c.vocab_size, 2);
  const auto tg = random_tokens(b * t, c.vocab_size, 3);
  CausalLM m(base, ModelOptions(b, t, false, RematPolicy::kFull));
  m.set_lora(&adapter);
  const double undropped = m.forward_loss(in.data(), tg.data()).loss;
  m.set_lora_dropout_key(0x5eed);
  const double dropped = m.forward_loss(in.data(), tg.data()).loss;
  EXPECT_GT(std::fabs(dropped - undropped), 1e-4);
  EXPECT_EQ(m.forward_loss(in.data(), tg.data()).loss, dropped);  // one key, one mask
  m.set_lora_dropout_key(0x5eee);
  EXPECT_NE(m.forward_loss(in.data(), tg.data()).loss, dropped);
  m.set_lora_dropout_key(0);
  EXPECT_EQ(m.forward_loss(in.data(), tg.data()).loss, undropped);
}

INSTANTIATE_TEST_SUITE_P(Archs, LoraModel, testing::Values("llama", "gemma3", "qwen2"));

// A frozen bf16 base without the f32 masters of its matrices (ParamStore::
// drop_matrix_masters, what a LoRA run on the host holds): the same bf16 weights, losses
// and adapter gradients bit for bit as with them, through init and sync_bf16 after the
// drop; the dropped masters' f32 views are refused by name, the norms' stay.
TEST(LoraFrozenBase, DroppedMastersChangeNothingButTheMemory) {
  const DecoderConfig c = config_of("llama");
  ParamStore kept(c, true, false), dropped(c, true, false);
  const int64_t released = dropped.drop_matrix_masters(true);  // before init, as the trainer does
  kept.init(5, 0.3);
  dropped.init(5, 0.3);
  int64_t want = 0;
  for (int i : ParamStore::droppable_masters(c)) want += kept.infos()[static_cast<size_t>(i)].numel;
  EXPECT_EQ(released, want);
  // Dropping a written store converts first: the same bf16 as keeping the masters.
  ParamStore later(c, true, false);
  later.init(5, 0.3);
  EXPECT_EQ(later.drop_matrix_masters(), want);
  EXPECT_EQ(std::memcmp(kept.params_bf16(), later.params_bf16(), static_cast<size_t>(kept.size()) * 2), 0);
  EXPECT_GT(want, c.non_embedding_params() / 2);
  auto same_bf16 = [&] {
    return std::memcmp(kept.params_bf16(), dropped.params_bf16(), static_cast<size_t>(kept.size()) * 2) == 0;
  };
  EXPECT_TRUE(same_bf16());
  dropped.sync_bf16();  // the dropped tensors' bf16 is their only copy: kept as it is
  EXPECT_TRUE(same_bf16());
  const LayerParamIndex& l0 = dropped.layer(0);
  EXPECT_TRUE(dropped.master_dropped(l0.q));
  EXPECT_FALSE(dropped.master_dropped(l0.input_norm));
  try {
    dropped.param(l0.q);
    ADD_FAILURE() << "a dropped master was handed out";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.self_attn.q_proj"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::memcmp(dropped.param(l0.input_norm).data, kept.param(l0.input_norm).data,
                        static_cast<size_t>(c.dim) * 4),
            0);

  const int64_t b = 2, t = 6;
  const auto in = random_tokens(b * t, c.vocab_size, 2);
  const auto tg = random_tokens(b * t, c.vocab_size, 3);
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  for (ParamStore* base : {&kept, &dropped}) {
    LoraAdapter adapter(*base, lora_config(2), true, true);
    adapter.init(9);
    randomize_b(adapter, 4);
    CausalLM m(*base, ModelOptions(b, t, true, RematPolicy::kFull));
    m.set_lora(&adapter);
    adapter.store().zero_grads();
    losses.push_back(m.forward_backward(in.data(), tg.data(), 1.0f).loss);
    grads.emplace_back(adapter.store().grads(), adapter.store().grads() + adapter.store().size());
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(grads[0], grads[1]);
  // A store that trains, or has no bf16 copy, keeps its masters.
  ParamStore trains(c, true, true), f32(c, false, false);
  EXPECT_THROW(trains.drop_matrix_masters(), Error);
  EXPECT_THROW(f32.drop_matrix_masters(), Error);
}

// The adapters' gradients on a bf16 base, and on an int8 base through the quantised
// matmuls (QLoRA's idea), stay close to the f32 ones; the base gets none.
TEST(LoraModelPrecision, Bf16AndInt8BasesGiveTheF32GradientsApproximately) {
  const DecoderConfig c = testing_util::tiny_test_config();
  const int64_t b = 2, t = 8;
  const auto in = random_tokens(b * t, c.vocab_size, 2);
  const auto tg = random_tokens(b * t, c.vocab_size, 3);
  auto grads = [&](bool bf16, QuantMode q) {
    ParamStore base(c, bf16, false);
    base.init(5, 0.3);
    LoraAdapter adapter(base, lora_config(4), true, bf16);
    adapter.init(9);
    randomize_b(adapter, 4);
    ModelOptions mo(b, t, bf16, RematPolicy::kMinimal);
    mo.quant.mode = q;
    CausalLM m(base, mo);
    m.set_lora(&adapter);
    adapter.store().zero_grads();
    m.forward_backward(in.data(), tg.data(), 1.0f);
    const ParamStore& s = adapter.store();
    return std::vector<float>(s.grads(), s.grads() + s.size());
  };
  const std::vector<float> f32 = grads(false, QuantMode::kOff);
  auto rel_err = [&](const std::vector<float>& g) {
    double num = 0, den = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      num += (g[i] - f32[i]) * (g[i] - f32[i]);
      den += f32[i] * f32[i];
    }
    return std::sqrt(num / den);
  };
  EXPECT_LT(rel_err(grads(true, QuantMode::kOff)), 0.08);
  EXPECT_LT(rel_err(grads(true, QuantMode::kInt8)), 0.15);
}

// On the device (the simulated one where no GPU is usable) the adapter's step equals the
// host's.
TEST(LoraModelDevice, StepEqualsTheHosts) {
  const DecoderConfig c = testing_util::tiny_test_config();
  KernelBackend* dev = testing_util::simulated_device();
  if (dev == nullptr) dev = &backend_for(Device::kCuda);
  const int64_t b = 2, t = 6;
  const auto in = random_tokens(b * t, c.vocab_size, 2);
  const auto tg = random_tokens(b * t, c.vocab_size, 3);
  auto run = [&](Allocator& alloc) {
    ParamStore base(c, false, false, alloc);
    base.init(5, 0.3);
    LoraAdapter adapter(base, lora_config(2), true, false);
    adapter.init(9);
    CausalLM m(base, ModelOptions(b, t, false));
    m.set_lora(&adapter);
    const double loss = m.forward_backward(in.data(), tg.data(), 1.0f).loss;
    std::vector<float> g(static_cast<size_t>(adapter.store().size()));
    backend_for(alloc.device()).download(adapter.store().grads(), g.data(), g.size() * 4);
    return std::make_pair(loss, g);
  };
  const auto host = run(host_allocator());
  const auto device = run(dev->allocator());
  const bool exact = std::string(dev->name()) == "simulated";
  EXPECT_NEAR(device.first, host.first, exact ? 0.0 : 1e-4);
  EXPECT_LT(max_abs_diff(device.second, host.second), exact ? 1e-30 : 1e-4);
}

TEST(LoraLayout, PeftNamesShapesAndBuckets) {
  const DecoderConfig c = testing_util::tiny_test_config();
  ParamStore base(c, false, false);
  LoraAdapter a(base, lora_config(4, {LoraModule::kQ, LoraModule::kV, LoraModule::kDown}), true, false);
  const auto& infos = a.store().infos();
  ASSERT_EQ(infos.size(), 2u * 3 * 2);
  EXPECT_EQ(infos[0].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(infos[0].shape, (Shape{4, c.dim}));
  EXPECT_EQ(infos[1].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(infos[1].shape, (Shape{c.q_dim(), 4}));
  EXPECT_EQ(infos[5].name, "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight");
  EXPECT_EQ(infos[5].shape, (Shape{c.dim, 4}));
  EXPECT_EQ(a.a_of(base.layer(1).v), 8);
  EXPECT_EQ(a.a_of(base.layer(1).k), -1);
  EXPECT_EQ(a.a_of(base.embed()), -1);
  EXPECT_FLOAT_EQ(a.scale(), 2.0f);
  // Buckets: 0 and the last are empty, 1 + l holds layer l's adapters.
  ASSERT_EQ(a.store().num_buckets(), c.n_layers + 2);
  EXPECT_EQ(a.store().bucket_range(0).second, 0);
  EXPECT_EQ(a.store().bucket_range(1).first, 0);
  EXPECT_EQ(a.store().bucket_range(1).second, infos[6].offset);
  EXPECT_EQ(a.store().bucket_range(2).second, a.store().size());
  EXPECT_EQ(a.store().bucket_range(3).first, a.store().size());
}

TEST(LoraLayout, BadSpecsAreRefusedByName) {
  const DecoderConfig c = testing_util::tiny_test_config();
  ParamStore base(c, false, false);
  auto expect_refused = [&](auto&& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_refused([&] { parse_lora_targets("q_proj,lm_head", "config key lora_target_modules"); }, "'lm_head'");
  expect_refused([&] { LoraAdapter a(base, lora_config(0), true, false); }, "lora_rank");
  expect_refused([&] { LoraAdapter a(base, lora_config(64), true, false); }, "lora_rank");
  LoraConfig bad = lora_config(2);
  bad.dropout = 1.0;
  expect_refused([&] { LoraAdapter a(base, bad, true, false); }, "lora_dropout");
  ParamStore moe(testing_util::tiny_test_config(4), false, false);
  expect_refused([&] { LoraAdapter a(moe, lora_config(2), true, false); }, "gate_proj");
  LoraAdapter attention_only(moe, lora_config(2, {LoraModule::kQ, LoraModule::kO}), true, false);
  EXPECT_EQ(attention_only.store().infos().size(), 2u * 2 * 2);
}

}  // namespace
}  // namespace hyperion
