// For an event that may repeat every step (a skipped update): logged at its 1st, 2nd,
// 4th, 8th... occurrence, so a run that meets it every step writes about log2(steps)
// lines, not one a step, and each line can say how many there have been. (OncePerChange,
// base/log.h, is for a problem that stays the same between passes.)
#pragma once

#include <cstdint>

namespace hyperion {

class PowersOfTwo {
 public:
  // Counts one occurrence; true when this one is to be logged.
  bool operator()() {
    ++count_;
    return (count_ & (count_ - 1)) == 0;
  }
  int64_t count() const { return count_; }

 private:
  int64_t count_ = 0;
};

}  // namespace hyperion
