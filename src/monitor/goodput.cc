#include "monitor/goodput.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "base/line_reader.h"
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
  int64_t line = 0;
};

double number(const Event& e, const char* key, double fallback = 0) {
  const auto it = e.fields.find(key);
  return it != e.fields.end() && it->is_number() ? it->get<double>() : fallback;
}

// An event line is small (a few hundred bytes); a longer one is not one of ours.
constexpr size_t kMaxEventLineBytes = 1 << 20;

// Calls `visit` with every event of the log, in order, checking each line as it goes:
// the log is streamed (a line at a time, in bounded memory), never read whole. Stops at
// byte `end` (-1: the end of the file) and returns where it stopped: a second pass over a
// log still being written reads exactly what the first one read.
template <typename Visit>
int64_t for_each_event(const std::string& path, Visit&& visit, int64_t end = -1) {
  std::error_code ec;
  HYP_CHECK(std::filesystem::is_regular_file(path, ec),
            "goodput: {}: cannot read (no event log: was the run made by hyperion "
            "train with this version?)",
            path);
  LineReader in(path, kMaxEventLineBytes);
  std::string_view text;
  double last_time = -INFINITY;
  for (LineReader::Status st; (end < 0 || in.offset() < end) &&
                             (st = in.next(text)) != LineReader::Status::kEnd;) {
    const int64_t line_no = in.line_number();
    HYP_CHECK(st != LineReader::Status::kTooLong,
              "goodput: {} line {}: longer than {} bytes: not an event (corrupt or foreign)",
              path, line_no, kMaxEventLineBytes);
    if (text.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    HYP_CHECK(!j.is_discarded(), "goodput: {} line {}: not a JSON line ({}): '{}'", path, line_no,
              in.unterminated() ? "truncated: the last line is incomplete" : "corrupt or foreign",
              std::string(text.substr(0, 80)));
    HYP_CHECK(j.is_object() && j.contains("time") && j["time"].is_number() && j.contains("event") &&
                  j["event"].is_string(),
              "goodput: {} line {}: not an event (an object with a numeric \"time\" and a "
              "string \"event\"): '{}'",
              path, line_no, std::string(text.substr(0, 80)));
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
    visit(e);
  }
  return in.offset();
}

// What the accounting of one process needs to know of the next (first pass).
struct AttemptSummary {
  double launch = 0;        // the OS's start of the process
  long long restored = 0;   // the step its last restore_end restored (0: none)
};

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
  // First pass: the processes (what each restored decides which steps of the one before
  // were kept), and the job's first and last moments.
  std::vector<AttemptSummary> attempts;
  bool job_start = false;
  double first_launch = INFINITY, last_time = -INFINITY;
  const int64_t read = for_each_event(path, [&](const Event& e) {
    first_launch = std::min(first_launch, e.time);
    last_time = std::max(last_time, e.time);
    if (e.kind == "job_start") {
      job_start = true;
      return;
    }
    if (e.kind == "process_start") {
      const double launch = std::min(number(e, "launch_time", e.time), e.time);
      attempts.push_back({launch, 0});
      first_launch = std::min(first_launch, launch);
    }
    HYP_CHECK(!attempts.empty(), "goodput: {} line {}: '{}' before any process_start", path, e.line,
              e.kind);
    if (e.kind == "restore_end") attempts.back().restored = static_cast<long long>(number(e, "step"));
  });
  HYP_CHECK(job_start, "goodput: {}: no job_start event (an empty or foreign event log)", path);

  GoodputReport r;
  for (const std::string& k : badput_kinds()) r.badput[k] = 0;
  r.processes = static_cast<int>(attempts.size());

  // Second pass: each process's time, one process at a time.
  struct Process {
    double start = 0, end = 0;
    bool clean = false, init_seen = false;
    double restore_begin = -1, restore_s = 0, init_end = 0, save_begin = -1;
    long long running_step = -1;
    double running_start = 0;
    long long kept_up_to = LLONG_MAX;  // steps after this one were lost
  };
  Process p;
  long long a = -1;
  auto finish = [&] {
    if (a < 0) return;
    if (p.restore_begin >= 0) p.restore_s += p.end - p.restore_begin;  // died restoring
    r.badput["checkpoint_restore"] += p.restore_s;
    r.badput["initialization"] +=
        std::max(0.0, (p.init_seen ? p.init_end : p.end) - p.start - p.restore_s);
    if (!p.clean) {
      ++r.disruptions;
      // The step the process died in, up to its last sign of life.
      if (p.running_step >= 0) r.badput["wasted_progress"] += p.end - p.running_start;
      if (p.save_begin >= 0) r.badput["checkpoint_save"] += p.end - p.save_begin;
    }
    if (static_cast<size_t>(a + 1) < attempts.size())
      r.badput["recovery"] += std::max(0.0, attempts[static_cast<size_t>(a + 1)].launch - p.end);
  };
  for_each_event(path, [&](const Event& e) {
    if (e.kind == "job_start") return;
    if (e.kind == "process_start") {
      finish();
      ++a;
      p = Process{};
      p.start = e.time;
      r.badput["program_startup"] += e.time - attempts[static_cast<size_t>(a)].launch;
      // A next process that restored nothing started over: none of these steps was kept.
      if (static_cast<size_t>(a + 1) < attempts.size())
        p.kept_up_to = attempts[static_cast<size_t>(a + 1)].restored;
    }
    p.end = e.time;
    if (e.kind == "restore_start") p.restore_begin = e.time;
    if (e.kind == "restore_end" && p.restore_begin >= 0) {
      p.restore_s += e.time - p.restore_begin;
      p.restore_begin = -1;
    }
    if (e.kind == "init_done" && !p.init_seen) {
      p.init_seen = true;
      p.init_end = e.time;
    }
    if (e.kind == "step_start") {
      p.running_step = static_cast<long long>(number(e, "step"));
      p.running_start = e.time;
    }
    if (e.kind == "step_end" && p.running_step >= 0) {
      const double secs = e.time - p.running_start;
      if (p.running_step <= p.kept_up_to) {
        const double wait = std::clamp(number(e, "data_wait_s"), 0.0, secs);
        r.productive_s += secs - wait;
        r.badput["data_loading"] += wait;
        ++r.steps_kept;
      } else {
        r.badput["wasted_progress"] += secs;
        ++r.steps_lost;
      }
      p.running_step = -1;
    }
    if (e.kind == "checkpoint_save_start") p.save_begin = e.time;
    if (e.kind == "checkpoint_save_end" && p.save_begin >= 0) {
      r.badput["checkpoint_save"] += e.time - p.save_begin;
      p.save_begin = -1;
    }
    if (e.kind == "process_end" || e.kind == "job_end") p.clean = true;
    if (e.kind == "job_end") r.finished = true;
  }, read);
  finish();
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
