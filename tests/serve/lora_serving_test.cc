// Serving LoRA adapters (serve/lora_registry.h, model/lora_bank.h): a batch mixing three
// adapters of different ranks and targets with requests for the base gives each request
// exactly what the single-sequence generator gives with that adapter alone (f32, chunked
// prefill, more requests than slots); prefix-cache pages are never shared across
// adapters; unloading an adapter lets its running requests finish and frees its slot only
// then; loading and unloading under load (the async engine) never fails a request; bad
// loads are refused naming the field; bf16 and the device backend agree.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "../kernels/simulated_device.h"
#include "../model/model_test_util.h"
#include "kernels/fill.h"
#include "model/generator.h"
#include "model/lora.h"
#include "model/lora_bank.h"
#include "serve/async_engine.h"
#include "serve/engine.h"
#include "serve_test_util.h"

namespace hyperion::serve {
namespace {

using testing_util::f32_engine_config;
using testing_util::greedy_request;
using testing_util::random_prompt;

DecoderConfig small_config() {
  return testing_util::small_serving_config(97);
}

std::unique_ptr<LoraAdapter> make_adapter(const ParamStore& base, int64_t rank, const std::string& targets,
                                          uint64_t seed) {
  return testing_util::random_adapter(base, rank, targets, seed);
}

std::vector<int32_t> reference(const ParamStore& p, const LoraAdapter* adapter, const std::vector<int32_t>& prompt,
                               int64_t max_tokens, SamplingParams sp = {0.0f, 0, 1.0f, 0}) {
  return testing_util::generator_tokens(p, adapter, prompt, max_tokens, sp);
}

using testing_util::Collected;
using testing_util::run_all;

struct Fixture {
  Fixture() : params(testing_util::small_serving_params(small_config(), false, 7)) {
    adapters.push_back(make_adapter(*params, 2, "all-linear", 11));
    adapters.push_back(make_adapter(*params, 4, "q_proj,v_proj", 12));
    adapters.push_back(make_adapter(*params, 8, "o_proj,gate_proj,up_proj,down_proj", 13));
  }
  // Loads the three as "a", "b", "c".
  void load(Engine& e) const {
    for (size_t i = 0; i < adapters.size(); ++i)
      e.load_adapter(std::string(1, static_cast<char>('a' + i)), "mem", *adapters[i]);
  }
  // Nine requests: adapter (i % 4) - 1 (-1: the base), different lengths, some seeded.
  std::vector<GenerationRequest> requests(const Engine& e, std::vector<int>& which) const {
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 9; ++i) {
      GenerationRequest r = greedy_request(random_prompt(3 + 5 * i, 100 + i), 6 + 2 * i);
      if (i % 3 == 1) r.sampling = SamplingParams{0.9f, 20, 0.95f, static_cast<uint64_t>(i)};
      const int a = i % 4 - 1;
      if (a >= 0) r.adapter = e.adapters().find(std::string(1, static_cast<char>('a' + a)));
      which.push_back(a);
      reqs.push_back(r);
    }
    return reqs;
  }
  std::vector<int32_t> want(const GenerationRequest& r, int a) const {
    return reference(*params, a < 0 ? nullptr : adapters[static_cast<size_t>(a)].get(), r.prompt, r.max_tokens,
                     r.sampling);
  }
  std::unique_ptr<ParamStore> params;
  std::vector<std::unique_ptr<LoraAdapter>> adapters;
};

void expect_pool_empty(const Engine& e) {
  const EngineStats st = e.stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.pages_used, 0);
}

TEST(LoraServing, MixedAdapterBatchEqualsEachRequestAlone) {
  const Fixture f;
  EngineConfig ec = f32_engine_config();
  ec.prefix_caching = false;
  Engine engine(*f.params, nullptr, ec);
  f.load(engine);
  std::vector<int> which;
  const auto reqs = f.requests(engine, which);
  const auto got = run_all(engine, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, f.want(reqs[i], which[i])) << "request " << i << " adapter " << which[i];
    EXPECT_EQ(got[i].finish, FinishReason::kLength);
  }
  // The adapters change the output (else the test would prove nothing).
  int differ = 0;
  for (size_t i = 0; i < reqs.size(); ++i)
    if (which[i] >= 0) differ += got[i].tokens != f.want(reqs[i], -1);
  EXPECT_GE(differ, 5);
  expect_pool_empty(engine);
}

TEST(LoraServing, PrefixCachePagesStayWithTheirAdapter) {
  const Fixture f;
  Engine engine(*f.params, nullptr, f32_engine_config());
  f.load(engine);
  const auto prompt = random_prompt(21, 5);  // 5 full pages of 4
  GenerationRequest with_a = greedy_request(prompt, 6);
  with_a.adapter = engine.adapters().find("a");
  const auto first = run_all(engine, {with_a});
  EXPECT_EQ(first[0].tokens, reference(*f.params, f.adapters[0].get(), prompt, 6));
  // The base and adapter b see the same tokens but not a's KV.
  GenerationRequest plain = greedy_request(prompt, 6), with_b = greedy_request(prompt, 6);
  with_b.adapter = engine.adapters().find("b");
  const auto other = run_all(engine, {plain, with_b});
  EXPECT_EQ(other[0].last.cached_tokens, 0);
  EXPECT_EQ(other[1].last.cached_tokens, 0);
  EXPECT_EQ(other[0].tokens, reference(*f.params, nullptr, prompt, 6));
  EXPECT_EQ(other[1].tokens, reference(*f.params, f.adapters[1].get(), prompt, 6));
  // a again: its own pages are reused.
  const auto again = run_all(engine, {with_a});
  EXPECT_EQ(again[0].last.cached_tokens, 20);
  EXPECT_EQ(again[0].tokens, first[0].tokens);
  // Reloaded under the same name, it is a new adapter: nothing cached is reused.
  ASSERT_TRUE(engine.unload_adapter("a"));
  with_a.adapter.reset();
  engine.load_adapter("a", "mem", *f.adapters[0]);
  with_a.adapter = engine.adapters().find("a");
  EXPECT_EQ(run_all(engine, {with_a})[0].last.cached_tokens, 0);
  expect_pool_empty(engine);
}

TEST(LoraServing, UnloadLetsRunningRequestsFinishAndFreesTheSlotAfter) {
  const Fixture f;
  EngineConfig ec = f32_engine_config();
  ec.max_loras = 1;
  Engine engine(*f.params, nullptr, ec);
  engine.load_adapter("a", "mem", *f.adapters[0]);
  GenerationRequest r = greedy_request(random_prompt(9, 3), 12);
  r.adapter = engine.adapters().find("a");
  Collected out;
  engine.add(r, [&out](const TokenEvent& ev) {
    if (ev.token >= 0) out.tokens.push_back(ev.token);
    if (ev.finish != FinishReason::kNone) out.finish = ev.finish;
  });
  r.adapter.reset();  // only the engine's copy holds it now
  for (int i = 0; i < 4; ++i) engine.step();
  EXPECT_TRUE(engine.unload_adapter("a"));
  EXPECT_FALSE(engine.unload_adapter("a"));
  EXPECT_EQ(engine.adapters().find("a"), nullptr);
  // The one slot is still held by the running request.
  try {
    engine.load_adapter("b", "mem", *f.adapters[1]);
    ADD_FAILURE() << "a held slot was given out";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.param, "lora_name");
    EXPECT_NE(std::string(e.what()).find("max_loras=1"), std::string::npos) << e.what();
  }
  engine.run_until_idle();
  EXPECT_EQ(out.finish, FinishReason::kLength);
  EXPECT_EQ(out.tokens, reference(*f.params, f.adapters[0].get(), random_prompt(9, 3), 12));
  // Now the slot is free, and b in it gives b's tokens.
  engine.load_adapter("b", "mem", *f.adapters[1]);
  GenerationRequest rb = greedy_request(random_prompt(9, 3), 12);
  rb.adapter = engine.adapters().find("b");
  EXPECT_EQ(run_all(engine, {rb})[0].tokens, reference(*f.params, f.adapters[1].get(), rb.prompt, 12));
}

TEST(LoraServing, BadLoadsAreRefusedNamingTheField) {
  const Fixture f;
  EngineConfig ec = f32_engine_config();
  ec.max_lora_rank = 4;
  Engine engine(*f.params, nullptr, ec);
  auto expect_refused = [&](const std::string& name, const LoraAdapter& a, const std::string& says) {
    try {
      engine.load_adapter(name, "mem", a);
      ADD_FAILURE() << name << " was loaded";
    } catch (const RequestError& e) {
      EXPECT_EQ(e.param, "lora_name");
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  expect_refused("big", *f.adapters[2], "max_lora_rank=4");  // rank 8
  engine.load_adapter("a", "mem", *f.adapters[0]);
  expect_refused("a", *f.adapters[1], "already loaded");
  expect_refused("", *f.adapters[1], "must not be empty");
  EngineConfig none = f32_engine_config();
  none.max_loras = 0;
  Engine plain(*f.params, nullptr, none);
  try {
    plain.load_adapter("a", "mem", *f.adapters[0]);
    ADD_FAILURE() << "max_loras=0 loaded an adapter";
  } catch (const RequestError& e) {
    EXPECT_NE(std::string(e.what()).find("max_loras=0"), std::string::npos) << e.what();
  }
  // An adapter for another base shape is refused by the bank, before any slot changes.
  DecoderConfig wide = small_config();
  wide.dim = 32;
  wide.head_dim = 8;
  ParamStore other(wide, false, false);
  const auto foreign = make_adapter(other, 2, "all-linear", 5);
  EXPECT_THROW(engine.load_adapter("foreign", "mem", *foreign), Error);
  EXPECT_EQ(engine.adapters().find("foreign"), nullptr);
}

// The async engine while a thread loads and unloads adapters: every request, including
// those whose adapter is unloaded while they run, finishes with its adapter's tokens.
TEST(LoraServing, LoadAndUnloadUnderLoadNeverFailAnInFlightRequest) {
  const Fixture f;
  EngineConfig ec = f32_engine_config();
  ec.max_loras = 2;
  ec.max_queue = 64;
  Engine engine(*f.params, nullptr, ec);
  engine.load_adapter("a", "mem", *f.adapters[0]);
  AsyncEngine async(engine);
  async.set_step_delay(std::chrono::milliseconds(1));  // requests overlap the churn
  std::mutex mu;
  struct Result {
    int adapter;
    std::vector<int32_t> prompt, tokens;
    int64_t max_tokens;
    FinishReason finish = FinishReason::kNone;
    std::string error;
  };
  std::vector<std::shared_ptr<Result>> results;
  std::atomic<bool> done{false};
  std::atomic<int> cycles{0}, refused{0}, c_users{0};
  std::thread churn([&] {
    // c goes into the second slot, takes two requests, is unloaded while they run, and
    // again, until the requests are all in. The submitter never gives one load of c more
    // than two requests, so the cycles do not depend on how the threads are scheduled.
    while (!done.load()) {
      try {
        async.call([&](Engine& e) { e.load_adapter("c", "mem", *f.adapters[2]); });
      } catch (const RequestError&) {
        ++refused;  // the slot is still held by a request for the previous c
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      const int want = 2 * (cycles.load() + 1);
      while (!done.load() && c_users.load() < want) std::this_thread::sleep_for(std::chrono::microseconds(200));
      async.call([&](Engine& e) { e.unload_adapter("c"); });
      ++cycles;
    }
  });
  uint64_t last_c = 0;  // the prefix-cache root of the load of c last used: one per load
  int on_last_c = 0;
  for (int i = 0; i < 24; ++i) {
    GenerationRequest r = greedy_request(random_prompt(4 + (i * 7) % 19, 500 + i), 5 + i % 6);
    const int a = i % 3 == 0 ? -1 : i % 3 == 1 ? 0 : 2;
    if (a == 0) r.adapter = engine.adapters().find("a");
    if (a == 2) {
      // Two requests per load of c: wait for the next load once this one has two.
      while (!(r.adapter = engine.adapters().find("c")) || (r.adapter->cache_root == last_c && on_last_c == 2))
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      on_last_c = r.adapter->cache_root == last_c ? on_last_c + 1 : 1;
      last_c = r.adapter->cache_root;
    }
    auto res = std::make_shared<Result>(Result{a, r.prompt, {}, r.max_tokens, FinishReason::kNone, {}});
    {
      std::lock_guard<std::mutex> lock(mu);
      results.push_back(res);
    }
    async.submit(std::move(r), [res, &mu](const TokenEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (ev.token >= 0) res->tokens.push_back(ev.token);
      if (ev.finish != FinishReason::kNone) {
        res->finish = ev.finish;
        res->error = ev.error;
      }
    });
    if (a == 2) ++c_users;
  }
  for (int i = 0; i < 2000 && async.outstanding() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  done = true;
  churn.join();
  async.stop();
  EXPECT_GE(cycles.load(), 4);  // the 8 c requests ran on four loads, two on each
  int with_c = 0;
  for (const auto& r : results) {
    ASSERT_EQ(r->finish, FinishReason::kLength) << r->error;
    EXPECT_EQ(r->tokens, reference(*f.params, r->adapter < 0 ? nullptr : f.adapters[static_cast<size_t>(r->adapter)].get(),
                                   r->prompt, r->max_tokens));
    with_c += r->adapter == 2;
  }
  EXPECT_EQ(with_c, 8);
  std::printf("[ info ] %d load/unload cycles, %d loads waited for a slot\n", cycles.load(), refused.load());
}

// bf16 weights: the mixed batch agrees with the same requests run one at a time on almost
// every greedy token (GEMMs of other row counts may round differently); the device backend
// (simulated here) gives the host's tokens.
TEST(LoraServing, Bf16AndDeviceAgree) {
  const Fixture f;
  auto run = [&](const ParamStore& p, EngineConfig ec, bool alone) {
    ec.prefix_caching = false;
    Engine engine(p, nullptr, ec);
    f.load(engine);
    std::vector<int> which;
    auto reqs = f.requests(engine, which);
    for (auto& r : reqs) r.sampling = SamplingParams{0.0f, 0, 1.0f, 0};
    if (!alone) return run_all(engine, reqs);
    std::vector<Collected> out;
    for (const auto& r : reqs) out.push_back(run_all(engine, {r})[0]);
    return out;
  };
  EngineConfig bf = f32_engine_config();
  bf.weights = WeightFormat::kBF16;
  bf.kv_dtype = DType::kBF16;
  auto pb = testing_util::small_serving_params(small_config(), true, 7);
  const auto mixed = run(*pb, bf, false), alone = run(*pb, bf, true);
  int64_t same = 0, total = 0;
  for (size_t i = 0; i < mixed.size(); ++i) {
    size_t j = 0;
    while (j < alone[i].tokens.size() && alone[i].tokens[j] == mixed[i].tokens[j]) ++j;
    same += static_cast<int64_t>(j);
    total += static_cast<int64_t>(alone[i].tokens.size());
  }
  std::printf("[ info ] bf16: the mixed batch agrees with each request alone on %lld of %lld tokens\n",
              static_cast<long long>(same), static_cast<long long>(total));
  EXPECT_GE(double(same) / double(total), 0.9);

  KernelBackend* dev = testing_util::simulated_device();
  if (dev == nullptr) dev = &backend_for(Device::kCuda);
  ParamStore on_dev(small_config(), false, false, dev->allocator());
  std::memcpy(on_dev.host_params(), f.params->params(), static_cast<size_t>(f.params->size()) * sizeof(float));
  on_dev.params_to_device();
  EngineConfig dc = f32_engine_config();
  dc.hardware = Device::kCuda;
  const auto host = run(*f.params, f32_engine_config(), false);
  const auto device = run(on_dev, dc, false);
  const bool exact = std::string(dev->name()) == "simulated";
  for (size_t i = 0; i < host.size(); ++i) {
    if (exact) {
      EXPECT_EQ(device[i].tokens, host[i].tokens) << "request " << i;
    }
  }
}

TEST(LoraBank, RowsAreSortedBySlotAndInverted) {
  std::vector<int32_t> perm, inverse;
  LoraRows rows;
  EXPECT_FALSE(lora_rows_from_slots({0, 0, 0}, 3, perm, inverse, rows));
  ASSERT_TRUE(lora_rows_from_slots({2, 0, 1, 2, 0}, 3, perm, inverse, rows));
  EXPECT_EQ(perm, (std::vector<int32_t>{1, 4, 2, 0, 3}));
  EXPECT_EQ(rows.sizes, (std::vector<int64_t>{2, 1, 2}));
  for (size_t i = 0; i < perm.size(); ++i) EXPECT_EQ(perm[static_cast<size_t>(inverse[i])], static_cast<int32_t>(i));
  EXPECT_FALSE(rows.identity);
  ASSERT_TRUE(lora_rows_from_slots({0, 1, 1, 2}, 3, perm, inverse, rows));
  EXPECT_TRUE(rows.identity);
  EXPECT_THROW(lora_rows_from_slots({0, 3}, 3, perm, inverse, rows), Error);
}

}  // namespace
}  // namespace hyperion::serve
