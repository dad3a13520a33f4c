#include "monitor/dashboard_data.h"

#include <httplib.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <optional>

#include "base/error.h"
#include "base/line_reader.h"
#include "base/log.h"
#include "monitor/goodput.h"
#include "monitor/prometheus_text.h"
#include "monitor/run_files.h"

namespace hyperion::monitor {

namespace {

using nlohmann::json;

constexpr size_t kMaxBadLines = 5;
constexpr size_t kMaxLineBytes = 1 << 20;
// Points kept per scraped series: a day of 2 s scrapes at one step each; the oldest
// quarter goes when it is reached, so memory stays bounded on a long job.
constexpr size_t kMaxPoints = 40000;

// Every k-th row and the last, so that at most max_rows remain.
json thinned(const json& rows, size_t max_rows) {
  const size_t n = rows.size();
  if (n <= max_rows || max_rows < 2) return rows;
  const size_t k = (n + max_rows - 2) / (max_rows - 1);
  json out = json::array();
  for (size_t i = 0; i < n; i += k) out.push_back(rows[i]);
  if ((n - 1) % k != 0) out.push_back(rows[n - 1]);
  return out;
}

std::string basename_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

// ---- run directories -------------------------------------------------------------

void JsonlTail::reset() {
  inode_ = 0;
  offset_ = 0;
  lines_ = 0;
  rows_ = json::array();
  bad_lines_.clear();
  more_bad_lines_ = 0;
}

void JsonlTail::update() {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {  // not written yet, or removed
    reset();
    read_error_.clear();
    return;
  }
  if (st.st_ino != inode_ || st.st_size < offset_) {  // replaced or shortened: read anew
    reset();
    inode_ = st.st_ino;
  }
  if (st.st_size == offset_) return;
  // Streamed a line at a time in bounded memory: a line over 1 MiB (no metrics line is
  // near that) is skipped as a problem, not held.
  std::optional<LineReader> in;
  try {
    in.emplace(path_, kMaxLineBytes, offset_);
  } catch (const Error& e) {
    read_error_ = e.what();
    return;
  }
  read_error_.clear();
  std::string_view line;
  for (LineReader::Status got; (got = in->next(line)) != LineReader::Status::kEnd;) {
    if (in->unterminated()) break;  // a last line without its newline waits for it
    offset_ = in->offset();
    ++lines_;
    const bool too_long = got == LineReader::Status::kTooLong;
    if (!too_long && line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    json row = too_long ? json() : json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (too_long || row.is_discarded() || !row.is_object()) {
      if (bad_lines_.size() < kMaxBadLines)
        bad_lines_.push_back(fmt::format("{} line {}: {} (skipped)", basename_of(path_), lines_,
                                         too_long ? "longer than 1 MiB" : "not a JSON object"));
      else
        ++more_bad_lines_;
      continue;
    }
    rows_.push_back(std::move(row));
  }
}

std::vector<std::string> JsonlTail::problems() const {
  std::vector<std::string> out = bad_lines_;
  if (more_bad_lines_ > 0)
    out.push_back(fmt::format("{}: {} more lines skipped", basename_of(path_), more_bad_lines_));
  if (!read_error_.empty()) out.push_back(read_error_);
  return out;
}

RunDirReader::RunDirReader(std::string dir)
    : dir_(std::move(dir)), metrics_(dir_ + "/" + kMetricsFile), ranks_(dir_ + "/" + kRanksFile) {}

json RunDirReader::read(size_t max_rows) {
  const std::lock_guard lock(mutex_);
  metrics_.update();
  ranks_.update();
  // Goodput reads the whole event log: only again when the log changed. (The log is
  // appended a whole line per write(), so it has no torn line to wait for.)
  const std::string events = dir_ + "/" + kEventsFile;
  struct stat st {};
  std::string key;
  if (::stat(events.c_str(), &st) == 0)
    key = fmt::format("{} {} {}.{}", st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  if (key.empty() || key != events_key_) {
    goodput_ = {{"goodput", nullptr}, {"goodput_error", nullptr}};
    try {
      goodput_["goodput"] = json::parse(goodput_json(compute_goodput(dir_)));
    } catch (const std::exception& e) {  // missing, or malformed: the page says why
      goodput_["goodput_error"] = e.what();
    }
    events_key_ = key;
  }
  json problems = json::array();
  for (const JsonlTail* t : {&metrics_, &ranks_})
    for (const std::string& p : t->problems()) problems.push_back(p);
  return {{"dir", dir_},
          {"metrics", thinned(metrics_.rows(), max_rows)},
          {"metrics_rows", metrics_.rows().size()},
          {"ranks", thinned(ranks_.rows(), max_rows)},
          {"ranks_rows", ranks_.rows().size()},
          {"goodput", goodput_["goodput"]},
          {"goodput_error", goodput_["goodput_error"]},
          {"badput_kinds", badput_kinds()},  // report order (JSON objects come sorted)
          {"problems", problems}};
}

// ---- rank endpoints --------------------------------------------------------------

bool split_http_url(const std::string& url, std::string& origin, std::string& path) {
  size_t scheme_end = 0;
  if (url.rfind("http://", 0) == 0)
    scheme_end = 7;
  else if (url.rfind("https://", 0) == 0)
    scheme_end = 8;
  else
    return false;
  const size_t slash = url.find('/', scheme_end);
  origin = url.substr(0, slash);
  if (origin.size() == scheme_end) return false;  // no host
  path = slash == std::string::npos ? "/metrics" : url.substr(slash);
  return true;
}

RankScraper::RankScraper(std::vector<std::string> urls, double poll_s) : poll_s_(poll_s) {
  for (std::string& u : urls) {
    SourceState s;
    HYP_CHECK(split_http_url(u, s.origin, s.path), "monitor: '{}' is not an http(s) URL", u);
    s.url = std::move(u);
    sources_.push_back(std::move(s));
  }
  if (!sources_.empty()) thread_ = std::thread([this] { run(); });
}

RankScraper::~RankScraper() {
  {
    const std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RankScraper::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    lock.unlock();
    for (size_t i = 0; i < sources_.size(); ++i) scrape(i);  // urls never change
    lock.lock();
    wake_.wait_for(lock, std::chrono::duration<double>(poll_s_), [this] { return stop_; });
  }
}

void RankScraper::scrape(size_t i) {
  const SourceState& s = sources_[i];  // url, origin and path are set once
  httplib::Client client(s.origin);
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(5, 0);
  std::string error;
  if (auto res = client.Get(s.path.c_str())) {
    if (res->status != 200) {
      error = fmt::format("HTTP {}", res->status);
    } else {
      try {
        ingest(i, res->body);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
  } else {
    error = "no answer (" + httplib::to_string(res.error()) + ")";
  }
  const std::lock_guard lock(mutex_);
  SourceState& st = sources_[i];
  if (error.empty()) {
    if (!st.error.empty()) log_info("monitor: {} answers again", st.url);
    ++st.ok;
  } else {
    if (error != st.error) log_warn("monitor: scrape of {} failed: {}", st.url, error);
    ++st.failed;
  }
  st.error = error;
}

void RankScraper::ingest(size_t url_index, const std::string& exposition) {
  const std::vector<PrometheusSample> samples = parse_prometheus_text(exposition);
  // Per rank label: its step, host, job and the gauges of this scrape.
  struct Scraped {
    double step = -1;
    bool has_step = false;
    std::string job, host;
    std::vector<std::pair<std::string, double>> values;
  };
  std::map<std::string, Scraped> by_rank;
  for (const PrometheusSample& s : samples) {
    if (s.name.rfind("hyperion_", 0) != 0 || (s.type != "gauge" && s.type != "untyped")) continue;
    std::string rank, extra;
    for (const auto& [k, v] : s.labels) {
      if (k == "rank")
        rank = v;
      else if (k != "job" && k != "host")
        extra += fmt::format("{}{}=\"{}\"", extra.empty() ? "" : ",", k, v);
    }
    if (rank.empty()) continue;
    Scraped& r = by_rank[rank];
    r.job = label_value(s, "job");
    r.host = label_value(s, "host");
    if (s.name == "hyperion_train_step" && extra.empty()) {
      r.step = s.value;
      r.has_step = true;
    } else {
      r.values.emplace_back(extra.empty() ? s.name : s.name + "{" + extra + "}", s.value);
    }
  }
  const std::lock_guard lock(mutex_);
  const std::string& url = sources_[url_index].url;
  for (auto& [rank, r] : by_rank) {
    if (!r.has_step) continue;  // nothing to key its values by
    std::string key = rank;
    if (auto it = ranks_.find(key); it != ranks_.end() && it->second.source != url)
      key = rank + "@" + url;  // another endpoint already reports this rank
    RankState& state = ranks_[key];
    state.source = url;
    state.job = r.job;
    state.host = r.host;
    if (r.step <= state.step) continue;  // no step completed since the last scrape
    state.step = r.step;
    for (const auto& [name, value] : r.values) {
      auto& pts = state.points[name];
      if (pts.size() >= kMaxPoints) pts.erase(pts.begin(), pts.begin() + kMaxPoints / 4);
      pts.push_back({r.step, value});
    }
  }
}

json RankScraper::snapshot() const {
  const std::lock_guard lock(mutex_);
  json series = json::object(), ranks = json::object(), scrapes = json::array();
  for (const auto& [key, r] : ranks_) {
    ranks[key] = {{"job", r.job}, {"host", r.host}, {"source", r.source}, {"step", r.step}};
    for (const auto& [name, pts] : r.points) series[name][key] = pts;
  }
  for (const SourceState& s : sources_)
    scrapes.push_back({{"url", s.url},
                       {"ok", s.ok},
                       {"failed", s.failed},
                       {"error", s.error.empty() ? json() : json(s.error)}});
  return {{"series", series}, {"series_ranks", ranks}, {"scrapes", scrapes}};
}

}  // namespace hyperion::monitor
