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

// Freed blocks by element count, at most kPoolBytes kept, over one memory: the host's
// (aligned_malloc; the live and peak bytes counted) or one device backend's allocator.
struct Pool {
  KernelBackend* backend = nullptr;  // null: the host
  std::mutex mutex;
  std::multimap<size_t, float*> free;
  size_t bytes = 0;
  size_t live = 0, peak = 0;  // bytes handed out and not yet given back

  float* acquire(size_t n) {
    if (n == 0) return nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex);
      live += n * sizeof(float);
      peak = std::max(peak, live);
      auto it = free.find(n);
      if (it != free.end()) {
        float* b = it->second;
        free.erase(it);
        bytes -= n * sizeof(float);
        return b;
      }
    }
    void* p = backend ? backend->allocator().allocate(n * sizeof(float)) : aligned_malloc(n * sizeof(float));
    return static_cast<float*>(p);
  }

  void give_back(float* b, size_t n) {
    if (b == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mutex);
      live -= n * sizeof(float);
      if (bytes + n * sizeof(float) <= kPoolBytes) {
        free.emplace(n, b);
        bytes += n * sizeof(float);
        return;
      }
    }
    if (backend) backend->allocator().deallocate(b, n * sizeof(float));
    else aligned_free(b);
  }
};

// Never destroyed: buffers may be released at exit.
Pool& pool_of(KernelBackend* backend) {
  static Pool* host = new Pool();
  if (backend == nullptr) return *host;
  static std::mutex mu;
  static auto* devices = new std::map<KernelBackend*, Pool*>();
  std::lock_guard<std::mutex> lock(mu);
  Pool*& p = (*devices)[backend];
  if (p == nullptr) {
    p = new Pool();
    p->backend = backend;
  }
  return *p;
}

Pool& pool() {
  return pool_of(nullptr);
}

thread_local KernelBackend* t_placement = nullptr;  // null: the host

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

FloatBuffer::FloatBuffer(size_t n) : data_(pool_of(t_placement).acquire(n)), size_(n), backend_(t_placement) {}

FloatBuffer::FloatBuffer(size_t n, float value) : FloatBuffer(n) {
  if (backend_ == nullptr) {
    std::fill(begin(), end(), value);
    return;
  }
  HYP_CHECK(value == 0.0f, "diffusion buffer: filling device memory with {} (only zeros)", value);
  if (n > 0) backend_->zero(data_, n * sizeof(float));
}

FloatBuffer::FloatBuffer(const FloatBuffer& o)
    : data_(pool_of(o.backend_).acquire(o.size_)), size_(o.size_), backend_(o.backend_) {
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
  pool_of(backend_).give_back(data_, size_);
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
