// The serving engine with its weights, KV pool and step buffers on a device (the
// simulated device of tests/kernels/simulated_device.h, or the CUDA backend where a GPU is
// usable) against the same engine on the host: the same scheduler, the same requests,
// the same tokens. f32 token for token (greedy and seeded sampling, chunked prefill,
// more requests than slots, prefix-cache hits, cancellation, admission waiting for a
// full pool, MoE); bf16 and int8 KV on the simulated device bit for bit, on a GPU by
// greedy agreement (its kernels sum in other orders).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>

#include "../kernels/simulated_device.h"
#include "../model/model_test_util.h"
#include "serve/engine.h"
#include "serve_test_util.h"

namespace hyperion::serve {
namespace {

using testing_util::f32_engine_config;
using testing_util::greedy_request;
using testing_util::random_prompt;

KernelBackend& device() {
  KernelBackend* dev = testing_util::simulated_device();
  return dev != nullptr ? *dev : backend_for(Device::kCuda);
}

bool exact() {
  return std::string(device().name()) == "simulated";
}

// The host store's weights in a store on the device (its bf16 copy refreshed there).
std::unique_ptr<ParamStore> on_device(const ParamStore& host) {
  auto d = std::make_unique<ParamStore>(host.config(), host.has_bf16(), /*gradients=*/false,
                                        device().allocator());
  std::memcpy(d->host_params(), host.params(), static_cast<size_t>(host.size()) * sizeof(float));
  d->params_to_device();
  return d;
}

EngineConfig device_config(EngineConfig c) {
  c.hardware = Device::kCuda;
  return c;
}

// Every event of a run, in order: (request index, token, finish, cached tokens).
struct Event {
  size_t request;
  int32_t token;
  FinishReason finish;
  int64_t cached;
  bool operator==(const Event&) const = default;
};

// Admits `reqs` (all at once, or at the steps `arrive` gives) and cancels request i at
// step cancel_at[i] (-1: never); returns the events in order.
std::vector<Event> run(Engine& engine, const std::vector<GenerationRequest>& reqs,
                       const std::vector<int>& arrive = {}, const std::vector<int>& cancel_at = {}) {
  std::vector<Event> events;
  std::vector<int64_t> ids(reqs.size(), -1);
  auto add = [&](size_t i) {
    ids[i] = engine.add(reqs[i], [&events, i](const TokenEvent& ev) {
      events.push_back(Event{i, ev.token, ev.finish, ev.cached_tokens});
    });
  };
  for (int step = 0;; ++step) {
    bool pending = false;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const int at = arrive.empty() ? 0 : arrive[i];
      if (ids[i] < 0 && at == step) add(i);
      pending |= ids[i] < 0;
      if (!cancel_at.empty() && cancel_at[i] == step && ids[i] >= 0) engine.cancel(ids[i]);
    }
    if (!pending && !engine.has_work()) break;
    engine.step();
  }
  return events;
}

void expect_pool_empty(const Engine& e) {
  const EngineStats st = e.stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.pages_used, 0);
  EXPECT_EQ(st.pages_free + st.pages_cached, st.pages_total);
}

TEST(DeviceEngine, RefusesWeightsOnAnotherDevice) {
  auto host = testing_util::small_serving_params(testing_util::small_serving_config(), false, 7);
  EXPECT_THROW(Engine(*host, nullptr, device_config(f32_engine_config())), Error);
  auto dev = on_device(*host);
  EXPECT_THROW(Engine(*dev, nullptr, f32_engine_config()), Error);
}

// The small serving model as a dense Llama, a MoE, Gemma 2 (post-norms, capped scores
// and logits, a window on every other layer) and Mistral (a window on every layer, so
// the engine releases the pages behind it and the device reads past released entries).
DecoderConfig device_engine_config(const std::string& name) {
  DecoderConfig c = testing_util::small_serving_config(97, name == "moe");
  if (name == "gemma2") {
    testing_util::use_gemma2_features(c, 6);
  } else if (name == "mistral") {
    c.arch.sliding_window = 6;
    c.arch.sliding_window_pattern = 0;
  }
  return c;
}

// Greedy and seeded requests, more than the slots, prompts over several pages and
// prefill chunks, arriving while others decode: the device engine's events are the
// host's, token for token.
TEST(DeviceEngine, ManyRequestsEqualTheHostF32) {
  for (const std::string name : {"dense", "moe", "gemma2", "mistral"}) {
    SCOPED_TRACE(name);
    auto host = testing_util::small_serving_params(device_engine_config(name), false, 7);
    auto dev = on_device(*host);
    EngineConfig ec = f32_engine_config();
    ec.prefix_caching = false;
    std::vector<GenerationRequest> reqs;
    std::vector<int> arrive;
    for (int i = 0; i < 9; ++i) {
      GenerationRequest r = greedy_request(random_prompt(3 + 5 * i, 100 + i), 8 + 3 * i);
      if (i % 3 == 1) r.sampling = SamplingParams{0.9f, 20, 0.95f, static_cast<uint64_t>(i)};
      reqs.push_back(r);
      arrive.push_back(2 * i);
    }
    Engine host_engine(*host, nullptr, ec), dev_engine(*dev, nullptr, device_config(ec));
    const auto want = run(host_engine, reqs, arrive);
    const auto got = run(dev_engine, reqs, arrive);
    EXPECT_EQ(got, want);
    expect_pool_empty(dev_engine);
  }
}

// Prefix-cache hits on the device: the second request reuses the first's pages and still
// gives the host's tokens.
TEST(DeviceEngine, PrefixCacheHitsEqualTheHost) {
  auto host = testing_util::small_serving_params(testing_util::small_serving_config(), false, 7);
  auto dev = on_device(*host);
  Engine host_engine(*host, nullptr, f32_engine_config());
  Engine dev_engine(*dev, nullptr, device_config(f32_engine_config()));
  const auto shared = random_prompt(21, 5);  // 5 full pages of 4
  auto a = shared, b = shared;
  a.push_back(10);
  b.push_back(11);
  for (const auto& prompt : {a, b, a}) {
    const auto want = run(host_engine, {greedy_request(prompt, 6)});
    const auto got = run(dev_engine, {greedy_request(prompt, 6)});
    EXPECT_EQ(got, want);
  }
  EXPECT_GT(dev_engine.stats().prefix_hits, 0);
  EXPECT_EQ(dev_engine.stats().prefix_hits, host_engine.stats().prefix_hits);
  expect_pool_empty(dev_engine);
}

// A pool smaller than the slots' contexts (admission waits for pages), cancellations in
// flight, shared prefixes: the same events, and every page back.
TEST(DeviceEngine, CancellationAndAFullPoolEqualTheHost) {
  auto host = testing_util::small_serving_params(testing_util::small_serving_config(), false, 7);
  auto dev = on_device(*host);
  EngineConfig ec = f32_engine_config();
  ec.prefill_chunk = 16;
  ec.max_concurrent_decodes = 5;
  ec.kv_pages = 60;  // fewer than 5 full contexts of 32 pages
  std::mt19937 rng(3);
  std::vector<GenerationRequest> reqs;
  std::vector<int> arrive, cancel_at;
  for (int i = 0; i < 24; ++i) {
    GenerationRequest r = greedy_request(random_prompt(1 + rng() % 40, rng()), 1 + rng() % 30);
    if (rng() % 3 == 0) r.prompt = random_prompt(24, 42);
    if (rng() % 2 == 0) r.sampling = SamplingParams{0.7f, 0, 1.0f, rng()};
    reqs.push_back(r);
    arrive.push_back(static_cast<int>(i * 2 + rng() % 3));
    cancel_at.push_back(rng() % 4 == 0 ? arrive.back() + static_cast<int>(rng() % 12) : -1);
  }
  Engine host_engine(*host, nullptr, ec), dev_engine(*dev, nullptr, device_config(ec));
  const auto want = run(host_engine, reqs, arrive, cancel_at);
  const auto got = run(dev_engine, reqs, arrive, cancel_at);
  EXPECT_EQ(got, want);
  int aborted = 0;
  for (const Event& e : got) aborted += e.finish == FinishReason::kAbort;
  EXPECT_GT(aborted, 0);
  expect_pool_empty(dev_engine);
}

// Fraction of positions where two runs chose the same token, up to each request's first
// disagreement (after it the contexts differ).
double agreement(const std::vector<Event>& a, const std::vector<Event>& b, size_t requests) {
  int64_t same = 0, total = 0;
  for (size_t r = 0; r < requests; ++r) {
    std::vector<int32_t> ta, tb;
    for (const Event& e : a)
      if (e.request == r && e.token >= 0) ta.push_back(e.token);
    for (const Event& e : b)
      if (e.request == r && e.token >= 0) tb.push_back(e.token);
    for (size_t j = 0; j < ta.size() && j < tb.size(); ++j) {
      ++total;
      if (ta[j] != tb[j]) break;
      ++same;
    }
  }
  return total > 0 ? double(same) / double(total) : 0.0;
}

// The serving formats: bf16 weights with bf16, int8 and f32 KV pages, warm-up on every
// bucket first (as a server starts). Bit for bit on the simulated device; on a GPU
// greedy choices agree at nearly every position.
TEST(DeviceEngine, Bf16AndInt8KvEqualTheHost) {
  auto host = testing_util::small_serving_params(testing_util::small_serving_config(), true, 7);
  auto dev = on_device(*host);
  for (DType kv : {DType::kBF16, DType::kI8, DType::kF32}) {
    SCOPED_TRACE(dtype_name(kv));
    EngineConfig ec = f32_engine_config();
    ec.weights = WeightFormat::kBF16;
    ec.kv_dtype = kv;
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 6; ++i)
      reqs.push_back(greedy_request(random_prompt(2 + 7 * i, 300 + i), 16));
    Engine host_engine(*host, nullptr, ec), dev_engine(*dev, nullptr, device_config(ec));
    host_engine.warmup();
    dev_engine.warmup();
    const auto want = run(host_engine, reqs);
    const auto got = run(dev_engine, reqs);
    if (exact())
      EXPECT_EQ(got, want);
    else
      EXPECT_GE(agreement(got, want, reqs.size()), 0.9);
    expect_pool_empty(dev_engine);
  }
}

// A model at real head dims (64, four query heads per kv head) with contexts long enough
// for several splits of the GPU's decode attention, decode steps of 1 to 9 rows arriving
// over time: with recorded steps (on a GPU, a CUDA graph per padded row count, replayed
// from that count's third step) and without, the device engine gives the host's tokens.
// On the simulated device (which cannot record) both runs are the plain path.
TEST(DeviceEngine, RecordedDecodeStepsEqualTheHost) {
  DecoderConfig c = testing_util::small_serving_config();
  c.dim = 256;
  c.n_heads = 4;
  c.n_kv_heads = 1;
  c.head_dim = 64;
  c.ffn_dim = 128;
  c.max_seq_len = 512;
  auto host = testing_util::small_serving_params(c, false, 11);
  auto dev = on_device(*host);
  EngineConfig ec = f32_engine_config();
  ec.kv_page_tokens = 16;
  ec.prefill_chunk = 64;
  ec.max_concurrent_decodes = 9;
  ec.max_seq_len = 512;
  ec.prefix_caching = false;
  std::vector<GenerationRequest> reqs;
  std::vector<int> arrive;
  for (int i = 0; i < 12; ++i) {
    reqs.push_back(greedy_request(random_prompt(20 + 27 * i, 500 + i), 24));
    arrive.push_back(3 * i);
  }
  Engine host_engine(*host, nullptr, ec);
  const auto want = run(host_engine, reqs, arrive);
  for (bool graphs : {true, false}) {
    SCOPED_TRACE(graphs ? "recorded" : "op by op");
    EngineConfig dc = device_config(ec);
    dc.cuda_graphs = graphs;
    Engine dev_engine(*dev, nullptr, dc);
    const auto got = run(dev_engine, reqs, arrive);
    if (exact())
      EXPECT_EQ(got, want);
    else
      EXPECT_GE(agreement(got, want, reqs.size()), 0.95);
    expect_pool_empty(dev_engine);
    if (graphs && device().can_record())
      EXPECT_GT(dev_engine.runner().replayed_steps(), 20);
    else
      EXPECT_EQ(dev_engine.runner().replayed_steps(), 0);
  }
}

// int8 weights (quantize_weights=int8) quantised and multiplied on the device: the host's
// numerics (absmax rows, exact int32 sums), so bit for bit on the simulated device and
// the same greedy choices nearly everywhere on a GPU. Head dim 64 and k % 16 == 0 for the
// GPU's int8 kernel; decode steps of 1 to 4 rows and prefill chunks of more.
TEST(DeviceEngine, Int8WeightsEqualTheHost) {
  DecoderConfig c = testing_util::small_serving_config();
  c.dim = 128;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 64;
  c.ffn_dim = 192;
  auto host = testing_util::small_serving_params(c, true, 13);
  auto dev = on_device(*host);
  EngineConfig ec = f32_engine_config();
  ec.weights = WeightFormat::kInt8;
  ec.kv_dtype = DType::kBF16;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(greedy_request(random_prompt(3 + 9 * i, 700 + i), 16));
  Engine host_engine(*host, nullptr, ec), dev_engine(*dev, nullptr, device_config(ec));
  const auto want = run(host_engine, reqs);
  const auto got = run(dev_engine, reqs);
  if (exact())
    EXPECT_EQ(got, want);
  else
    EXPECT_GE(agreement(got, want, reqs.size()), 0.9);
  expect_pool_empty(dev_engine);
}

}  // namespace
}  // namespace hyperion::serve
