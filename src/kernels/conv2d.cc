#include "kernels/conv2d.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/aligned.h"
#include "base/cpu.h"
#include "base/error.h"
#include "tensor/convert.h"

namespace hyperion {

void check_conv2d_shape(const Conv2dShape& s) {
  HYP_CHECK(s.batch > 0 && s.height > 0 && s.width > 0, "conv2d: input size {}x{}x{} must be positive",
            s.batch, s.height, s.width);
  HYP_CHECK(s.in_channels > 0 && s.out_channels > 0, "conv2d: channels {} -> {} must be positive",
            s.in_channels, s.out_channels);
  HYP_CHECK(s.kernel > 0 && s.stride > 0 && s.padding >= 0,
            "conv2d: kernel {}, stride {}, padding {} must be positive (padding >= 0)", s.kernel,
            s.stride, s.padding);
  HYP_CHECK(s.height + 2 * s.padding >= s.kernel && s.width + 2 * s.padding >= s.kernel,
            "conv2d: kernel {} is larger than the padded input {}x{} (padding {})", s.kernel,
            s.height, s.width, s.padding);
}

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using dims = dnnl::memory::dims;

struct Key {
  int64_t n, h, w, ci, co, k, s, p;
  bool bias;
  bool bf16;  // bf16 activations and weights (mixed precision), else f32 throughout
  bool operator==(const Key& o) const {
    return n == o.n && h == o.h && w == o.w && ci == o.ci && co == o.co && k == o.k && s == o.s &&
           p == o.p && bias == o.bias && bf16 == o.bf16;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t v : {k.n, k.h, k.w, k.ci, k.co, k.k, k.s, k.p, int64_t(k.bias), int64_t(k.bf16)})
      h = (h ^ size_t(v)) * 1099511628211ull;
    return h;
  }
};

// One shape's primitives. The backward ones are made on first use (inference never
// builds them).
struct Entry {
  // src_md / dst_md: the activations the primitives read (bf16 in mixed precision);
  // out_md: the f32 map the forward writes and the data gradient is written as.
  dnnl::memory::desc src_md, dst_md, out_md, user_w_md, bias_md;
  dt compute = dt::f32;
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  std::once_flag bwd_once;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_w_pd;
  dnnl::convolution_backward_weights bwd_w;
};

struct Backend {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;
  std::unordered_map<Key, std::shared_ptr<Entry>, KeyHash> cache;
};

Backend& backend() {
  static Backend b;
  return b;
}

std::shared_ptr<Entry> entry_for(const Conv2dShape& s, bool bias, bool bf16) {
  check_conv2d_shape(s);
  const Key key{s.batch, s.height, s.width, s.in_channels, s.out_channels, s.kernel, s.stride,
                s.padding, bias, bf16};
  Backend& be = backend();
  std::lock_guard<std::mutex> lock(be.mutex);
  auto it = be.cache.find(key);
  if (it != be.cache.end()) return it->second;
  if (be.cache.size() >= 1024) be.cache.clear();  // bound memory on shape churn
  auto e = std::make_shared<Entry>();
  const dims strides = {s.stride, s.stride}, pad = {s.padding, s.padding};
  e->compute = bf16 ? dt::bf16 : dt::f32;
  const dims src_dims = {s.batch, s.in_channels, s.height, s.width};
  const dims dst_dims = {s.batch, s.out_channels, s.out_height(), s.out_width()};
  e->src_md = dnnl::memory::desc(src_dims, e->compute, tag::nhwc);
  e->dst_md = dnnl::memory::desc(dst_dims, e->compute, tag::nhwc);
  e->out_md = dnnl::memory::desc(dst_dims, dt::f32, tag::nhwc);
  const dims wdims = {s.out_channels, s.in_channels, s.kernel, s.kernel};
  e->user_w_md = dnnl::memory::desc(wdims, dt::f32, tag::oihw);
  e->bias_md = dnnl::memory::desc({s.out_channels}, dt::f32, tag::x);
  const dnnl::memory::desc w_any(wdims, e->compute, tag::any);
  try {
    // The forward reads compute-dtype activations and writes f32 (out_md).
    auto desc = bias ? dnnl::convolution_forward::desc(
                           dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                           e->src_md, w_any, e->bias_md, e->out_md, strides, pad, pad)
                     : dnnl::convolution_forward::desc(
                           dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                           e->src_md, w_any, e->out_md, strides, pad, pad);
    e->fwd_pd = dnnl::convolution_forward::primitive_desc(desc, be.engine);
    e->fwd = dnnl::convolution_forward(e->fwd_pd);
  } catch (const dnnl::error& err) {
    fail("conv2d: oneDNN has no {} convolution for {}x{}x{}x{} -> {} channels, kernel {}, stride {}: {}",
         bf16 ? "bf16" : "f32", s.batch, s.height, s.width, s.in_channels, s.out_channels, s.kernel, s.stride,
         err.what());
  }
  be.cache.emplace(key, e);
  return e;
}

void build_backward(Entry& e, const Conv2dShape& s) {
  std::call_once(e.bwd_once, [&] {
    const dnnl::engine& engine = backend().engine;
    const dims strides = {s.stride, s.stride}, pad = {s.padding, s.padding};
    const dims wdims = {s.out_channels, s.in_channels, s.kernel, s.kernel};
    const dnnl::memory::desc w_any(wdims, e.compute, tag::any), dw_any(wdims, dt::f32, tag::any);
    // The data gradient is written f32 (a map of the input's shape); the weight and bias
    // gradients are f32 whatever the activations' dtype.
    const dnnl::memory::desc dx_md(e.src_md.dims(), dt::f32, tag::nhwc);
    auto data_desc = dnnl::convolution_backward_data::desc(
        dnnl::algorithm::convolution_direct, dx_md, w_any, e.dst_md, strides, pad, pad);
    e.bwd_data_pd = dnnl::convolution_backward_data::primitive_desc(data_desc, engine, e.fwd_pd);
    e.bwd_data = dnnl::convolution_backward_data(e.bwd_data_pd);
    // Always with a bias gradient (cheap: one pass over dy); dropped when not asked for.
    auto w_desc = dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct,
                                                           e.src_md, dw_any, e.bias_md, e.dst_md,
                                                           strides, pad, pad);
    e.bwd_w_pd = dnnl::convolution_backward_weights::primitive_desc(w_desc, engine, e.fwd_pd);
    e.bwd_w = dnnl::convolution_backward_weights(e.bwd_w_pd);
  });
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(backend().engine);
  return stream;
}

// The weights in the layout `want` (a reorder of the user's OIHW array into `buffer`
// when the primitive picked another one).
dnnl::memory weights_in(const dnnl::memory::desc& want, const dnnl::memory::desc& user,
                        const float* w, AlignedBuffer<unsigned char>& buffer) {
  const dnnl::engine& engine = backend().engine;
  dnnl::memory user_mem(user, engine, const_cast<float*>(w));
  if (want == user) return user_mem;
  if (buffer.size() < want.get_size()) buffer = AlignedBuffer<unsigned char>(want.get_size());
  dnnl::memory out(want, engine, buffer.data());
  dnnl::reorder(user_mem, out).execute(thread_stream(), user_mem, out);
  return out;
}

}  // namespace

namespace {

void forward_impl(const Conv2dShape& s, const void* x, bool bf16, const float* w, const float* bias,
                  float* y) {
  std::shared_ptr<Entry> e = entry_for(s, bias != nullptr, bf16);
  const dnnl::engine& engine = backend().engine;
  thread_local AlignedBuffer<unsigned char> wbuf;
  std::unordered_map<int, dnnl::memory> args;
  args.emplace(DNNL_ARG_SRC, dnnl::memory(e->src_md, engine, const_cast<void*>(x)));
  args.emplace(DNNL_ARG_WEIGHTS, weights_in(e->fwd_pd.weights_desc(), e->user_w_md, w, wbuf));
  if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(e->bias_md, engine, const_cast<float*>(bias)));
  args.emplace(DNNL_ARG_DST, dnnl::memory(e->out_md, engine, y));
  e->fwd.execute(thread_stream(), args);
  thread_stream().wait();
}

void backward_impl(const Conv2dShape& s, const void* dy, const void* x, bool bf16, const float* w,
                   float* dx, float* dw, float* dbias) {
  std::shared_ptr<Entry> e = entry_for(s, /*bias=*/false, bf16);
  build_backward(*e, s);
  const dnnl::engine& engine = backend().engine;
  dnnl::stream& stream = thread_stream();
  dnnl::memory dy_mem(e->dst_md, engine, const_cast<void*>(dy));
  if (dx) {
    thread_local AlignedBuffer<unsigned char> wbuf;
    e->bwd_data.execute(
        stream, {{DNNL_ARG_DIFF_DST, dy_mem},
                 {DNNL_ARG_WEIGHTS, weights_in(e->bwd_data_pd.weights_desc(), e->user_w_md, w, wbuf)},
                 {DNNL_ARG_DIFF_SRC, dnnl::memory(e->bwd_data_pd.diff_src_desc(), engine, dx)}});
  }
  if (dw || dbias) {
    // oneDNN overwrites its outputs: the gradients go to scratch in its layout, then a
    // reorder with a sum post-op adds them into dw (OIHW), and the bias sums are added.
    const dnnl::memory::desc dw_md = e->bwd_w_pd.diff_weights_desc();
    thread_local AlignedBuffer<unsigned char> dw_scratch;
    thread_local std::vector<float> db_scratch;
    if (dw_scratch.size() < dw_md.get_size())
      dw_scratch = AlignedBuffer<unsigned char>(dw_md.get_size());
    db_scratch.assign(size_t(s.out_channels), 0.0f);
    dnnl::memory dw_mem(dw_md, engine, dw_scratch.data());
    e->bwd_w.execute(stream, {{DNNL_ARG_DIFF_DST, dy_mem},
                              {DNNL_ARG_SRC, dnnl::memory(e->src_md, engine, const_cast<void*>(x))},
                              {DNNL_ARG_DIFF_WEIGHTS, dw_mem},
                              {DNNL_ARG_DIFF_BIAS, dnnl::memory(e->bias_md, engine, db_scratch.data())}});
    if (dw) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      dnnl::primitive_attr attr;
      attr.set_post_ops(ops);
      dnnl::memory user(e->user_w_md, engine, dw);
      dnnl::reorder(dnnl::reorder::primitive_desc(dw_mem, user, attr)).execute(stream, dw_mem, user);
    }
    stream.wait();
    if (dbias)
      for (int64_t o = 0; o < s.out_channels; ++o) dbias[o] += db_scratch[size_t(o)];
  }
  stream.wait();
}

}  // namespace

void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* bias,
                    float* y) {
  forward_impl(s, x, /*bf16=*/false, w, bias, y);
}

void conv2d_backward(const Conv2dShape& s, const float* dy, const float* x, const float* w,
                     float* dx, float* dw, float* dbias) {
  backward_impl(s, dy, x, /*bf16=*/false, w, dx, dw, dbias);
}

namespace {

// bf16 convolutions run natively where the CPU has bf16 dot products (AVX512-BF16, AMX).
// Elsewhere (AVX2, where oneDNN has no bf16 convolution; AVX-512 without BF16, where its
// emulation is slower than f32) the same numbers come from the f32 primitive on the bf16
// values widened and the weights rounded to bf16: one rounding, f32 accumulation.
bool native_bf16() {
  static const bool native = cpu_features().avx512_bf16 || cpu_features().amx_bf16;
  return native;
}

const float* widened(const bf16* v, int64_t n, std::vector<float>& out) {
  out.resize(size_t(n));
  convert_bf16_to_f32(v, out.data(), size_t(n));
  return out.data();
}

const float* rounded_to_bf16(const float* w, int64_t n, std::vector<float>& out) {
  thread_local std::vector<bf16> narrow;
  narrow.resize(size_t(n));
  convert_f32_to_bf16(w, narrow.data(), size_t(n));
  return widened(narrow.data(), n, out);
}

}  // namespace

void conv2d_forward_bf16(const Conv2dShape& s, const bf16* x, const float* w, const float* bias,
                         float* y) {
  if (native_bf16()) forward_impl(s, x, /*bf16=*/true, w, bias, y);
  else conv2d_forward_bf16_emulated(s, x, w, bias, y);
}

void conv2d_backward_bf16(const Conv2dShape& s, const bf16* dy, const bf16* x, const float* w,
                          float* dx, float* dw, float* dbias) {
  if (native_bf16()) backward_impl(s, dy, x, /*bf16=*/true, w, dx, dw, dbias);
  else conv2d_backward_bf16_emulated(s, dy, x, w, dx, dw, dbias);
}

void conv2d_forward_bf16_emulated(const Conv2dShape& s, const bf16* x, const float* w,
                                  const float* bias, float* y) {
  check_conv2d_shape(s);
  thread_local std::vector<float> xf, wf;
  forward_impl(s, widened(x, s.x_numel(), xf), /*bf16=*/false, rounded_to_bf16(w, s.w_numel(), wf), bias, y);
}

void conv2d_backward_bf16_emulated(const Conv2dShape& s, const bf16* dy, const bf16* x,
                                   const float* w, float* dx, float* dw, float* dbias) {
  check_conv2d_shape(s);
  thread_local std::vector<float> dyf, xf, wf;
  backward_impl(s, widened(dy, s.y_numel(), dyf), widened(x, s.x_numel(), xf), /*bf16=*/false,
                rounded_to_bf16(w, s.w_numel(), wf), dx, dw, dbias);
}

namespace ref {

void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* bias,
                    float* y) {
  check_conv2d_shape(s);
  const int64_t oh = s.out_height(), ow = s.out_width(), k = s.kernel;
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox)
        for (int64_t o = 0; o < s.out_channels; ++o) {
          double acc = bias ? bias[o] : 0.0;
          for (int64_t ky = 0; ky < k; ++ky) {
            const int64_t iy = oy * s.stride - s.padding + ky;
            if (iy < 0 || iy >= s.height) continue;
            for (int64_t kx = 0; kx < k; ++kx) {
              const int64_t ix = ox * s.stride - s.padding + kx;
              if (ix < 0 || ix >= s.width) continue;
              const float* xp = x + ((n * s.height + iy) * s.width + ix) * s.in_channels;
              for (int64_t i = 0; i < s.in_channels; ++i)
                acc += double(xp[i]) * w[((o * s.in_channels + i) * k + ky) * k + kx];
            }
          }
          y[((n * oh + oy) * ow + ox) * s.out_channels + o] = float(acc);
        }
}

void conv2d_backward(const Conv2dShape& s, const float* dy, const float* x, const float* w,
                     float* dx, float* dw, float* dbias) {
  check_conv2d_shape(s);
  const int64_t oh = s.out_height(), ow = s.out_width(), k = s.kernel;
  std::vector<double> gx(dx ? size_t(s.x_numel()) : 0), gw(size_t(s.w_numel())),
      gb(size_t(s.out_channels));
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox)
        for (int64_t o = 0; o < s.out_channels; ++o) {
          const double g = dy[((n * oh + oy) * ow + ox) * s.out_channels + o];
          gb[size_t(o)] += g;
          for (int64_t ky = 0; ky < k; ++ky) {
            const int64_t iy = oy * s.stride - s.padding + ky;
            if (iy < 0 || iy >= s.height) continue;
            for (int64_t kx = 0; kx < k; ++kx) {
              const int64_t ix = ox * s.stride - s.padding + kx;
              if (ix < 0 || ix >= s.width) continue;
              const int64_t xi = ((n * s.height + iy) * s.width + ix) * s.in_channels;
              for (int64_t i = 0; i < s.in_channels; ++i) {
                const int64_t wi = ((o * s.in_channels + i) * k + ky) * k + kx;
                gw[size_t(wi)] += g * x[xi + i];
                if (dx) gx[size_t(xi + i)] += g * w[wi];
              }
            }
          }
        }
  if (dx)
    for (size_t i = 0; i < gx.size(); ++i) dx[i] = float(gx[i]);
  if (dw)
    for (size_t i = 0; i < gw.size(); ++i) dw[i] += float(gw[i]);
  if (dbias)
    for (size_t i = 0; i < gb.size(); ++i) dbias[i] += float(gb[i]);
}

}  // namespace ref
}  // namespace hyperion
