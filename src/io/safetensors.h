// Hugging Face safetensors: an 8-byte little-endian u64 header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// (padded with spaces to a multiple of 8), then the data region. Offsets are relative to
// the data region; tensor data is row-major and little-endian.
//
// Supported dtype strings: F32, BF16, F16, F8_E4M3, F8_E5M2, I8, U8, I32 (hyperion's
// DTypes). Anything else is rejected when the file is opened.
#pragma once

#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/atomic_file.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace hyperion::io {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  // Points into the mapped file (reader) or the caller's buffer (writer). Only the start
  // of the data region is 64-byte aligned: tensors are packed back to back (holes between
  // tensors are not allowed by the format's reference implementation), so a tensor
  // following one of odd byte size may be misaligned for its dtype.
  const void* data = nullptr;
  size_t nbytes = 0;
};

std::string_view safetensors_dtype_name(DType dtype);  // "F32", "BF16", ...

// Collects tensors and metadata, then writes them in one go. The data pointers must stay
// valid until write() returns; write() streams them to the file without copying.
class SafetensorsWriter {
 public:
  // Throws on a duplicate or empty name, or the reserved name "__metadata__".
  void add(std::string name, DType dtype, Shape shape, const void* data);
  void set_metadata(std::string key, std::string value);
  // Atomic (temp file + fsync + rename). Tensors are laid out in the order added; the
  // header is padded so that the data region starts at a 64-byte file offset.
  void write(const std::string& path) const;

  size_t size() const { return tensors_.size(); }

 private:
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Read-only, memory-mapped view of a safetensors file, validated completely on open.
// Movable; tensor data pointers stay valid for the lifetime of the (moved-to) object.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  // In file (data offset) order.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;
  // Throws naming the file and the tensor, listing a few of the available names.
  const SafetensorsTensor& get(const std::string& name) const;
  // Copies tensor `name` into `dst` (contiguous, same shape). Converts f32/bf16/f16 to
  // f32 or bf16 (RNE); any other pair is allowed only when the dtypes are equal. Throws
  // naming the file, the tensor and both shapes/dtypes on mismatch.
  void read_into(const std::string& name, const TensorView& dst) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  size_t file_size() const { return map_.size(); }

 private:
  SafetensorsFile() = default;

  std::string path_;
  MappedFile map_;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace hyperion::io
