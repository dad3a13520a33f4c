// Runs an Engine on its own thread for the HTTP server: requests and cancellations from
// any thread go into an inbox the engine thread drains before every step; token events
// come back through each request's callback (on the engine thread). The engine thread
// sleeps when there is no work. This and the HTTP server's I/O threads are the only
// threads besides the OpenMP pool, which only the engine thread drives.
//
// Callbacks should only queue their event: the round listener, called once after every
// round (new requests taken, cancellations, one step), hands a round's events on at
// once. Waking an I/O thread per token held the engine thread ~20 us a token (a wake-up,
// and where compute threads fill every core, the woken thread preempting the step):
// 0.17 s of a 2.2 s run of 32 streams on 2 cores. Events made before a step (an abort
// from a cancellation, an error from a request the engine refused) go with that step's.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "serve/engine.h"

namespace hyperion::serve {

class AsyncEngine {
 public:
  explicit AsyncEngine(Engine& engine);
  ~AsyncEngine();  // stop()
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  // Validates (RequestError) and queues; returns the request id at once. Throws
  // QueueFullError when max_concurrent_decodes + max_queue requests are already accepted
  // and unfinished (so with every slot busy exactly max_queue wait), and
  // ShuttingDownError after stop(). A request accepted here is never rejected later.
  // A callback that throws ends its own request (cancelled; the last event still comes)
  // and nothing else: the exception is logged, never passed to the engine.
  int64_t submit(GenerationRequest request, TokenCallback callback);
  // Requests accepted and not yet finished (their last event not yet delivered).
  int64_t outstanding() const;
  void cancel(int64_t id);
  // The engine's counters after its last step.
  EngineStats stats() const;
  const Engine& engine() const { return engine_; }
  // Runs `task` on the engine thread between two steps (even while paused) and waits for
  // it: what may only change between steps, such as Engine::load_adapter. Rethrows what
  // the task throws; ShuttingDownError after stop(). Never call it from a callback.
  void call(std::function<void(Engine&)> task);
  // Test hooks: a paused engine queues requests but does not step; a step delay sleeps
  // before every step (holds requests in flight for disconnect and queue tests).
  void set_paused(bool paused);
  void set_step_delay(std::chrono::milliseconds delay);
  // Called on the engine thread after every round in which callbacks may have run, and
  // after stop() has ended every request; nullptr for none. Should not throw (a throw is
  // logged). A call already running is not waited for: replace it only before the first
  // submit() or after stop().
  void set_round_listener(std::function<void()> listener);
  // Ends every unfinished request with FinishReason::kError and `reason`, refuses new
  // ones, and joins the engine thread. Idempotent.
  void stop(const std::string& reason = "the server is shutting down");

 private:
  struct Pending {
    int64_t id;
    GenerationRequest request;
    TokenCallback callback;
  };
  void loop();
  void snapshot();

  Engine& engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> inbox_;
  std::vector<int64_t> cancels_;
  std::vector<std::packaged_task<void()>> tasks_;
  bool stop_ = false;
  std::string stop_reason_;
  int64_t outstanding_ = 0;  // accepted by submit(), final event not yet delivered
  bool paused_ = false;
  std::chrono::milliseconds step_delay_{0};
  std::function<void()> round_listener_;
  int64_t next_id_ = 1;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace hyperion::serve
