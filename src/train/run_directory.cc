#include "train/run_directory.h"

#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "io/atomic_file.h"
#include "train/checkpoint.h"
#include "train/checkpoint_files.h"

namespace hyperion {

namespace fs = std::filesystem;

namespace {

std::string timestamp() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

}  // namespace

std::string agree_on_rank0(dist::Communicator& comm, const std::string& value) {
  if (comm.world_size() == 1) return value;
  uint64_t n = value.size();
  comm.broadcast(&n, sizeof n, 0);
  std::string out = comm.rank() == 0 ? value : std::string(n, '\0');
  comm.broadcast(out.data(), n, 0);
  return out;
}

bool is_run_directory(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  // Made before the marker existed: the lock file every training takes first (the lock is
  // used for run directories only).
  return fs::is_regular_file(d / kRunMarker, ec) || fs::is_regular_file(d / ".lock", ec);
}

namespace {

bool is_empty_directory(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::directory_iterator(dir, ec) == fs::directory_iterator();
}

std::string new_run_directory(const TrainConfig& t) {
  const std::string name = t.run_name.empty() ? t.name + "-" + timestamp() : t.run_name;
  const std::string dir = t.base_output_directory + "/" + name;
  std::error_code ec;
  HYP_CHECK(!fs::exists(dir, ec) || is_run_directory(dir) || is_empty_directory(dir),
            "run directory {}: exists and was not made by hyperion train (no {} in it); "
            "hyperion does not write into a directory it did not make: choose another "
            "run_name or base_output_directory",
            dir, kRunMarker);
  return dir;
}

}  // namespace

std::string choose_run_directory(const TrainConfig& t, const std::string& resume) {
  if (resume.empty()) return new_run_directory(t);
  HYP_CHECK(fs::is_directory(resume), "--resume '{}': no such directory", resume);
  if (!has_model_weights(resume)) {
    HYP_CHECK(is_run_directory(resume),
              "--resume '{}': neither a checkpoint (no model.safetensors) nor a run directory "
              "made by hyperion train (no {})",
              resume, kRunMarker);
    return resume;
  }
  // A checkpoint: continue in its run only when it is one of that run's own checkpoints.
  const fs::path ckpt = fs::weakly_canonical(fs::absolute(resume));
  const fs::path parent = ckpt.parent_path();
  int64_t step = 0;
  if (parse_step_name(ckpt.filename().string(), &step) && parent.filename() == "checkpoints" &&
      is_run_directory(parent.parent_path().string()))
    return parent.parent_path().string();
  // A new directory, never an existing run's: the checkpoint's saved run_name may name the
  // run it was copied from.
  TrainConfig fresh = t;
  const std::string named = t.base_output_directory + "/" + t.run_name;
  if (t.run_name.empty() || (fs::exists(named) && !is_empty_directory(named))) {
    fresh.run_name = fmt::format("{}-{}", t.run_name.empty() ? t.name : t.run_name, timestamp());
    HYP_CHECK(!fs::exists(t.base_output_directory + "/" + fresh.run_name),
              "--resume '{}': the new run directory {}/{} exists already; try again, or choose "
              "a run_name",
              resume, t.base_output_directory, fresh.run_name);
  }
  const std::string dir = new_run_directory(fresh);
  log_info(
      "resume: {} is not a checkpoint of a hyperion run directory (RUN/checkpoints/STEP); "
      "continuing from it in the run directory {}",
      resume, dir);
  return dir;
}

namespace {

// Every rank must see the directory rank 0 made (checkpoints, logs and the lock live
// there): rank 0 writes a fresh token into it, and each rank reads it back by the same
// path. A host that does not share the directory is named before the first step.
void check_shared_directory(dist::Communicator& comm, const std::string& dir) {
  const std::string path = dir + "/.shared-check";
  const std::string token = agree_on_rank0(
      comm, comm.rank() == 0 ? fmt::format("{}-{}-{}", dist::this_host_name(), ::getpid(),
                                            std::chrono::steady_clock::now().time_since_epoch().count())
                             : "");
  if (comm.rank() == 0) io::write_file_atomic(path, token);
  comm.barrier();
  std::string seen;
  try {
    seen = io::read_file(path);
  } catch (const std::exception&) {
  }
  std::vector<int32_t> ok(static_cast<size_t>(comm.world_size()), 0);
  ok[static_cast<size_t>(comm.rank())] = seen == token ? 1 : 0;
  comm.all_gather(&ok[static_cast<size_t>(comm.rank())], ok.data(), sizeof(int32_t));
  std::string blind;
  for (int r = 0; r < comm.world_size(); ++r)
    if (!ok[static_cast<size_t>(r)])
      blind += fmt::format("{}{}", blind.empty() ? "" : ", ", dist::rank_and_host(comm, r));
  comm.barrier();
  if (comm.rank() == 0) fs::remove(path);
  HYP_CHECK(blind.empty(),
            "run directory {} is not shared: {} cannot see what rank 0 (host {}) wrote there. "
            "Every host must see the run directory at the same path (a shared filesystem: "
            "checkpoints, logs and the run's lock live there; docs/MULTI_HOST.md)",
            dir, blind, comm.host(0));
}

}  // namespace

std::string open_run_directory(const TrainConfig& t, const std::string& resume,
                               dist::Communicator& comm, std::optional<io::DirectoryLock>& lock,
                               bool* created) {
  const int rank = comm.rank(), world = comm.world_size();
  const std::string dir = agree_on_rank0(comm, rank == 0 ? choose_run_directory(t, resume) : "");
  std::error_code ec;
  if (created != nullptr) *created = rank == 0 && !fs::exists(dir, ec) && !ec;
  io::make_directories(dir);
  if (rank == 0) {
    lock.emplace(dir, "run directory");
    if (!lock->previous_holder().empty())
      log_info("run directory {}: took over the lock of {} (no longer running)", dir,
               lock->previous_holder());
    if (!fs::exists(fs::path(dir) / kRunMarker)) {
      nlohmann::ordered_json marker;
      marker["format"] = 1;
      marker["created"] = timestamp();
      marker["model_type"] = t.dlrm_model ? "dlrm" : t.diffusion_model ? "diffusion" : "decoder";
      io::write_file_atomic(dir + "/" + kRunMarker, marker.dump(2) + "\n");
    }
  }
  comm.barrier();
  if (world > 1) {
    check_shared_directory(comm, dir);
    io::make_directories(dir + "/logs");
    set_log_rank(rank, fmt::format("{}/logs/rank-{}.log", dir, rank),
                 rank == 0 ? LogLevel::kDebug : LogLevel::kWarn);
  }
  return dir;
}

}  // namespace hyperion
