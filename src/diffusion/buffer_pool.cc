#include "diffusion/buffer_pool.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "base/aligned.h"
#include "base/error.h"
#include "kernels/backend.h"

namespace hyperion::diffusion {
namespace {

struct Pool {
  std::mutex mutex;
  std::multimap<size_t, float*> free;  // by element count
  size_t bytes = 0;
  size_t live = 0, peak = 0;  // bytes handed out and not yet given back
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: buffers may be released at exit
  return *p;
}

thread_local KernelBackend* t_placement = nullptr;  // null: the host

// One device's pool: freed blocks by element count, at most kPoolBytes kept.
struct DevicePool {
  std::mutex mutex;
  std::multimap<size_t, float*> free;
  size_t bytes = 0;
};

DevicePool& device_pool(KernelBackend* backend) {
  static std::mutex mu;
  static auto* pools = new std::map<KernelBackend*, DevicePool*>();  // never destroyed, as above
  std::lock_guard<std::mutex> lock(mu);
  DevicePool*& p = (*pools)[backend];
  if (p == nullptr) p = new DevicePool();
  return *p;
}

float* device_acquire(KernelBackend* backend, size_t n) {
  if (n == 0) return nullptr;
  DevicePool& p = device_pool(backend);
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    auto it = p.free.find(n);
    if (it != p.free.end()) {
      float* b = it->second;
      p.free.erase(it);
      p.bytes -= n * sizeof(float);
      return b;
    }
  }
  return static_cast<float*>(backend->allocator().allocate(n * sizeof(float)));
}

void device_give_back(KernelBackend* backend, float* b, size_t n) {
  if (b == nullptr) return;
  DevicePool& p = device_pool(backend);
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    if (p.bytes + n * sizeof(float) <= kPoolBytes) {
      p.free.emplace(n, b);
      p.bytes += n * sizeof(float);
      return;
    }
  }
  backend->allocator().deallocate(b, n * sizeof(float));
}

float* acquire(size_t n) {
  if (n == 0) return nullptr;
  Pool& p = pool();
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    p.live += n * sizeof(float);
    p.peak = std::max(p.peak, p.live);
    auto it = p.free.find(n);
    if (it != p.free.end()) {
      float* b = it->second;
      p.free.erase(it);
      p.bytes -= n * sizeof(float);
      return b;
    }
  }
  return static_cast<float*>(aligned_malloc(n * sizeof(float)));
}

void give_back(float* b, size_t n) {
  if (b == nullptr) return;
  Pool& p = pool();
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    p.live -= n * sizeof(float);
    if (p.bytes + n * sizeof(float) <= kPoolBytes) {
      p.free.emplace(n, b);
      p.bytes += n * sizeof(float);
      return;
    }
  }
  aligned_free(b);
}

}  // namespace

DeviceScope::DeviceScope(Device device) : previous_(t_placement) {
  t_placement = device == Device::kHost ? nullptr : &backend_for(device);
}

DeviceScope::~DeviceScope() {
  t_placement = previous_;
}

Device current_buffer_device() {
  return t_placement ? t_placement->device() : Device::kHost;
}

size_t live_bytes() {
  std::lock_guard<std::mutex> lock(pool().mutex);
  return pool().live;
}

size_t peak_live_bytes() {
  std::lock_guard<std::mutex> lock(pool().mutex);
  return pool().peak;
}

void reset_peak_live_bytes() {
  std::lock_guard<std::mutex> lock(pool().mutex);
  pool().peak = pool().live;
}

size_t pooled_bytes() {
  std::lock_guard<std::mutex> lock(pool().mutex);
  return pool().bytes;
}

FloatBuffer::FloatBuffer(size_t n) : size_(n), backend_(t_placement) {
  data_ = backend_ ? device_acquire(backend_, n) : acquire(n);
}

FloatBuffer::FloatBuffer(size_t n, float value) : FloatBuffer(n) {
  if (backend_ == nullptr) {
    std::fill(begin(), end(), value);
    return;
  }
  HYP_CHECK(value == 0.0f, "diffusion buffer: filling device memory with {} (only zeros)", value);
  if (n > 0) backend_->zero(data_, n * sizeof(float));
}

FloatBuffer::FloatBuffer(const FloatBuffer& o) : size_(o.size_), backend_(o.backend_) {
  data_ = backend_ ? device_acquire(backend_, size_) : acquire(size_);
  if (size_ == 0) return;
  if (backend_) backend_->copy(o.data_, data_, size_ * sizeof(float));
  else std::memcpy(data_, o.data_, size_ * sizeof(float));
}

FloatBuffer& FloatBuffer::operator=(const FloatBuffer& o) {
  if (this != &o) {
    FloatBuffer copy(o);
    *this = std::move(copy);
  }
  return *this;
}

FloatBuffer& FloatBuffer::operator=(FloatBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    size_ = o.size_;
    backend_ = o.backend_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void FloatBuffer::release() {
  if (backend_) device_give_back(backend_, data_, size_);
  else give_back(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

Device FloatBuffer::device() const {
  return backend_ ? backend_->device() : Device::kHost;
}

KernelBackend& FloatBuffer::backend() const {
  return backend_ ? *backend_ : host_backend();
}

}  // namespace hyperion::diffusion
