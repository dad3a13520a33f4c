// Exclusive use of a directory by one process (a training run's directory): an flock on
// DIR/.lock, which also records the holder's pid, host and start time. The kernel drops
// the lock when the holder exits, however it exits, so a lock left behind by a killed
// run is never stale: the next run takes it over and says whose it was.
#pragma once

#include <string>

namespace hyperion::io {

class DirectoryLock {
 public:
  // Takes the lock, creating DIR/.lock. Throws hyperion::Error naming the directory and
  // the holder ("pid 1234 on host h since 2026-11-23 10:00:00") when another process
  // holds it. `what` names the directory's use in messages ("run directory").
  DirectoryLock(const std::string& dir, const std::string& what);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  // The holder recorded before this process took the lock ("" when there was none): a
  // lock left by a process that has since ended.
  const std::string& previous_holder() const { return previous_; }

 private:
  int fd_ = -1;
  std::string previous_;
};

}  // namespace hyperion::io
