#include "base/system_memory.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
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

TEST(SystemMemory, ByteArithmeticSaturatesAndASaturatedCountIsRefused) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(sat_mul(int64_t{1} << 40, int64_t{1} << 20), int64_t{1} << 60);
  EXPECT_EQ(sat_mul(int64_t{1} << 40, int64_t{1} << 30), max);
  EXPECT_EQ(sat_mul(sat_mul(int64_t{1} << 62, 4), 0), 0);
  EXPECT_EQ(sat_add(max - 1, 1), max);
  EXPECT_EQ(sat_add(max, 1), max);
  EXPECT_EQ(sat_add(2, 3), 5);
  ScopedLimit l("1T");
  for (const int64_t bytes : {max, int64_t{-5}}) {
    try {
      check_fits_in_memory(bytes, "training x", "set per_device_batch_size=");
      ADD_FAILURE() << "no error for " << bytes;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("training x needs more bytes than a 64-bit count holds but this machine "
                       "has 1024.0 GiB; set per_device_batch_size="),
                std::string::npos)
          << m;
    }
  }
  {
    ScopedLimit huge("1e30");  // clamped, not undefined
    EXPECT_GT(machine_memory_bytes(), int64_t{1} << 62);
  }
}

}  // namespace
}  // namespace hyperion
