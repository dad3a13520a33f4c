// Where memory lives, and the interface every large buffer is allocated through:
// parameters, gradients, optimizer state and activations. The host allocator serves
// them today; a GPU backend brings a device allocator, and code that allocates through
// this interface (ParamStore, the models) does not change.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace hyperion {

enum class Device : uint8_t { kHost, kCuda };
const char* device_name(Device d);  // "host", "cuda"

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // `bytes` of uninitialised memory, aligned to kAlignment (64); throws hyperion::Error
  // naming the allocator and the size when it cannot.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;

  // Bytes currently allocated through this allocator, and the most at any time.
  int64_t bytes_in_use() const { return in_use_.load(std::memory_order_relaxed); }
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }

 protected:
  void count(int64_t delta);

 private:
  std::atomic<int64_t> in_use_{0}, peak_{0};
};

// Host memory: 64-byte aligned (one cache line, one AVX-512 register).
class HostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::kHost; }
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
};

// The process's host allocator.
Allocator& host_allocator();

// An owning buffer of one allocator's memory. Moves, never copies.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Allocator& alloc, size_t bytes)
      : alloc_(&alloc), data_(bytes > 0 ? alloc.allocate(bytes) : nullptr), bytes_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      alloc_ = std::exchange(o.alloc_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }
  Device device() const { return alloc_ != nullptr ? alloc_->device() : Device::kHost; }

 private:
  void reset() {
    if (data_ != nullptr) alloc_->deallocate(data_, bytes_);
    data_ = nullptr;
    bytes_ = 0;
  }
  Allocator* alloc_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace hyperion
