#include "train/run_directory.h"

#include <unistd.h>

#include <ctime>
#include <filesystem>

#include "base/error.h"
#include "base/log.h"
#include "io/atomic_file.h"
#include "train/checkpoint.h"

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

std::string open_run_directory(const TrainConfig& t, const std::string& resume,
                               dist::Communicator& comm, std::optional<io::DirectoryLock>& lock) {
  std::string run_dir;
  if (!resume.empty()) {
    HYP_CHECK(fs::is_directory(resume), "--resume '{}': no such directory", resume);
    run_dir =
        has_model_weights(resume) ? fs::path(resume).parent_path().parent_path().string() : resume;
  } else {
    const std::string name = t.run_name.empty() ? t.name + "-" + timestamp() : t.run_name;
    run_dir = t.base_output_directory + "/" + name;
  }
  const std::string dir = agree_on_rank0(comm, run_dir);
  io::make_directories(dir);
  const int rank = comm.rank(), world = comm.world_size();
  if (rank == 0) {
    lock.emplace(dir, "run directory");
    if (!lock->previous_holder().empty())
      log_info("run directory {}: took over the lock of {} (no longer running)", dir,
               lock->previous_holder());
  }
  if (world > 1) {
    io::make_directories(dir + "/logs");
    set_log_rank(rank, fmt::format("{}/logs/rank-{}.log", dir, rank),
                 rank == 0 ? LogLevel::kDebug : LogLevel::kWarn);
  }
  return dir;
}

}  // namespace hyperion
