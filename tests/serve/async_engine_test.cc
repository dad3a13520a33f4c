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

using testing_util::f32_engine_config;
using testing_util::greedy_request;

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

std::vector<int32_t> prompt(int64_t n, int32_t first) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(3 + (first + 7 * i) % 90));
  return p;
}

TEST(AsyncEngine, RoundListenerPassesOnEveryEventInOrder) {
  const DecoderConfig cfg = testing_util::small_serving_config(97, false);
  auto params = testing_util::small_serving_params(cfg, false, 7);
  constexpr int64_t kTokens = 6;
  const std::vector<GenerationRequest> reqs = {greedy_request(prompt(5, 1), kTokens),
                                               greedy_request(prompt(9, 2), kTokens)};
  // The same requests stepped on this thread, for the tokens.
  std::map<int, std::vector<int32_t>> want;
  {
    Engine direct(*params, nullptr, f32_engine_config());
    for (int r = 0; r < 2; ++r)
      direct.add(reqs[size_t(r)], [&want, r](const TokenEvent& ev) {
        if (ev.token >= 0) want[r].push_back(ev.token);
      });
    direct.run_until_idle();
  }

  Mailbox box;  // before the engine thread that calls into it, so it outlives the thread
  Engine engine(*params, nullptr, f32_engine_config());
  AsyncEngine async(engine);
  async.set_round_listener([&box] { box.on_round(); });
  async.set_paused(true);  // both requests start in the same round
  for (int r = 0; r < 2; ++r) async.submit(reqs[size_t(r)], box.callback(r));
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
    std::vector<int32_t> got;
    for (size_t i = 0; i < evs.size(); ++i) {
      got.push_back(evs[i].token);
      EXPECT_EQ(evs[i].finish, i + 1 < evs.size() ? FinishReason::kNone : FinishReason::kLength)
          << "request " << r << " event " << i;
    }
    EXPECT_EQ(got, want[r]) << "request " << r;
  }
  // Decoding together, a round carries both requests' tokens: one hand-off, not two.
  size_t most = 0;
  for (size_t n : box.round_sizes) most = std::max(most, n);
  EXPECT_EQ(most, 2u);
}

TEST(AsyncEngine, RoundListenerRunsAfterStopEndsRequests) {
  const DecoderConfig cfg = testing_util::small_serving_config(97, false);
  auto params = testing_util::small_serving_params(cfg, false, 7);
  Mailbox box;
  Engine engine(*params, nullptr, f32_engine_config());
  AsyncEngine async(engine);
  async.set_round_listener([&box] { box.on_round(); });
  async.set_paused(true);  // never steps: stop() ends the request
  async.submit(greedy_request(prompt(5, 3), 4), box.callback(0));
  async.stop("going away");
  std::lock_guard<std::mutex> lock(box.mu);
  EXPECT_TRUE(box.queued.empty());
  ASSERT_EQ(box.delivered.size(), 1u);
  EXPECT_EQ(box.delivered[0].second.finish, FinishReason::kError);
  EXPECT_EQ(box.delivered[0].second.error, "going away");
}

}  // namespace
}  // namespace hyperion::serve
