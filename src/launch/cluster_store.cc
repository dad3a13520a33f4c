#include "launch/cluster_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "io/atomic_file.h"

namespace hyperion::launch {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Absolute: the supervisor runs in / and must find the same store as the command that
// started it (a relative HYPERION_HOME=state would otherwise become /state).
std::string absolute_path(const std::string& p) {
  std::error_code ec;
  const fs::path a = fs::absolute(p, ec);
  return ec ? p : a.lexically_normal().string();
}

}  // namespace

std::string clusters_root() {
  if (const char* h = std::getenv("HYPERION_HOME"); h && *h)
    return absolute_path(std::string(h) + "/clusters");
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x)
    return absolute_path(std::string(x) + "/hyperion/clusters");
  const char* home = std::getenv("HOME");
  HYP_CHECK(home && *home,
            "cluster state: neither HYPERION_HOME, XDG_STATE_HOME nor HOME is set; set "
            "HYPERION_HOME to a directory for hyperion's cluster state");
  return absolute_path(std::string(home) + "/.local/state/hyperion/clusters");
}

ClusterCreateLock::ClusterCreateLock(const std::string& root) {
  io::make_directories(root);
  const std::string path = root + "/.create.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot open {}: {}", path, os_error_text(errno));
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    ::close(fd_);
    fail("cannot lock {}: {}", path, os_error_text(err));
  }
}

ClusterCreateLock::~ClusterCreateLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the lock
}

ClusterStore::ClusterStore(std::string root) : root_(std::move(root)) {}

std::string ClusterStore::cluster_dir(const std::string& cluster) const {
  return root_ + "/" + cluster;
}

std::string ClusterStore::workload_dir(const std::string& cluster,
                                       const std::string& workload) const {
  return cluster_dir(cluster) + "/workloads/" + workload;
}

bool ClusterStore::cluster_exists(const std::string& cluster) const {
  return fs::exists(cluster_dir(cluster) + "/cluster.json");
}

namespace {

std::vector<std::string> subdirs_with(const std::string& dir, const char* file) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && fs::exists(e.path() / file)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

json read_json(const std::string& path) {
  const std::string text = io::read_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON ({}); the file is damaged: remove it or the directory it is in", path,
         e.what());
  }
}

void write_json(const std::string& path, const json& j) {
  io::write_file_atomic(path, j.dump(1) + "\n");
}

template <typename T>
T field(const json& j, const char* key, const std::string& where, T fallback) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    fail("{}: field '{}' has the wrong type ({})", where, key, it->dump());
  }
}

}  // namespace

std::vector<std::string> ClusterStore::clusters() const {
  return subdirs_with(root_, "cluster.json");
}

ClusterSpec ClusterStore::load_cluster(const std::string& cluster) const {
  if (!cluster_exists(cluster)) {
    std::string known;
    for (const std::string& c : clusters()) known += (known.empty() ? "" : ", ") + c;
    usage_fail(
        "no cluster '{}' (in {}); existing: {}; create it with hyperion cluster create "
        "--cluster {}",
        cluster, root_, known.empty() ? "none" : known, cluster);
  }
  const std::string path = cluster_dir(cluster) + "/cluster.json";
  return cluster_from_json(read_json(path), path);
}

void ClusterStore::save_cluster(const ClusterSpec& c) const {
  io::make_directories(cluster_dir(c.name) + "/workloads");
  write_json(cluster_dir(c.name) + "/cluster.json", to_json(c));
}

void ClusterStore::remove_cluster(const std::string& cluster) const {
  std::error_code ec;
  fs::remove_all(cluster_dir(cluster), ec);
  HYP_CHECK(!ec, "cannot remove {}: {}", cluster_dir(cluster), ec.message());
}

std::vector<std::string> ClusterStore::workloads(const std::string& cluster) const {
  return subdirs_with(cluster_dir(cluster) + "/workloads", "spec.json");
}

bool ClusterStore::workload_exists(const std::string& cluster, const std::string& workload) const {
  return fs::exists(workload_dir(cluster, workload) + "/spec.json");
}

WorkloadSpec ClusterStore::load_spec(const std::string& cluster,
                                     const std::string& workload) const {
  HYP_USAGE_CHECK(workload_exists(cluster, workload),
                  "no workload '{}' in cluster '{}' (hyperion workload list --cluster {})",
                  workload, cluster, cluster);
  const std::string path = workload_dir(cluster, workload) + "/spec.json";
  return spec_from_json(read_json(path), path);
}

void ClusterStore::save_spec(const WorkloadSpec& w) const {
  const std::string dir = workload_dir(w.cluster, w.name);
  io::make_directories(dir);
  write_json(dir + "/spec.json", to_json(w));
}

WorkloadStatus ClusterStore::load_status(const std::string& cluster,
                                         const std::string& workload) const {
  const std::string path = workload_dir(cluster, workload) + "/status.json";
  if (!fs::exists(path)) {
    WorkloadStatus s;
    s.reason = "submitted; the supervisor has not looked at it yet";
    return s;
  }
  return status_from_json(read_json(path), path);
}

void ClusterStore::save_status(const std::string& cluster, const std::string& workload,
                               const WorkloadStatus& s) const {
  write_json(workload_dir(cluster, workload) + "/status.json", to_json(s));
}

std::string ClusterStore::output_log(const std::string& cluster,
                                     const std::string& workload) const {
  return workload_dir(cluster, workload) + "/output.log";
}

int64_t ClusterStore::next_sequence(const std::string& cluster) const {
  int64_t last = 0;
  for (const std::string& w : workloads(cluster)) {
    try {
      last = std::max(last, load_spec(cluster, w).sequence);
    } catch (const Error&) {
      // A damaged spec does not stop new submissions; status names it.
    }
  }
  return last + 1;
}

void ClusterStore::request_delete(const std::string& cluster, const std::string& workload,
                                  double grace_s) const {
  write_json(workload_dir(cluster, workload) + "/delete", json{{"grace_s", grace_s}});
}

std::optional<double> ClusterStore::delete_requested(const std::string& cluster,
                                                     const std::string& workload) const {
  const std::string path = workload_dir(cluster, workload) + "/delete";
  if (!fs::exists(path)) return std::nullopt;
  try {
    return field<double>(read_json(path), "grace_s", path, 30.0);
  } catch (const Error&) {
    return 30.0;
  }
}

void ClusterStore::remove_workload(const std::string& cluster, const std::string& workload) const {
  std::error_code ec;
  fs::remove_all(workload_dir(cluster, workload), ec);
  HYP_CHECK(!ec, "cannot remove {}: {}", workload_dir(cluster, workload), ec.message());
}

json to_json(const ClusterSpec& c) {
  return {{"name", c.name},
          {"backend", backend_name(c.backend)},
          {"cores", c.cores},
          {"partition", c.partition},
          {"partition_low", c.partition_low},
          {"partition_high", c.partition_high},
          {"created_partitions", c.created_partitions},
          {"created", c.created}};
}

ClusterSpec cluster_from_json(const json& j, const std::string& where) {
  ClusterSpec c;
  c.name = field<std::string>(j, "name", where, "");
  c.backend = parse_backend(field<std::string>(j, "backend", where, "local"));
  c.cores = field<int>(j, "cores", where, 0);
  c.partition = field<std::string>(j, "partition", where, "");
  c.partition_low = field<std::string>(j, "partition_low", where, "");
  c.partition_high = field<std::string>(j, "partition_high", where, "");
  c.created_partitions = field<std::vector<std::string>>(j, "created_partitions", where, {});
  c.created = field<double>(j, "created", where, 0);
  HYP_CHECK(!c.name.empty(), "{}: no cluster name", where);
  return c;
}

json to_json(const WorkloadSpec& w) {
  json env = json::array();
  for (const auto& [k, v] : w.env) env.push_back({k, v});
  return {{"name", w.name},
          {"cluster", w.cluster},
          {"command", w.command},
          {"workdir", w.workdir},
          {"nproc", w.nproc},
          {"cores_per_rank", w.cores_per_rank},
          {"nodes", w.nodes},
          {"priority", priority_name(w.priority)},
          {"max_restarts", w.max_restarts},
          {"restart_on_exit_codes", w.restart_on_exit_codes},
          {"env", env},
          {"grace_s", w.grace_s},
          {"created", w.created},
          {"sequence", w.sequence}};
}

WorkloadSpec spec_from_json(const json& j, const std::string& where) {
  WorkloadSpec w;
  w.name = field<std::string>(j, "name", where, "");
  w.cluster = field<std::string>(j, "cluster", where, "");
  w.command = field<std::string>(j, "command", where, "");
  w.workdir = field<std::string>(j, "workdir", where, "/");
  w.nproc = field<int>(j, "nproc", where, 1);
  w.cores_per_rank = field<int>(j, "cores_per_rank", where, 1);
  w.nodes = field<int>(j, "nodes", where, 0);
  w.priority = parse_priority(field<std::string>(j, "priority", where, "medium"));
  w.max_restarts = field<int>(j, "max_restarts", where, 0);
  w.restart_on_exit_codes = field<std::vector<int>>(j, "restart_on_exit_codes", where, {});
  for (const auto& kv : field<json>(j, "env", where, json::array()))
    if (kv.is_array() && kv.size() == 2 && kv[0].is_string() && kv[1].is_string())
      w.env.emplace_back(kv[0].get<std::string>(), kv[1].get<std::string>());
  w.grace_s = field<double>(j, "grace_s", where, 30);
  w.created = field<double>(j, "created", where, 0);
  w.sequence = field<int64_t>(j, "sequence", where, 0);
  HYP_CHECK(!w.name.empty() && !w.command.empty() && w.nproc >= 1 && w.cores_per_rank >= 1 &&
                w.nodes >= 0 && w.nodes <= w.nproc,
            "{}: not a workload spec (name, command, nproc >= 1, cores_per_rank >= 1 and "
            "0 <= nodes <= nproc needed)",
            where);
  return w;
}

json to_json(const WorkloadStatus& s) {
  return {{"state", state_name(s.state)},
          {"restarts", s.restarts},
          {"preemptions", s.preemptions},
          {"attempts", s.attempts},
          {"last_exit_code", s.has_exit ? json(s.last_exit_code) : json()},
          {"reason", s.reason},
          {"last_log_lines", s.last_log_lines},
          {"pid", s.pid},
          {"pid_start_ticks", s.pid_start_ticks},
          {"boot_id", s.boot_id},
          {"session_token", s.session_token},
          {"slurm_job_id", s.slurm_job_id},
          {"cpus", s.cpus},
          {"started", s.started},
          {"ended", s.ended},
          {"updated", s.updated},
          {"queue_position", s.queue_position}};
}

WorkloadStatus status_from_json(const json& j, const std::string& where) {
  WorkloadStatus s;
  s.state = parse_state(field<std::string>(j, "state", where, "queued"));
  s.restarts = field<int>(j, "restarts", where, 0);
  s.preemptions = field<int>(j, "preemptions", where, 0);
  s.attempts = field<int>(j, "attempts", where, 0);
  s.has_exit = j.contains("last_exit_code") && j["last_exit_code"].is_number();
  s.last_exit_code = field<int>(j, "last_exit_code", where, 0);
  s.reason = field<std::string>(j, "reason", where, "");
  s.last_log_lines = field<std::vector<std::string>>(j, "last_log_lines", where, {});
  s.pid = field<int64_t>(j, "pid", where, 0);
  s.pid_start_ticks = field<uint64_t>(j, "pid_start_ticks", where, 0);
  s.boot_id = field<std::string>(j, "boot_id", where, "");
  s.session_token = field<std::string>(j, "session_token", where, "");
  s.slurm_job_id = field<std::string>(j, "slurm_job_id", where, "");
  s.cpus = field<std::vector<int>>(j, "cpus", where, {});
  s.started = field<double>(j, "started", where, 0);
  s.ended = field<double>(j, "ended", where, 0);
  s.updated = field<double>(j, "updated", where, 0);
  s.queue_position = field<int>(j, "queue_position", where, 0);
  return s;
}

json status_json(const WorkloadSpec& w, Backend backend, const WorkloadStatus& s) {
  json j = {{"workload", w.name},
            {"cluster", w.cluster},
            {"backend", backend_name(backend)},
            {"state", state_name(s.state)},
            {"restarts", s.restarts},
            {"last_exit_code", s.has_exit ? json(s.last_exit_code) : json()},
            {"reason", s.reason},
            {"queue_position", s.queue_position},
            {"preemptions", s.preemptions},
            {"attempts", s.attempts},
            {"priority", priority_name(w.priority)},
            {"nproc", w.nproc},
            {"nodes", w.nodes},
            {"cores", w.cores()},
            {"max_restarts", w.max_restarts},
            {"command", w.command},
            {"last_log_lines", s.last_log_lines},
            {"pid", s.pid},
            {"cpus", s.cpus},
            {"started", s.started},
            {"ended", s.ended}};
  if (!s.slurm_job_id.empty()) j["slurm_job_id"] = s.slurm_job_id;
  return j;
}

std::vector<std::string> tail_lines(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff window = std::min<std::streamoff>(size, 64 * 1024);
  in.seekg(size - window);
  std::string text(static_cast<size_t>(window), '\0');
  in.read(text.data(), window);
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) lines.push_back(std::move(line));
    start = end + 1;
  }
  if (window < size && !lines.empty()) lines.erase(lines.begin());  // a partial first line
  if (lines.size() > n) lines.erase(lines.begin(), lines.end() - static_cast<std::ptrdiff_t>(n));
  return lines;
}

}  // namespace hyperion::launch
