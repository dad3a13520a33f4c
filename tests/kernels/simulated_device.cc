#include "simulated_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <mutex>

#include "base/error.h"
#include "kernels/cuda/cuda_backend.h"

namespace hyperion::testing_util {
namespace {

// Every allocation is a page-aligned range of one reserved region, closed (PROT_NONE)
// except while an op runs. One region, so opening and closing it around an op is one
// mprotect each: with a mapping per allocation, the hundreds of a training run cost two
// mprotects (and two TLB shoot-downs) each per op, and a 6-step test took over a minute.
class SimAllocator final : public Allocator {
 public:
  SimAllocator() {
    // As much as the address space gives, up to 64 GiB: ThreadSanitizer's layout leaves
    // no hole that large on some starts, and the tests need a few GiB at most.
    void* p = MAP_FAILED;
    for (reserve_ = size_t{64} << 30; reserve_ >= (size_t{1} << 30); reserve_ /= 2) {
      p = mmap(nullptr, reserve_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p != MAP_FAILED) break;
    }
    HYP_CHECK(p != MAP_FAILED, "simulated device: cannot reserve 1 GiB of address space");
    base_ = static_cast<char*>(p);
  }
  Device device() const override { return Device::kCuda; }
  void* allocate(size_t bytes) override {
    const size_t len = round(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    char* p = nullptr;
    for (auto it = free_.begin(); it != free_.end(); ++it) {  // first fit among freed ranges
      if (it->second < len) continue;
      p = it->first;
      const size_t rest = it->second - len;
      free_.erase(it);
      if (rest > 0) free_[p + len] = rest;
      break;
    }
    if (p == nullptr) {
      HYP_CHECK(len <= reserve_ - top_, "simulated device: cannot map {} bytes ({} of {} GiB in use)",
                bytes, top_ >> 30, reserve_ >> 30);
      p = base_ + top_;
      top_ += len;
      // Past what the last open() opened: open it now if an op is running.
      if (depth_ > 0) mprotect(p, len, PROT_READ | PROT_WRITE);
    }
    live_[p] = len;
    count(static_cast<int64_t>(bytes));
    return p;
  }
  void deallocate(void* ptr, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(static_cast<char*>(ptr));
    if (it == live_.end()) return;
    char* p = it->first;
    size_t len = it->second;
    live_.erase(it);
    madvise(p, len, MADV_DONTNEED);  // the pages go back; a reuse reads zeros, as a new mapping
    // Coalesce with the free neighbours, so freed ranges serve larger requests later.
    auto next = free_.find(p + len);
    if (next != free_.end()) len += next->second, free_.erase(next);
    auto prev = free_.lower_bound(p);
    if (prev != free_.begin() && std::prev(prev)->first + std::prev(prev)->second == p) {
      --prev;
      p = prev->first, len += prev->second;
      free_.erase(prev);
    }
    free_[p] = len;
    count(-static_cast<int64_t>(bytes));
  }
  // Whether [p, p + 1) lies in a live allocation: device memory, not the host's.
  bool owns(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.upper_bound(static_cast<char*>(const_cast<void*>(p)));
    if (it == live_.begin()) return false;
    --it;
    return static_cast<const char*>(p) < it->first + it->second;
  }
  // Opens the region for the duration of an op (nested ops keep it open).
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    if (depth_++ == 0) protect(PROT_READ | PROT_WRITE);
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--depth_ == 0) protect(PROT_NONE);
  }

 private:
  static size_t round(size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return std::max(page, (bytes + page - 1) / page * page);
  }
  void protect(int prot) {
    if (top_ > 0) mprotect(base_, top_, prot);
  }
  std::mutex mu_;
  char* base_ = nullptr;
  size_t reserve_ = 0;               // the region's size: address space only (MAP_NORESERVE)
  size_t top_ = 0;                   // bytes of the region handed out so far
  std::map<char*, size_t> live_;     // allocation -> its length
  std::map<char*, size_t> free_;     // freed range -> its length (below top_)
  int depth_ = 0;
};

SimAllocator& sim_allocator() {
  static SimAllocator* a = new SimAllocator();
  return *a;
}

// A pointer an op was given must be device memory (a host pointer would be an illegal
// address on a GPU); the documented host index arrays are not passed through this.
const void* D(const void* p) {
  HYP_CHECK(p == nullptr || sim_allocator().owns(p),
            "simulated device: an op was given host memory at {} (device memory expected)", p);
  return p;
}
template <typename T>
T* D(T* p) {
  D(static_cast<const void*>(p));
  return p;
}

// A view of "device" memory as the host kernels want it.
TensorView H(const TensorView& v) {
  D(v.data);
  TensorView h = v;
  h.device = Device::kHost;
  return h;
}

const PagedKvCache& cache(const PagedKvCache& c) {
  D(c.k);
  D(c.v);
  D(c.k_scale);
  D(c.v_scale);
  return c;
}

// Step tables live in device memory (they are uploaded once per step).
const PagedStepTables& tables(const PagedStepTables& t) {
  D(t.slots);
  D(t.page_start);
  D(t.lengths);
  D(t.pages);
  return t;
}

class SimBackend final : public KernelBackend {
 public:
  Device device() const override { return Device::kCuda; }
  const char* name() const override { return "simulated"; }
  Allocator& allocator() override { return alloc_; }

  void gemm(const GemmArgs& a) override {
    run([&] {
      D(a.a);
      D(a.b);
      D(a.c);
      D(a.bias);
      D(a.a_scale);
      D(a.b_scale);
      h().gemm(a);
    });
  }
  void rmsnorm_forward(const TensorView& x, const TensorView& w, float eps, const TensorView& y,
                       const TensorView& rstd, float off) override {
    run([&] { h().rmsnorm_forward(H(x), H(w), eps, H(y), H(rstd), off); });
  }
  void rmsnorm_backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                        const TensorView& rstd, const TensorView& dx, const TensorView& dw,
                        bool acc, float off) override {
    run([&] { h().rmsnorm_backward(H(dy), H(x), H(w), H(rstd), H(dx), H(dw), acc, off); });
  }
  void gated_forward(GatedActivation act, const TensorView& g, const TensorView& u,
                     const TensorView& o) override {
    run([&] { h().gated_forward(act, H(g), H(u), H(o)); });
  }
  void gated_backward(GatedActivation act, const TensorView& dh, const TensorView& g,
                      const TensorView& u, const TensorView& dg, const TensorView& du) override {
    run([&] { h().gated_backward(act, H(dh), H(g), H(u), H(dg), H(du)); });
  }
  void rope_forward(const TensorView& x, const TensorView& out, int64_t start,
                    const RopeTable& t) override {
    run([&] { h().rope_forward(H(x), H(out), start, t); });
  }
  void rope_forward(const TensorView& x, const TensorView& out, const TensorView& pos,
                    const RopeTable& t) override {
    run([&] { h().rope_forward(H(x), H(out), H(pos), t); });
  }
  void rope_backward(const TensorView& dy, const TensorView& dx, int64_t start,
                     const RopeTable& t) override {
    run([&] { h().rope_backward(H(dy), H(dx), start, t); });
  }
  void rope_backward(const TensorView& dy, const TensorView& dx, const TensorView& pos,
                     const RopeTable& t) override {
    run([&] { h().rope_backward(H(dy), H(dx), H(pos), t); });
  }
  void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const TensorView& lse,
                         const AttentionParams& w) override {
    run([&] { h().attention_forward(H(q), H(k), H(v), H(out), H(lse), w); });
  }
  void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const TensorView& dout, const TensorView& lse,
                          const TensorView& dq, const TensorView& dk, const TensorView& dv,
                          const AttentionParams& w) override {
    run([&] {
      h().attention_backward(H(q), H(k), H(v), H(out), H(dout), H(lse), H(dq), H(dk), H(dv), w);
    });
  }
  void paged_kv_write(const PagedKvCache& c, const TensorView& k, const TensorView& v,
                      const int64_t* slots) override {
    run([&] { h().paged_kv_write(cache(c), H(k), H(v), slots); });
  }
  void paged_kv_read(const PagedKvCache& c, const int32_t* pages, int64_t len, const TensorView& k,
                     const TensorView& v) override {
    run([&] { h().paged_kv_read(cache(c), pages, len, H(k), H(v)); });
  }
  void paged_attention(const PagedKvCache& c, const TensorView& q, const PagedAttentionRow* rows,
                       const TensorView& out, const PagedAttentionParams& p) override {
    run([&] { h().paged_attention(cache(c), H(q), rows, H(out), p); });
  }
  void quantize_rows(const TensorView& x, const TensorView& q, float* scales) override {
    run([&] { h().quantize_rows(H(x), H(q), D(scales)); });
  }
  void paged_kv_write(const PagedKvCache& c, const TensorView& k, const TensorView& v,
                      const PagedStepTables& t) override {
    run([&] { h().paged_kv_write(cache(c), H(k), H(v), tables(t)); });
  }
  void paged_attention(const PagedKvCache& c, const TensorView& q, const PagedStepTables& t,
                       const TensorView& out, const PagedAttentionParams& p) override {
    run([&] { h().paged_attention(cache(c), H(q), tables(t), H(out), p); });
  }
  void router_topk_forward(const float* logits, int64_t n, int64_t e, int64_t k, bool norm,
                           float* probs, int32_t* experts, float* weights) override {
    run([&] {
      h().router_topk_forward(D(logits), n, e, k, norm, D(probs), D(experts), D(weights));
    });
  }
  void router_topk_backward(const float* probs, const int32_t* experts, const float* weights,
                            const float* dweights, const float* dprobs, int64_t n, int64_t e,
                            int64_t k, bool norm, float* dlogits) override {
    run([&] {
      h().router_topk_backward(D(probs), D(experts), D(weights), D(dweights), D(dprobs), n, e, k,
                               norm, D(dlogits));
    });
  }
  float load_balance_loss(const float* probs, const int32_t* experts, int64_t b, int64_t t,
                          int64_t e, int64_t k, float w, float* dprobs, float ds) override {
    float r = 0;
    run([&] { r = h().load_balance_loss(D(probs), D(experts), b, t, e, k, w, D(dprobs), ds); });
    return r;
  }
  float router_z_loss(const float* logits, int64_t n, int64_t e, float w, float* dlogits,
                      float ds) override {
    float r = 0;
    run([&] { r = h().router_z_loss(D(logits), n, e, w, D(dlogits), ds); });
    return r;
  }
  void moe_gather_rows(const void* src, DType dt, const int32_t* rt, int64_t rows, int64_t d,
                       void* dst) override {
    run([&] { h().moe_gather_rows(D(src), dt, rt, rows, d, D(dst)); });
  }
  void moe_scatter_add_rows(const void* dr, DType dt, const int32_t* pr, int64_t n, int64_t k,
                            int64_t d, float* dsrc) override {
    run([&] { h().moe_scatter_add_rows(D(dr), dt, pr, n, k, d, D(dsrc)); });
  }
  void moe_combine(const void* y, DType dt, const int32_t* pr, const float* w, int64_t n, int64_t k,
                   int64_t d, float* out) override {
    run([&] { h().moe_combine(D(y), dt, pr, D(w), n, k, d, D(out)); });
  }
  void moe_combine_backward(const float* dout, const void* y, DType dt, const int32_t* pr,
                            const int32_t* rt, const float* w, int64_t n, int64_t k, int64_t d,
                            int64_t rows, void* dy, float* dw) override {
    run([&] {
      h().moe_combine_backward(D(dout), D(y), dt, pr, rt, D(w), n, k, d, rows, D(dy), D(dw));
    });
  }
  void grouped_gemm(const TensorView& a, const TensorView& w, std::span<const int64_t> sizes,
                    const TensorView& c, float beta) override {
    run([&] { h().grouped_gemm(H(a), H(w), sizes, H(c), beta); });
  }
  void grouped_gemm_input_grad(const TensorView& dc, const TensorView& w,
                               std::span<const int64_t> sizes, const TensorView& da,
                               float beta) override {
    run([&] { h().grouped_gemm_input_grad(H(dc), H(w), sizes, H(da), beta); });
  }
  void grouped_gemm_weight_grad(const TensorView& a, const TensorView& dc,
                                std::span<const int64_t> sizes, const TensorView& dw) override {
    run([&] { h().grouped_gemm_weight_grad(H(a), H(dc), sizes, H(dw)); });
  }
  void embedding_forward(const TensorView& t, const TensorView& ids, const TensorView& out,
                         float s) override {
    run([&] { h().embedding_forward(H(t), H(ids), H(out), s); });
  }
  void embedding_backward(const TensorView& ids, const TensorView& dout, const TensorView& dt,
                          float s) override {
    run([&] { h().embedding_backward(H(ids), H(dout), H(dt), s); });
  }
  void argmax_rows(const TensorView& x, const TensorView& out) override {
    run([&] { h().argmax_rows(H(x), H(out)); });
  }
  void softcap_forward(const TensorView& x, float cap) override {
    run([&] { h().softcap_forward(H(x), cap); });
  }
  void residual_add(const TensorView& x, const TensorView& y) override {
    run([&] { h().residual_add(H(x), H(y)); });
  }
  void dropout_apply(const TensorView& x, const TensorView& y, float p, uint64_t key,
                     bool accumulate) override {
    run([&] { h().dropout_apply(H(x), H(y), p, key, accumulate); });
  }
  CrossEntropyResult cross_entropy_forward(const TensorView& l, const TensorView& t,
                                           float cap) override {
    CrossEntropyResult r;
    run([&] { r = h().cross_entropy_forward(H(l), H(t), cap); });
    return r;
  }
  CrossEntropyResult cross_entropy_fused(const TensorView& l, const TensorView& t,
                                         const TensorView& d, float dl, float cap) override {
    CrossEntropyResult r;
    run([&] { r = h().cross_entropy_fused(H(l), H(t), H(d), dl, cap); });
    return r;
  }
  void adamw_step(const TensorView& p, const TensorView& g, const TensorView& m,
                  const TensorView& v, const AdamWParams& hp, const TensorView& pb) override {
    run([&] { h().adamw_step(H(p), H(g), H(m), H(v), hp, H(pb)); });
  }
  double global_l2_norm(std::span<const TensorView> bufs) override {
    std::vector<TensorView> hb;
    for (const TensorView& b : bufs) hb.push_back(H(b));
    double r = 0;
    run([&] { r = h().global_l2_norm(hb); });
    return r;
  }
  void scale_buffers(std::span<const TensorView> bufs, float s) override {
    std::vector<TensorView> hb;
    for (const TensorView& b : bufs) hb.push_back(H(b));
    run([&] { h().scale_buffers(hb, s); });
  }
  void conv2d_forward(const Conv2dShape& s, const TensorView& x, const TensorView& w,
                      const TensorView& b, const TensorView& y) override {
    run([&] { h().conv2d_forward(s, H(x), H(w), H(b), H(y)); });
  }
  void conv2d_backward(const Conv2dShape& s, const TensorView& dy, const TensorView& x,
                       const TensorView& w, const TensorView& dx, const TensorView& dw,
                       const TensorView& db) override {
    run([&] { h().conv2d_backward(s, H(dy), H(x), H(w), H(dx), H(dw), H(db)); });
  }
  void group_norm_forward(const GroupNormShape& s, const TensorView& x, const TensorView& g,
                          const TensorView& b, float eps, const TensorView& y,
                          const TensorView& mean, const TensorView& rstd) override {
    run([&] { h().group_norm_forward(s, H(x), H(g), H(b), eps, H(y), H(mean), H(rstd)); });
  }
  void group_norm_backward(const GroupNormShape& s, const TensorView& dy, const TensorView& x,
                           const TensorView& g, const TensorView& mean, const TensorView& rstd,
                           const TensorView& dx, const TensorView& dg,
                           const TensorView& db) override {
    run([&] {
      h().group_norm_backward(s, H(dy), H(x), H(g), H(mean), H(rstd), H(dx), H(dg), H(db));
    });
  }
  void layer_norm_forward(const TensorView& x, const TensorView& g, const TensorView& b,
                          float eps, const TensorView& y, const TensorView& mean,
                          const TensorView& rstd) override {
    run([&] { h().layer_norm_forward(H(x), H(g), H(b), eps, H(y), H(mean), H(rstd)); });
  }
  void layer_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& g,
                           const TensorView& mean, const TensorView& rstd, const TensorView& dx,
                           const TensorView& dg, const TensorView& db) override {
    run([&] {
      h().layer_norm_backward(H(dy), H(x), H(g), H(mean), H(rstd), H(dx), H(dg), H(db));
    });
  }
  void upsample_nearest_forward(const TensorView& x, const TensorView& y) override {
    run([&] { h().upsample_nearest_forward(H(x), H(y)); });
  }
  void upsample_nearest_backward(const TensorView& dy, const TensorView& dx) override {
    run([&] { h().upsample_nearest_backward(H(dy), H(dx)); });
  }
  void timestep_embedding(const TensorView& t, const TimestepEmbeddingParams& p,
                          const TensorView& out) override {
    run([&] { h().timestep_embedding(H(t), p, H(out)); });
  }
  void activation_forward(Activation a, const TensorView& x, const TensorView& y) override {
    run([&] { h().activation_forward(a, H(x), H(y)); });
  }
  void activation_backward(Activation a, const TensorView& dy, const TensorView& x,
                           const TensorView& dx) override {
    run([&] { h().activation_backward(a, H(dy), H(x), H(dx)); });
  }
  void geglu_forward(const TensorView& x, const TensorView& o) override {
    run([&] { h().geglu_forward(H(x), H(o)); });
  }
  void geglu_backward(const TensorView& dh, const TensorView& x, const TensorView& dx) override {
    run([&] { h().geglu_backward(H(dh), H(x), H(dx)); });
  }
  void upload(const void* src, void* dst, size_t bytes) override {
    run([&] { h().copy(src, D(dst), bytes); });
  }
  void download(const void* src, void* dst, size_t bytes) override {
    run([&] { h().copy(D(src), dst, bytes); });
  }
  void synchronize() override {}
  void convert(const void* src, DType sd, void* dst, DType dd, size_t n) override {
    run([&] { h().convert(D(src), sd, D(dst), dd, n); });
  }
  void copy(const void* src, void* dst, size_t bytes) override {
    run([&] { h().copy(D(src), D(dst), bytes); });
  }
  void copy_2d(const void* src, size_t sp, void* dst, size_t dp, size_t row, size_t rows) override {
    run([&] { h().copy_2d(D(src), sp, D(dst), dp, row, rows); });
  }
  void zero(void* dst, size_t bytes) override {
    run([&] { h().zero(D(dst), bytes); });
  }

 private:
  static KernelBackend& h() { return host_backend(); }
  template <typename F>
  void run(F&& f) {
    alloc_.open();
    try {
      f();
    } catch (...) {
      alloc_.close();
      throw;
    }
    alloc_.close();
  }
  SimAllocator& alloc_ = sim_allocator();
};

}  // namespace

KernelBackend* simulated_device() {
  static SimBackend* sim = []() -> SimBackend* {
    if (cuda_backend() != nullptr) return nullptr;  // a real GPU holds Device::kCuda
    auto* s = new SimBackend();  // lives for the process, as registered backends do
    register_backend(s);
    return s;
  }();
  return sim;
}

}  // namespace hyperion::testing_util
