#include "serve/async_engine.h"

#include <exception>
#include <string>

#include "base/log.h"

namespace hyperion::serve {

namespace {

// The message of the exception being handled.
std::string current_error() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown exception";
  }
}

}  // namespace

AsyncEngine::AsyncEngine(Engine& engine) : engine_(engine) {
  stats_ = engine_.stats();
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() {
  stop();
}

int64_t AsyncEngine::submit(GenerationRequest request, TokenCallback callback) {
  engine_.validate(request);
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) throw ShuttingDownError("the server is shutting down");
  // Admission is decided here, once, against the requests this engine has accepted and
  // not yet finished: a stale snapshot of the engine's queue would let more in than
  // max_queue allows, and the engine would then reject them after the HTTP layer had
  // already answered 200.
  const EngineConfig& c = engine_.config();
  if (outstanding_ >= c.max_concurrent_decodes + c.max_queue)
    throw QueueFullError(fmt::format(
        "the queue is full ({} requests accepted for {} slots and max_queue={}); retry later",
        outstanding_, c.max_concurrent_decodes, c.max_queue));
  const int64_t id = next_id_++;
  TokenCallback counted = [this, id, cb = std::move(callback)](const TokenEvent& ev) {
    // The admission is given back on the request's last event, however the caller's
    // callback ends.
    struct Release {
      AsyncEngine* self;
      bool last;
      ~Release() {
        if (!last) return;
        std::lock_guard<std::mutex> l(self->mu_);
        --self->outstanding_;
      }
    } release{this, ev.finish != FinishReason::kNone};
    try {
      if (cb) cb(ev);
    } catch (...) {
      // The caller could not take the event (a bad_alloc, say). Kept out of the engine,
      // whose step it would cut short (the request's slot and pages never freed, every
      // other request failed); the request is ended instead.
      if (!release.last) cancel(id);
      log_error("serve: request {}: the token callback failed: {}", id, current_error());
    }
  };
  inbox_.push_back(Pending{id, std::move(request), std::move(counted)});
  ++outstanding_;  // after the last step that can throw (the engine takes it under mu_)
  cv_.notify_one();
  return id;
}

int64_t AsyncEngine::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outstanding_;
}

void AsyncEngine::cancel(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(id);
  cv_.notify_one();
}

void AsyncEngine::call(std::function<void(Engine&)> task) {
  std::future<void> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) throw ShuttingDownError("the server is shutting down");
    tasks_.emplace_back([this, t = std::move(task)] { t(engine_); });
    done = tasks_.back().get_future();
    cv_.notify_one();
  }
  try {
    done.get();
  } catch (const std::future_error&) {
    // The engine thread ended before running it (stop()).
    throw ShuttingDownError("the server is shutting down");
  }
}

EngineStats AsyncEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void AsyncEngine::snapshot() {
  EngineStats st = engine_.stats();
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = st;
}

void AsyncEngine::loop() {
  // After every round: callbacks may have queued events.
  const auto end_round = [&] {
    try {
      std::function<void()> listener;
      {
        std::lock_guard<std::mutex> lock(mu_);
        listener = round_listener_;
      }
      if (listener) listener();
    } catch (...) {
      // Kept off the engine thread, which would otherwise end the process.
      log_error("serve: the round listener failed: {}", current_error());
    }
  };
  for (;;) {
    std::vector<Pending> inbox;
    std::vector<int64_t> cancels;
    std::vector<std::packaged_task<void()>> tasks;
    bool stopping = false, paused = false;
    std::string stop_message;
    {
      const bool busy = engine_.has_work();
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || !tasks_.empty() || (!paused_ && (busy || !inbox_.empty() || !cancels_.empty()));
      });
      inbox.swap(inbox_);
      cancels.swap(cancels_);
      tasks.swap(tasks_);
      stopping = stop_;
      paused = paused_;
      if (stopping) stop_message = stop_reason_;
    }
    for (Pending& p : inbox) {
      TokenCallback cb = p.callback;
      try {
        engine_.add(std::move(p.request), std::move(p.callback), p.id);
      } catch (const std::exception& e) {
        TokenEvent ev;
        ev.finish = FinishReason::kError;
        ev.error = e.what();
        if (cb) cb(ev);
      }
    }
    for (int64_t id : cancels) engine_.cancel(id);
    for (auto& task : tasks) task();  // its exception goes to the caller's future
    tasks.clear();
    if (stopping) {
      engine_.fail_all(stop_message);
      snapshot();
      end_round();
      return;
    }
    std::chrono::milliseconds delay;
    {
      std::lock_guard<std::mutex> lock(mu_);
      delay = step_delay_;
    }
    if (paused) {  // woken for tasks only
      snapshot();
      continue;
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    try {
      engine_.step();
    } catch (const std::exception& e) {
      log_error("serve: engine step failed: {}", e.what());
      engine_.fail_all(fmt::format("engine step failed: {}", e.what()));
    }
    snapshot();
    end_round();
  }
}

void AsyncEngine::set_paused(bool paused) {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = paused;
  cv_.notify_one();
}

void AsyncEngine::set_step_delay(std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(mu_);
  step_delay_ = delay;
}

void AsyncEngine::set_round_listener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  round_listener_ = std::move(listener);
}

void AsyncEngine::stop(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
    stop_reason_ = reason;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  tasks_.clear();  // none should be left; a waiter would get ShuttingDownError
}

}  // namespace hyperion::serve
