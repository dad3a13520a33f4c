// What `hyperion monitor`'s page draws, gathered from its two kinds of source:
//
// - a run directory (monitor/run_files.h): metrics.jsonl and ranks.jsonl read as they
//   grow (only the bytes appended since the last read are parsed; a file replaced or
//   shortened, as a resumed run's metrics.jsonl is, is read again from the start), and
//   goodput from events.jsonl (monitor/goodput.h), recomputed when the file changes;
// - a rank's Prometheus endpoint (monitor/metrics_exporter.h), scraped on a background
//   thread: every gauge named hyperion_* with a `rank` label becomes a series of that
//   rank, keyed by the rank's hyperion_train_step at the scrape (a scrape whose step did
//   not advance adds nothing, so a stalled rank's line stops rather than repeating).
//
// Both hand out JSON (the shapes below) for the page's /api/data; both are safe to call
// from several HTTP threads at once.
#pragma once

#include <array>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace hyperion::monitor {

// Rows of a JSON-lines file, read incrementally. A last line without its newline is
// still being written: it is left for the next read, silently. Another line that is not
// a JSON object is skipped and named in problems().
class JsonlTail {
 public:
  explicit JsonlTail(std::string path) : path_(std::move(path)) {}
  // Reads what was appended since the last call (everything after a replacement).
  void update();
  const nlohmann::json& rows() const { return rows_; }
  // "metrics.jsonl line 7: not a JSON object", "cannot read ...: permission denied".
  std::vector<std::string> problems() const;

 private:
  void reset();

  std::string path_;
  unsigned long long inode_ = 0;
  long long offset_ = 0;  // bytes consumed: the start of the first unread line
  long long lines_ = 0;
  nlohmann::json rows_ = nlohmann::json::array();
  std::vector<std::string> bad_lines_;  // at most a few, then a count
  long long more_bad_lines_ = 0;
  std::string read_error_;
};

class RunDirReader {
 public:
  explicit RunDirReader(std::string dir);
  // {"dir": d, "metrics": [rows], "metrics_rows": n, "ranks": [rows], "ranks_rows": n,
  //  "goodput": goodput_json object | null, "goodput_error": text | null,
  //  "badput_kinds": [kind, ...] (report order), "problems": [text, ...]}
  // At most max_rows rows of each file: evenly thinned, the last row always kept
  // (*_rows counts them all).
  nlohmann::json read(size_t max_rows);

 private:
  std::mutex mutex_;
  std::string dir_;
  JsonlTail metrics_, ranks_;
  std::string events_key_;  // events.jsonl's inode, size and time at the last goodput
  nlohmann::json goodput_;  // {"goodput": ..., "goodput_error": ...} for events_key_
};

class RankScraper {
 public:
  // Each URL is http(s)://HOST:PORT[/PATH] (PATH defaults to /metrics). Scrapes each
  // every poll_s seconds on a thread of its own; a failed scrape is reported in
  // snapshot()'s "scrapes" and logged once until it succeeds again.
  RankScraper(std::vector<std::string> urls, double poll_s);
  ~RankScraper();  // stops the thread
  RankScraper(const RankScraper&) = delete;
  RankScraper& operator=(const RankScraper&) = delete;

  // {"series": {"<metric>": {"<rank>": [[step, value], ...]}},
  //  "series_ranks": {"<rank>": {"job": j, "host": h, "source": url, "step": s}},
  //  "scrapes": [{"url": u, "ok": n, "failed": n, "error": text | null}]}
  // <metric> is the gauge's name, with its other labels (not job, rank, host) appended
  // as {k="v",...}; <rank> is the rank label, or "R@URL" when two URLs report rank R.
  nlohmann::json snapshot() const;
  // Parses one scrape of url_index's endpoint (public for tests).
  void ingest(size_t url_index, const std::string& exposition);

 private:
  struct RankState {
    std::string job, host, source;
    double step = -1;
    std::map<std::string, std::vector<std::array<double, 2>>> points;
  };
  struct SourceState {
    std::string url, origin, path, error;
    long long ok = 0, failed = 0;
  };
  void run();
  void scrape(size_t url_index);

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  double poll_s_;
  std::vector<SourceState> sources_;
  std::map<std::string, RankState> ranks_;
  std::thread thread_;
};

// Splits an http(s) URL into origin ("http://h:p") and path ("/metrics" when none);
// false when it is not http:// or https:// with a host.
bool split_http_url(const std::string& url, std::string& origin, std::string& path);

}  // namespace hyperion::monitor
