// The parameters of one diffusion component (a UNet, a VAE, a text encoder): named f32
// tensors, with diffusers' / transformers' names and shapes, in one flat buffer (and one
// flat gradient buffer when training), so an optimizer, a gradient reduction or a
// checkpoint sees one contiguous range. A model declares its tensors while it builds
// itself from its config (add), then allocates once.
//
// Mixed precision (set_bf16_compute): the matmul weights (those declared keep_bf16: a
// linear layer's, a 1x1 convolution's) get a bf16 copy that the GEMMs read, as
// torch.autocast casts them; the f32 values stay the master (optimizer, checkpoints,
// norms, convolutions, which round their weights as oneDNN reorders them). The copy is
// refreshed lazily: a load, an init, every non-const all() (the optimizer's, the EMA's, a
// checkpoint's restore) and mark_written() count as writes, and the next data_bf16()
// converts again. Code writing one tensor through data(i) calls mark_written() after.
// The refresh runs on the calling thread; a table is not shared between threads while it
// is written.
//
// A table can move to a device (to_device: inference there, generation and serving): its
// values, and the bf16 copy under mixed precision, then live in that backend's memory,
// data(i) and data_bf16(i) point there, and the host copy is released. Loading, saving,
// initialising and training need the values on the host (they refuse a device table by
// name).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/allocator.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace hyperion::io {
class WeightFiles;
}

namespace hyperion::diffusion {

struct ParamEntry {
  std::string name;
  Shape shape;
  int64_t offset = 0, numel = 0;
  int64_t bf16_offset = -1;  // into the bf16 copy (keep_bf16 tensors only)
  // How a fresh model initialises it: weights normal(0, std) (fan-in scaled), norms' gains 1,
  // biases and norms' shifts 0.
  enum class Init : uint8_t { kWeight, kOne, kZero } init = Init::kWeight;
};

class ParamTable {
 public:
  // Declares a tensor (before allocate); returns its index. Names are unique.
  int add(const std::string& name, Shape shape, ParamEntry::Init init = ParamEntry::Init::kWeight);
  // Marks tensor i (declared, not yet allocated) as a matmul weight read in bf16 under
  // mixed precision.
  void keep_bf16(int i);
  void allocate(bool with_grads);
  // Adds (zeroed) or frees the gradient buffer, keeping the values.
  void set_grads(bool with_grads);
  bool allocated() const { return !data_.empty() || !device_values_.empty(); }
  // Moves the values (and the bf16 copy) to `device`'s memory, or back to the host. No
  // gradients (a device table is for inference).
  void to_device(Device device);
  Device device() const { return device_; }

  const std::vector<ParamEntry>& entries() const { return entries_; }
  int find(const std::string& name) const;  // -1 when absent
  int64_t size() const { return size_; }
  // Writable values: host tables only.
  float* data(int i) {
    require_host("writing a parameter");
    return data_.data() + entries_[size_t(i)].offset;
  }
  const float* data(int i) const { return values() + entries_[size_t(i)].offset; }
  float* grad(int i) { return grads_.data() + entries_[size_t(i)].offset; }
  float* all() {  // counts as a write (the bf16 copy is refreshed before its next use)
    require_host("writing the parameters");
    ++version_;
    return data_.data();
  }
  const float* all() const { return values(); }

  // Mixed precision on or off (the copy is allocated or freed). On, tensor i's bf16 copy
  // (i must be keep_bf16), converted again first when the values changed since.
  void set_bf16_compute(bool on);
  void mark_written() { ++version_; }
  bool bf16_compute() const { return bf16_on_; }
  const bf16* data_bf16(int i) const;
  int64_t bf16_size() const { return bf16_size_; }  // elements in the copy
  float* all_grads() { return grads_.data(); }
  bool has_grads() const { return !grads_.empty(); }
  void zero_grads();

  // Fan-in-scaled normal weights (std 1 / sqrt(fan_in), fan_in = numel / shape[0]), gains
  // 1, shifts 0; the stream depends on the seed and each tensor's name only.
  void init(uint64_t seed);

  // Reads every declared tensor `prefix + name` from the files (f32, f16 or bf16, read as
  // f32). A missing tensor, a shape that differs (a 1x1 convolution's [O, I, 1, 1] stands
  // for a linear layer's [O, I]) or a non-finite value is an error naming `origin` and the
  // tensor; tensors of the files the model does not use are returned (the caller warns),
  // except those in `ignored`.
  std::vector<std::string> load(const io::WeightFiles& files, const std::string& origin,
                                const std::string& prefix = "",
                                const std::vector<std::string>& ignored = {});
  // The same with each tensor's file name given by `name_of(declared name)` (a single-file
  // checkpoint's original names); the unused tensors returned are those starting with
  // `unused_prefix`.
  std::vector<std::string> load_mapped(const io::WeightFiles& files, const std::string& origin,
                                       const std::function<std::string(const std::string&)>& name_of,
                                       const std::string& unused_prefix);
  // Writes every tensor (f32) to a safetensors file, atomically, names prefixed.
  void save(const std::string& path, const std::string& prefix = "") const;

 private:
  const float* values() const {
    return device_ == Device::kHost ? data_.data() : device_values_.as<float>();
  }
  void require_host(const char* what) const;
  std::vector<ParamEntry> entries_;
  std::unordered_map<std::string, int> index_;
  int64_t size_ = 0, bf16_size_ = 0;
  std::vector<float> data_, grads_;
  bool bf16_on_ = false;
  uint64_t version_ = 1;  // bumped by every (possible) write of the values
  mutable uint64_t bf16_version_ = 0;
  mutable std::vector<bf16> bf16_;
  Device device_ = Device::kHost;
  DeviceBuffer device_values_;          // the values on device_ (not the host)
  mutable DeviceBuffer device_bf16_;    // the bf16 copy there, under mixed precision
};

}  // namespace hyperion::diffusion
