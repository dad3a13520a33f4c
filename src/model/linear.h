// Linear layers y = x W^T (W [out, in], as Hugging Face stores it): the three matmuls
// on raw activation buffers (forward, input gradient, weight gradient), and the weight
// formats a decoder's matrices can be read in (LinearWeights).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>

#include "base/aligned.h"
#include "kernels/backend.h"
#include "kernels/block_pack.h"
#include "kernels/gemm.h"
#include "model/param_store.h"
#include "tensor/tensor.h"

namespace hyperion {

namespace linear {

// y[n, out] = x[n, in] W^T + beta * y, W [out, in] (a Linear layer).
inline void forward(KernelBackend& k, const void* x, DType xd, const TensorView& w, void* y,
                    DType yd, int64_t n, float beta = 0.0f) {
  k.gemm_contiguous(Trans::kN, Trans::kT, n, w.shape[0], w.shape[1], x, xd, w.data, w.dtype, y, yd,
                    beta);
}

// dx[n, in] = dy[n, out] W + beta * dx (input gradient of a Linear layer).
inline void backward_input(KernelBackend& k, const void* dy, DType dyd, const TensorView& w,
                           void* dx, DType dxd, int64_t n, float beta = 0.0f) {
  k.gemm_contiguous(Trans::kN, Trans::kN, n, w.shape[1], w.shape[0], dy, dyd, w.data, w.dtype, dx,
                    dxd, beta);
}

// dW[out, in] += dy[n, out]^T x[n, in] (weight gradient, accumulated in f32).
inline void backward_weight(KernelBackend& k, const void* dy, const void* x, DType d,
                            const TensorView& dw, int64_t n) {
  k.gemm_contiguous(Trans::kT, Trans::kN, dw.shape[0], dw.shape[1], n, dy, d, x, d, dw.data,
                    DType::kF32, 1.0f);
}

}  // namespace linear

// How a model's matrices are read by its matmuls.
//   kF32, kBF16  the parameter store's f32 master weights or its bf16 copy (training,
//                and inference in the compute dtype)
//   kInt8        int8 per output channel: each matrix row quantised once at load
//                (kernels/quantize.h), activations quantised per row on the fly, an int8
//                GEMM (oneDNN VNNI/AMX; GEMV with AVX512-VNNI for decode; on a GPU the
//                int8 kernels of kernels/cuda/int8.cu, quantising on the device)
//                dequantised by the row and channel scales. Stacked MoE experts stay in the compute
//                dtype (the grouped GEMM reads them stacked).
// fp8 weights are the next format here.
enum class WeightFormat : uint8_t { kF32, kBF16, kInt8 };

// The activation dtype a weight format computes in (bf16 for bf16 and int8 weights).
inline DType act_dtype_for(WeightFormat w) {
  return w == WeightFormat::kF32 ? DType::kF32 : DType::kBF16;
}

// Every matrix of a ParamStore in one weight format. Not thread-safe (the int8 path
// quantises activations into a scratch buffer it owns); one per model runner.
class LinearWeights {
 public:
  // kBF16 and kInt8 need the store's bf16 copy; the store must outlive this object.
  // The matmuls run on the backend of the store's device.
  LinearWeights(const ParamStore& params, WeightFormat format);
  KernelBackend& backend() const { return backend_; }

  WeightFormat format() const { return format_; }
  DType act_dtype() const { return act_dtype_for(format_); }
  // Bytes of matrices read by one forward pass in this format (embedding counted only
  // when it is the LM head too).
  int64_t weight_bytes() const { return weight_bytes_; }

  // kInt8: parameter `index`'s int8 matrix [out, in] and its per-row scales (null when
  // the matrix is not held in int8). Quantised from the f32 weights with quantize_rows, as
  // int8 training's forward quantises it (model/quantized_matmul.h): a checkpoint
  // trained with `quantization: int8` serves the very int8 weights it trained with.
  // Pointers into the memory of the store's device.
  const int8_t* int8_matrix(int index, const float** scales) const;

  // y[n, out] = x[n, in] W^T + beta * y for parameter `index`; x in act_dtype().
  void forward(int index, const void* x, void* y, DType yd, int64_t n, float beta = 0.0f);
  // forward() of several parameters of one input (same in-width), beta 0: one pass over
  // their weights where the backend can (KernelBackend::linear_many); int8 quantises x once.
  void forward_many(std::span<const int> indices, const void* x, std::span<void* const> ys,
                    DType yd, int64_t n);

 private:
  struct QuantMatrix {
    AlignedBuffer<int8_t> w;  // [out, in]
    AlignedBuffer<float> scale;
    AlignedBuffer<int32_t> sums;  // [out] row sums of w (the decode GEMV's correction)
    // w in AMX's tile layout (kernels/amx_int8_gemm.h), where the CPU has AMX-INT8: the
    // batched decode and prefill GEMMs (more rows than the GEMV path takes) run on it.
    // Empty otherwise. Costs one more copy of the int8 weights.
    AlignedBuffer<int8_t> packed;
    // On a device: w and scale in its memory (the host buffers above stay empty).
    DeviceBuffer dw, dscale;
    int64_t out = 0, in = 0;
  };

  // int8 matrices held on a device: x quantised once for all of them (linear_int8_many).
  void forward_int8_device(std::span<const int> indices, const void* x, std::span<void* const> ys,
                           DType yd, int64_t n, float beta = 0.0f);

  const ParamStore& params_;
  KernelBackend& backend_;
  WeightFormat format_;
  std::unordered_map<int, QuantMatrix> quant_;
  // Matrices the store holds in llama.cpp's blocks (a GGUF model), in the interleaved
  // decode layout (kernels/block_pack.h), packed once here.
  std::unordered_map<int, PackedBlocks> packed_;
  int64_t weight_bytes_ = 0;
  AlignedBuffer<int8_t> qx_;  // quantised activations, grown on demand
  AlignedBuffer<float> qscale_;
  DeviceBuffer dqx_, dqscale_;  // the same on a device
};

}  // namespace hyperion
