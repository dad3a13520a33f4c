#include "diffusion/buffer_pool.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "base/aligned.h"

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

FloatBuffer::FloatBuffer(size_t n) : data_(acquire(n)), size_(n) {}

FloatBuffer::FloatBuffer(size_t n, float value) : FloatBuffer(n) {
  std::fill(begin(), end(), value);
}

FloatBuffer::FloatBuffer(const FloatBuffer& o) : FloatBuffer(o.size_) {
  if (size_) std::memcpy(data_, o.data_, size_ * sizeof(float));
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
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void FloatBuffer::release() {
  give_back(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace hyperion::diffusion
