// The engine thread's hand-off (serve/async_engine.h): callbacks queue their events and
// the round listener, called after every round, passes a round's events on at once.
#include "serve/async_engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <vector>

#include "serve_test_util.h"

namespace hyperion::serve {
namespace {

// Events as the HTTP server sees them: queued by callbacks, delivered by the listener.
struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<int, TokenEvent>> queued, delivered;
  std::vector<size_t> round_sizes;  // events each listener call passed on (0 for none)
  int finished = 0;

  TokenCallback callback(int request) {
    return [this, request](const TokenEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      queued.emplace_back(request, ev);
    };
  }
  void on_round() {
    std::lock_guard<std::mutex> lock(mu);
    round_sizes.push_back(queued.size());
    for (auto& e : queued) {
      if (e.second.finish != FinishReason::kNone) ++finished;
      delivered.push_back(std::move(e));
    }
    queued.clear();
    cv.notify_all();
  }
  bool wait_finished(int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished >= n; });
  }
};

GenerationRequest greedy(int64_t prompt_len, int64_t max_tokens) {
  GenerationRequest r;
  for (int64_t i = 0; i < prompt_len; ++i) r.prompt.push_back(static_cast<int32_t>(3 + i % 90));
  r.sampling.temperature = 0.0f;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

EngineConfig small_engine() {
  EngineConfig c;
  c.weights = WeightFormat::kF32;
  c.kv_dtype = DType::kF32;
  c.kv_page_tokens = 4;
  c.max_concurrent_decodes = 4;
  return c;
}

TEST(AsyncEngine, RoundListenerPassesOnEveryEventInOrder) {
  const LlamaConfig cfg = testing_util::small_serving_config(97, false);
  auto params = testing_util::small_serving_params(cfg, false, 7);
  Engine engine(*params, nullptr, small_engine());
  AsyncEngine async(engine);
  Mailbox box;
  async.set_round_listener([&box] { box.on_round(); });
  async.set_paused(true);  // both requests start in the same round
  constexpr int64_t kTokens = 6;
  async.submit(greedy(5, kTokens), box.callback(0));
  async.submit(greedy(9, kTokens), box.callback(1));
  async.set_paused(false);
  ASSERT_TRUE(box.wait_finished(2));
  async.stop();

  std::lock_guard<std::mutex> lock(box.mu);
  EXPECT_TRUE(box.queued.empty()) << "events left behind after the last round";
  std::map<int, std::vector<TokenEvent>> per_request;
  for (const auto& [r, ev] : box.delivered) per_request[r].push_back(ev);
  for (int r = 0; r < 2; ++r) {
    const auto& evs = per_request[r];
    ASSERT_EQ(static_cast<int64_t>(evs.size()), kTokens) << "request " << r;
    for (size_t i = 0; i + 1 < evs.size(); ++i)
      EXPECT_EQ(evs[i].finish, FinishReason::kNone) << "request " << r << " event " << i;
    EXPECT_EQ(evs.back().finish, FinishReason::kLength) << "request " << r;
  }
  // Decoding together, a round carries both requests' tokens: one hand-off, not two.
  size_t most = 0;
  for (size_t n : box.round_sizes) most = std::max(most, n);
  EXPECT_EQ(most, 2u);
}

TEST(AsyncEngine, RoundListenerRunsAfterStopEndsRequests) {
  const LlamaConfig cfg = testing_util::small_serving_config(97, false);
  auto params = testing_util::small_serving_params(cfg, false, 7);
  Engine engine(*params, nullptr, small_engine());
  AsyncEngine async(engine);
  Mailbox box;
  async.set_round_listener([&box] { box.on_round(); });
  async.set_paused(true);  // never steps: stop() ends the request
  async.submit(greedy(5, 4), box.callback(0));
  async.stop("going away");
  std::lock_guard<std::mutex> lock(box.mu);
  EXPECT_TRUE(box.queued.empty());
  ASSERT_EQ(box.delivered.size(), 1u);
  EXPECT_EQ(box.delivered[0].second.finish, FinishReason::kError);
  EXPECT_EQ(box.delivered[0].second.error, "going away");
}

}  // namespace
}  // namespace hyperion::serve
