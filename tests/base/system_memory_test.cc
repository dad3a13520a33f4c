#include "base/system_memory.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "base/error.h"

namespace hyperion {
namespace {

// Sets HYPERION_MEMORY_LIMIT for one scope.
struct ScopedLimit {
  explicit ScopedLimit(const char* v) { setenv("HYPERION_MEMORY_LIMIT", v, 1); }
  ~ScopedLimit() { unsetenv("HYPERION_MEMORY_LIMIT"); }
};

TEST(SystemMemory, MachineMemoryIsPositiveAndTheOverrideParses) {
  EXPECT_GT(machine_memory_bytes(), int64_t{64} << 20);
  {
    ScopedLimit l("3G");
    EXPECT_EQ(machine_memory_bytes(), int64_t{3} << 30);
  }
  {
    ScopedLimit l("1536");
    EXPECT_EQ(machine_memory_bytes(), 1536);
  }
  {
    ScopedLimit l("lots");
    EXPECT_THROW(machine_memory_bytes(), Error);
  }
}

TEST(SystemMemory, CheckNamesWhatNeedsTheBytesAndTheHint) {
  ScopedLimit l("1M");
  check_fits_in_memory(int64_t{1} << 20, "exactly the limit", "");
  try {
    check_fits_in_memory(int64_t{3} << 30, "the KV cache", "set kv_pages=");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the KV cache needs 3.0 GiB (3221225472 bytes) but this machine has 1.0 MiB; "
                     "set kv_pages="),
              std::string::npos)
        << m;
  }
  EXPECT_EQ(format_bytes(512), "0.5 KiB");
  EXPECT_EQ(format_bytes(int64_t{5} << 20), "5.0 MiB");
}

}  // namespace
}  // namespace hyperion
