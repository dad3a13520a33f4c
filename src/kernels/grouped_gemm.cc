#include "kernels/grouped_gemm.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "kernels/gemm.h"
#include "tensor/convert.h"

namespace hyperion {

namespace {

std::atomic<double> g_threaded_group_flops{kThreadedGroupFlops};

// Checks the shapes shared by the three ops: rows [M, *] split by sizes over G groups,
// weights [G, N, K]. Returns G.
int64_t check_groups(const char* op, const TensorView& rows, const TensorView& w,
                     std::span<const int64_t> sizes) {
  check_rank(op, "rows", rows, 2);
  check_rank(op, "w", w, 3);
  check_contiguous(op, "rows", rows);
  check_contiguous(op, "w", w);
  HYP_CHECK(static_cast<int64_t>(sizes.size()) == w.shape[0],
            "{}: {} group sizes for w {} with {} groups", op, sizes.size(), w.str(), w.shape[0]);
  int64_t total = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    HYP_CHECK(sizes[g] >= 0, "{}: group {} has negative size {}", op, g, sizes[g]);
    total += sizes[g];
  }
  HYP_CHECK(total == rows.shape[0], "{}: group sizes add up to {} but the rows are {}", op, total,
            rows.str());
  return w.shape[0];
}

void check_dtypes(const char* op, const TensorView& x, const TensorView& w) {
  HYP_CHECK((x.dtype == DType::kF32 || x.dtype == DType::kBF16) && x.dtype == w.dtype,
            "{}: operands must both be f32 or both bf16, got {} and {}", op, x.str(), w.str());
}

const unsigned char* at_row(const TensorView& t, int64_t row) {
  return static_cast<const unsigned char*>(t.data) +
         row * t.shape[1] * static_cast<int64_t>(dtype_size(t.dtype));
}

// Runs the GEMMs of every non-empty group; `gemm_for(group, first_row, rows)` issues one.
// A group is cut into chunks of at most kGroupChunkRows rows: oneDNN compiles a kernel per
// GEMM shape, and dropless routing gives every group a new row count at every step, so
// without chunking each step would pay a JIT compilation per group and projection. With
// row counts that are multiples of the MoE dispatch's alignment, the chunk shapes come
// from a small fixed set and are all cached after warm-up.
//
// Threads: a group of at least kThreadedGroupFlops runs its GEMMs on every thread, one
// group after another. Smaller groups run side by side instead, one group per thread
// (largest first, dynamically scheduled): a GEMM of a few hundred rows split over
// threads spends its time synchronising, and measured no faster on two threads than on
// one. A group's chunks stay on one thread, so the weight gradient's accumulation into
// dW_g never races. `flops_per_row` = 2 x the GEMM's other two dimensions.
template <typename GemmFor>
void for_each_group(std::span<const int64_t> sizes, double flops_per_row, GemmFor&& gemm_for) {
  auto run_group = [&](size_t g, int64_t row) {
    for (int64_t done = 0; done < sizes[g]; done += kGroupChunkRows)
      gemm_for(static_cast<int64_t>(g), row + done, std::min(kGroupChunkRows, sizes[g] - done));
  };
  std::vector<int64_t> first_row(sizes.size());
  std::vector<size_t> small;
  int64_t row = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    first_row[g] = row;
    if (double(sizes[g]) * flops_per_row >= g_threaded_group_flops.load())
      run_group(g, row);
    else if (sizes[g] > 0)
      small.push_back(g);
    row += sizes[g];
  }
  std::stable_sort(small.begin(), small.end(),
                   [&](size_t x, size_t y) { return sizes[x] > sizes[y]; });
  parallel_for_dynamic(static_cast<int64_t>(small.size()), [&](int64_t i) {
    const size_t g = small[static_cast<size_t>(i)];
    run_group(g, first_row[g]);
  });
}

const unsigned char* expert(const TensorView& w, int64_t g) {
  return static_cast<const unsigned char*>(w.data) +
         static_cast<size_t>(g * w.shape[1] * w.shape[2]) * dtype_size(w.dtype);
}

}  // namespace

double set_threaded_group_flops(double flops) {
  return g_threaded_group_flops.exchange(flops);
}

void grouped_gemm(const TensorView& a, const TensorView& w, std::span<const int64_t> sizes,
                  const TensorView& c, float beta) {
  const char* op = "grouped_gemm";
  check_groups(op, a, w, sizes);
  check_dtypes(op, a, w);
  check_rank(op, "c", c, 2);
  check_contiguous(op, "c", c);
  const int64_t n = w.shape[1], k = w.shape[2];
  HYP_CHECK(a.shape[1] == k && c.shape[0] == a.shape[0] && c.shape[1] == n,
            "{}: a {}, w {} and c {} disagree", op, a.str(), w.str(), c.str());
  for_each_group(sizes, 2.0 * double(n * k), [&](int64_t g, int64_t row, int64_t m) {
    gemm_contiguous(Trans::kN, Trans::kT, m, n, k, at_row(a, row), a.dtype, expert(w, g), w.dtype,
                    const_cast<unsigned char*>(at_row(c, row)), c.dtype, beta);
  });
}

void grouped_gemm_input_grad(const TensorView& dc, const TensorView& w,
                             std::span<const int64_t> sizes, const TensorView& da, float beta) {
  const char* op = "grouped_gemm_input_grad";
  check_groups(op, dc, w, sizes);
  check_dtypes(op, dc, w);
  check_rank(op, "da", da, 2);
  check_contiguous(op, "da", da);
  const int64_t n = w.shape[1], k = w.shape[2];
  HYP_CHECK(dc.shape[1] == n && da.shape[0] == dc.shape[0] && da.shape[1] == k,
            "{}: dc {}, w {} and da {} disagree", op, dc.str(), w.str(), da.str());
  for_each_group(sizes, 2.0 * double(n * k), [&](int64_t g, int64_t row, int64_t m) {
    gemm_contiguous(Trans::kN, Trans::kN, m, k, n, at_row(dc, row), dc.dtype, expert(w, g), w.dtype,
                    const_cast<unsigned char*>(at_row(da, row)), da.dtype, beta);
  });
}

void grouped_gemm_weight_grad(const TensorView& a, const TensorView& dc,
                              std::span<const int64_t> sizes, const TensorView& dw) {
  const char* op = "grouped_gemm_weight_grad";
  check_groups(op, a, dw, sizes);
  check_dtypes(op, a, dc);
  dw.check_dtype(DType::kF32, op);
  const int64_t n = dw.shape[1], k = dw.shape[2];
  check_rank(op, "dc", dc, 2);
  check_contiguous(op, "dc", dc);
  HYP_CHECK(a.shape[1] == k && dc.shape[0] == a.shape[0] && dc.shape[1] == n,
            "{}: a {}, dc {} and dw {} disagree", op, a.str(), dc.str(), dw.str());
  for_each_group(sizes, 2.0 * double(n * k), [&](int64_t g, int64_t row, int64_t m) {
    gemm_contiguous(Trans::kT, Trans::kN, n, k, m, at_row(dc, row), dc.dtype, at_row(a, row),
                    a.dtype, const_cast<unsigned char*>(expert(dw, g)), DType::kF32, 1.0f);
  });
}

namespace ref {

namespace {
double ld(const TensorView& t, int64_t i) {
  return load_as_f32(t.data, t.dtype, size_t(i));
}
void st(const TensorView& t, int64_t i, double v) {
  if (t.dtype == DType::kF32)
    static_cast<float*>(t.data)[i] = static_cast<float>(v);
  else
    static_cast<bf16*>(t.data)[i] = f32_to_bf16(static_cast<float>(v));
}
std::vector<int64_t> group_of_rows(std::span<const int64_t> sizes) {
  std::vector<int64_t> out;
  for (size_t g = 0; g < sizes.size(); ++g) out.insert(out.end(), size_t(sizes[g]), int64_t(g));
  return out;
}
}  // namespace

void grouped_gemm(const TensorView& a, const TensorView& w, std::span<const int64_t> sizes,
                  const TensorView& c, float beta) {
  check_groups("grouped_gemm", a, w, sizes);
  const int64_t n = w.shape[1], k = w.shape[2];
  const auto grp = group_of_rows(sizes);
  for (int64_t r = 0; r < a.shape[0]; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += ld(a, r * k + p) * ld(w, (grp[r] * n + j) * k + p);
      st(c, r * n + j, s + (beta != 0 ? beta * ld(c, r * n + j) : 0.0));
    }
}

void grouped_gemm_input_grad(const TensorView& dc, const TensorView& w,
                             std::span<const int64_t> sizes, const TensorView& da, float beta) {
  check_groups("grouped_gemm_input_grad", dc, w, sizes);
  const int64_t n = w.shape[1], k = w.shape[2];
  const auto grp = group_of_rows(sizes);
  for (int64_t r = 0; r < dc.shape[0]; ++r)
    for (int64_t p = 0; p < k; ++p) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += ld(dc, r * n + j) * ld(w, (grp[r] * n + j) * k + p);
      st(da, r * k + p, s + (beta != 0 ? beta * ld(da, r * k + p) : 0.0));
    }
}

void grouped_gemm_weight_grad(const TensorView& a, const TensorView& dc,
                              std::span<const int64_t> sizes, const TensorView& dw) {
  check_groups("grouped_gemm_weight_grad", a, dw, sizes);
  const int64_t n = dw.shape[1], k = dw.shape[2];
  const auto grp = group_of_rows(sizes);
  std::vector<double> acc(size_t(dw.numel()), 0.0);
  for (int64_t r = 0; r < a.shape[0]; ++r)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        acc[size_t((grp[r] * n + j) * k + p)] += ld(dc, r * n + j) * ld(a, r * k + p);
  float* out = static_cast<float*>(dw.data);
  for (size_t i = 0; i < acc.size(); ++i) out[i] = static_cast<float>(out[i] + acc[i]);
}

}  // namespace ref

}  // namespace hyperion
