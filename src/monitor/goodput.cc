#include "monitor/goodput.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "monitor/run_files.h"

namespace hyperion::monitor {

namespace {

const std::set<std::string>& known_kinds() {
  static const std::set<std::string> k = {"job_start",
                                          "process_start",
                                          "restore_start",
                                          "restore_end",
                                          "init_done",
                                          "step_start",
                                          "step_end",
                                          "checkpoint_save_start",
                                          "checkpoint_save_end",
                                          "eval_start",
                                          "eval_end",
                                          "process_end",
                                          "job_end",
                                          "crash",
                                          "hang"};
  return k;
}

struct Event {
  double time = 0;
  std::string kind;
  nlohmann::json fields;
  size_t line = 0;
};

// One process's events, from its process_start to the event before the next one.
struct Attempt {
  std::vector<Event> events;
};

double number(const Event& e, const char* key, double fallback = 0) {
  const auto it = e.fields.find(key);
  return it != e.fields.end() && it->is_number() ? it->get<double>() : fallback;
}

std::vector<Event> read_events(const std::string& path) {
  std::ifstream in(path);
  HYP_CHECK(in.good(),
            "goodput: {}: cannot read (no event log: was the run made by hyperion "
            "train with this version?)",
            path);
  std::vector<Event> events;
  std::string text;
  size_t line_no = 0;
  double last_time = -INFINITY;
  while (std::getline(in, text)) {
    ++line_no;
    if (text.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error&) {
      fail("goodput: {} line {}: not a JSON line ({}): '{}'", path, line_no,
           in.peek() == EOF ? "truncated: the last line is incomplete" : "corrupt or foreign",
           text.substr(0, 80));
    }
    HYP_CHECK(j.is_object() && j.contains("time") && j["time"].is_number() && j.contains("event") &&
                  j["event"].is_string(),
              "goodput: {} line {}: not an event (an object with a numeric \"time\" and a "
              "string \"event\"): '{}'",
              path, line_no, text.substr(0, 80));
    Event e;
    e.time = j["time"].get<double>();
    e.kind = j["event"].get<std::string>();
    e.line = line_no;
    HYP_CHECK(known_kinds().count(e.kind), "goodput: {} line {}: unknown event kind '{}'", path,
              line_no, e.kind);
    // Crash and hang lines come from any rank's clock; the rest from rank 0 in order.
    if (e.kind != "crash" && e.kind != "hang") {
      HYP_CHECK(e.time >= last_time - 1.0,
                "goodput: {} line {}: time {:.3f} is before the previous event's {:.3f}", path,
                line_no, e.time, last_time);
      last_time = std::max(last_time, e.time);
    }
    e.fields = std::move(j);
    events.push_back(std::move(e));
  }
  return events;
}

}  // namespace

const std::vector<std::string>& badput_kinds() {
  static const std::vector<std::string> k = {
      "program_startup",    "initialization",  "data_loading", "checkpoint_save",
      "checkpoint_restore", "wasted_progress", "recovery",     "other"};
  return k;
}

GoodputReport compute_goodput(const std::string& run_dir_or_file) {
  namespace fs = std::filesystem;
  const std::string path = fs::is_directory(run_dir_or_file)
                               ? (fs::path(run_dir_or_file) / kEventsFile).string()
                               : run_dir_or_file;
  const std::vector<Event> events = read_events(path);
  HYP_CHECK(!events.empty() && std::any_of(events.begin(), events.end(),
                                           [](const Event& e) { return e.kind == "job_start"; }),
            "goodput: {}: no job_start event (an empty or foreign event log)", path);

  std::vector<Attempt> attempts;
  for (const Event& e : events) {
    if (e.kind == "job_start") continue;
    if (e.kind == "process_start") attempts.emplace_back();
    HYP_CHECK(!attempts.empty(), "goodput: {} line {}: '{}' before any process_start", path, e.line,
              e.kind);
    attempts.back().events.push_back(e);
  }

  GoodputReport r;
  for (const std::string& k : badput_kinds()) r.badput[k] = 0;
  r.processes = static_cast<int>(attempts.size());
  double first_launch = INFINITY, last_time = -INFINITY;
  for (const Event& e : events) {
    first_launch = std::min(first_launch, e.time);
    last_time = std::max(last_time, e.time);
  }

  for (size_t a = 0; a < attempts.size(); ++a) {
    const std::vector<Event>& ev = attempts[a].events;
    const Event& start = ev.front();
    const double launch = std::min(number(start, "launch_time", start.time), start.time);
    first_launch = std::min(first_launch, launch);
    r.badput["program_startup"] += start.time - launch;
    const double end = ev.back().time;
    bool clean = false, init_seen = false;
    double restore_begin = -1, restore_s = 0, init_end = end, save_begin = -1;
    // Steps this process ran: step -> {seconds, data wait}; a step re-run after a restore
    // in the same process cannot happen, so the last record of a step number wins.
    struct StepRecord {
      double start = 0, seconds = 0, data_wait = 0;
    };
    std::map<long long, StepRecord> steps;
    long long running_step = -1;
    double running_start = 0;
    for (const Event& e : ev) {
      if (e.kind == "restore_start") restore_begin = e.time;
      if (e.kind == "restore_end" && restore_begin >= 0) {
        restore_s += e.time - restore_begin;
        restore_begin = -1;
      }
      if (e.kind == "init_done" && !init_seen) {
        init_seen = true;
        init_end = e.time;
      }
      if (e.kind == "step_start") {
        running_step = static_cast<long long>(number(e, "step"));
        running_start = e.time;
      }
      if (e.kind == "step_end" && running_step >= 0) {
        const double secs = e.time - running_start;
        steps[running_step] = {running_start, secs,
                               std::clamp(number(e, "data_wait_s"), 0.0, secs)};
        running_step = -1;
      }
      if (e.kind == "checkpoint_save_start") save_begin = e.time;
      if (e.kind == "checkpoint_save_end" && save_begin >= 0) {
        r.badput["checkpoint_save"] += e.time - save_begin;
        save_begin = -1;
      }
      if (e.kind == "process_end" || e.kind == "job_end") clean = true;
      if (e.kind == "job_end") r.finished = true;
    }
    // A restore still open when the process died counts up to its last event.
    if (restore_begin >= 0) restore_s += end - restore_begin;
    r.badput["checkpoint_restore"] += restore_s;
    r.badput["initialization"] += std::max(0.0, init_end - start.time - restore_s);

    // What the next process restored decides which of these steps were kept.
    long long kept_up_to = LLONG_MAX;
    if (a + 1 < attempts.size()) {
      kept_up_to = 0;  // a next process that restored nothing started over
      for (const Event& e : attempts[a + 1].events)
        if (e.kind == "restore_end") kept_up_to = static_cast<long long>(number(e, "step"));
    }
    for (const auto& [step, rec] : steps) {
      if (step <= kept_up_to) {
        r.productive_s += rec.seconds - rec.data_wait;
        r.badput["data_loading"] += rec.data_wait;
        ++r.steps_kept;
      } else {
        r.badput["wasted_progress"] += rec.seconds;
        ++r.steps_lost;
      }
    }
    if (!clean) {
      ++r.disruptions;
      // The step the process died in, up to its last sign of life.
      if (running_step >= 0) r.badput["wasted_progress"] += end - running_start;
      if (save_begin >= 0) r.badput["checkpoint_save"] += end - save_begin;
    }
    if (a + 1 < attempts.size()) {
      const Event& next = attempts[a + 1].events.front();
      const double next_launch = std::min(number(next, "launch_time", next.time), next.time);
      r.badput["recovery"] += std::max(0.0, next_launch - end);
    }
  }
  r.total_s = std::max(0.0, last_time - first_launch);
  double accounted = r.productive_s;
  for (const auto& [k, v] : r.badput) accounted += v;
  r.badput["other"] = std::max(0.0, r.total_s - accounted);
  r.goodput = r.total_s > 0 ? r.productive_s / r.total_s : 0.0;
  return r;
}

std::string goodput_json(const GoodputReport& r) {
  nlohmann::ordered_json j;
  j["goodput"] = r.goodput;
  j["total_s"] = r.total_s;
  j["productive_s"] = r.productive_s;
  nlohmann::ordered_json bad = nlohmann::ordered_json::object();
  for (const std::string& k : badput_kinds()) {
    const double s = r.badput.count(k) ? r.badput.at(k) : 0.0;
    bad[k] = {{"seconds", s}, {"fraction", r.total_s > 0 ? s / r.total_s : 0.0}};
  }
  j["badput"] = bad;
  j["processes"] = r.processes;
  j["disruptions"] = r.disruptions;
  j["steps_kept"] = r.steps_kept;
  j["steps_lost"] = r.steps_lost;
  j["finished"] = r.finished;
  return j.dump();
}

}  // namespace hyperion::monitor
