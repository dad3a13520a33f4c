// libFuzzer: the safetensors reader (header JSON, dtypes, shapes, offsets, overflow and
// truncation checks) and read_into every tensor it accepts. Anything but a clean
// hyperion::Error is a bug: a crash, a sanitizer report, or a read past the mapping.
#include <cstdint>
#include <vector>

#include "base/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hyperion;
  fuzz::MemoryFile file(data, size);
  try {
    const io::SafetensorsFile f = io::SafetensorsFile::open(file.path());
    for (const io::SafetensorsTensor& t : f.tensors()) {
      // Accepted tensors lie inside the file, so their size is bounded by the input.
      if (t.shape.numel() > (int64_t{1} << 22)) __builtin_trap();
      std::vector<float> out(static_cast<size_t>(t.shape.numel()));
      try {
        f.read_into(t.name, TensorView(out.data(), DType::kF32, t.shape));
      } catch (const Error&) {
        // A dtype that does not convert to f32 is refused by name.
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
