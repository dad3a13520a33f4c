// cuBLASLt through dlopen: the handful of entry points the GEMM uses, resolved once.
#include "kernels/cuda/cublaslt_gemm.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "base/error.h"

namespace hyperion::cuda {
namespace {

struct LtApi {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtGetStatusString) status_string;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatrixLayoutSetAttribute) layout_set;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
};
LtApi api;

template <typename F>
bool resolve(void* lib, const char* name, F* out, std::string* why) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (*out == nullptr) *why = std::string("libcublasLt has no symbol ") + name;
  return *out != nullptr;
}

void check(cublasStatus_t st, const char* what, const GemmArgs& mm) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  fail("cuda gemm: {} failed ({}) for m={} n={} k={} batch={}", what,
       api.status_string != nullptr ? api.status_string(st) : "?", mm.m, mm.n, mm.k, mm.batch);
}

// RAII for the per-call descriptors.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref != nullptr) api.pref_destroy(pref);
    if (c != nullptr) api.layout_destroy(c);
    if (b != nullptr) api.layout_destroy(b);
    if (a != nullptr) api.layout_destroy(a);
    if (op != nullptr) api.desc_destroy(op);
  }
};

struct PlanCache {
  struct Plan {
    Descs d;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::array<int64_t, 16>;
  struct Hash {
    size_t operator()(const Key& k) const {
      uint64_t h = 1469598103934665603ull;
      for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
      return static_cast<size_t>(h);
    }
  };
  std::mutex mutex;
  std::unordered_map<Key, std::unique_ptr<Plan>, Hash> plans;
};

}  // namespace

int cuda_data_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kE4M3:
      return CUDA_R_8F_E4M3;
    case DType::kE5M2:
      return CUDA_R_8F_E5M2;
    default:
      return -1;
  }
}

bool CublasLt::open(std::string* why) {
  // The soname first (LD_LIBRARY_PATH, the loader's cache), then the toolkit this binary
  // was built against.
  for (const std::string& path : {std::string("libcublasLt.so.13"),
                                  std::string(HYPERION_CUDA_LIBDIR) + "/libcublasLt.so.13"}) {
    lib_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib_ != nullptr) break;
  }
  if (lib_ == nullptr) {
    *why = std::string("cannot open libcublasLt.so.13 (") + dlerror() + ")";
    return false;
  }
  if (!(resolve(lib_, "cublasLtCreate", &api.create, why) &&
        resolve(lib_, "cublasLtDestroy", &api.destroy, why) &&
        resolve(lib_, "cublasLtGetStatusString", &api.status_string, why) &&
        resolve(lib_, "cublasLtMatmulDescCreate", &api.desc_create, why) &&
        resolve(lib_, "cublasLtMatmulDescDestroy", &api.desc_destroy, why) &&
        resolve(lib_, "cublasLtMatmulDescSetAttribute", &api.desc_set, why) &&
        resolve(lib_, "cublasLtMatrixLayoutCreate", &api.layout_create, why) &&
        resolve(lib_, "cublasLtMatrixLayoutDestroy", &api.layout_destroy, why) &&
        resolve(lib_, "cublasLtMatrixLayoutSetAttribute", &api.layout_set, why) &&
        resolve(lib_, "cublasLtMatmulPreferenceCreate", &api.pref_create, why) &&
        resolve(lib_, "cublasLtMatmulPreferenceDestroy", &api.pref_destroy, why) &&
        resolve(lib_, "cublasLtMatmulPreferenceSetAttribute", &api.pref_set, why) &&
        resolve(lib_, "cublasLtMatmulAlgoGetHeuristic", &api.heuristic, why) &&
        resolve(lib_, "cublasLtMatmul", &api.matmul, why)))
    return false;
  cublasLtHandle_t h = nullptr;
  const cublasStatus_t st = api.create(&h);
  if (st != CUBLAS_STATUS_SUCCESS) {
    *why = std::string("cublasLtCreate: ") + api.status_string(st);
    return false;
  }
  handle_ = h;
  plans_ = new PlanCache();
  return true;
}

CublasLt::~CublasLt() {
  // The process is exiting (the backend lives forever): the driver may already be gone,
  // so the handle and library are left to the OS.
}

void CublasLt::matmul(const GemmArgs& mm, cudaStream_t stream, void* workspace,
                      size_t workspace_bytes) {
  auto* cache = static_cast<PlanCache*>(plans_);
  const bool batched = mm.batch > 1;
  // The operands' alignment (the largest power of two up to 256 dividing every address):
  // the heuristic assumes 256 bytes unless told, and a plan chosen for aligned operands may
  // not run on a row slice (a convolution's later chunks start mid-buffer).
  uint64_t align = 256;
  for (const void* p : {static_cast<const void*>(mm.a), static_cast<const void*>(mm.b),
                        static_cast<const void*>(mm.c)})
    while (align > 1 && reinterpret_cast<uintptr_t>(p) % align != 0) align /= 2;
  const PlanCache::Key key = {static_cast<int64_t>(mm.trans_a),
                              static_cast<int64_t>(mm.trans_b),
                              static_cast<int64_t>(mm.a_dtype),
                              static_cast<int64_t>(mm.b_dtype),
                              static_cast<int64_t>(mm.c_dtype),
                              mm.m,
                              mm.n,
                              mm.k,
                              mm.lda,
                              mm.ldb,
                              mm.ldc,
                              batched ? mm.batch : 1,
                              batched ? mm.stride_a : 0,
                              batched ? mm.stride_b ^ (mm.stride_c << 32) : 0,
                              static_cast<int64_t>(workspace_bytes),
                              static_cast<int64_t>(align)};
  std::lock_guard<std::mutex> lock(cache->mutex);
  // A bounded cache: a run sees a few dozen shapes; one that sees thousands starts over.
  if (cache->plans.size() >= 4096) cache->plans.clear();
  std::unique_ptr<PlanCache::Plan>& slot = cache->plans[key];
  if (slot == nullptr) {
    auto plan = std::make_unique<PlanCache::Plan>();
    Descs& d = plan->d;
    const bool trans_a = mm.trans_a == Trans::kT, trans_b = mm.trans_b == Trans::kT;
    const auto a_type = static_cast<cudaDataType_t>(cuda_data_type(mm.a_dtype));
    const auto b_type = static_cast<cudaDataType_t>(cuda_data_type(mm.b_dtype));
    const auto c_type = static_cast<cudaDataType_t>(cuda_data_type(mm.c_dtype));
    // Column-major view: D'[n, m] = op(B') op(A'); B' is the first operand.
    const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(api.desc_create(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor", mm);
    check(api.desc_set(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)), "transa",
          mm);
    check(api.desc_set(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)),
          "transb", mm);
    // Stored shapes (column-major rows x cols) of each operand.
    const uint64_t first_rows = static_cast<uint64_t>(trans_b ? mm.k : mm.n);
    const uint64_t first_cols = static_cast<uint64_t>(trans_b ? mm.n : mm.k);
    const uint64_t second_rows = static_cast<uint64_t>(trans_a ? mm.m : mm.k);
    const uint64_t second_cols = static_cast<uint64_t>(trans_a ? mm.k : mm.m);
    check(api.layout_create(&d.a, b_type, first_rows, first_cols, mm.ldb), "layout of B", mm);
    check(api.layout_create(&d.b, a_type, second_rows, second_cols, mm.lda), "layout of A", mm);
    check(api.layout_create(&d.c, c_type, static_cast<uint64_t>(mm.n),
                            static_cast<uint64_t>(mm.m), mm.ldc),
          "layout of C", mm);
    if (batched) {
      const int32_t count = static_cast<int32_t>(mm.batch);
      const int64_t strides[3] = {mm.stride_b, mm.stride_a, mm.stride_c};
      cublasLtMatrixLayout_t layouts[3] = {d.a, d.b, d.c};
      for (int i = 0; i < 3; ++i) {
        check(api.layout_set(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                             sizeof(count)),
              "batch count", mm);
        check(api.layout_set(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                             &strides[i], sizeof(strides[i])),
              "batch stride", mm);
      }
    }
    check(api.pref_create(&d.pref), "preference", mm);
    const uint64_t ws = workspace_bytes;
    check(api.pref_set(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
          "workspace preference", mm);
    const uint32_t align32 = static_cast<uint32_t>(align);
    for (const auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      check(api.pref_set(d.pref, attr, &align32, sizeof(align32)), "alignment preference", mm);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    check(api.heuristic(static_cast<cublasLtHandle_t>(handle_), d.op, d.a, d.b, d.c, d.c, d.pref,
                        1, &result, &found),
          "algorithm search", mm);
    if (found <= 0) cache->plans.erase(key);
    HYP_CHECK(found > 0,
              "cuda gemm: cuBLASLt has no algorithm for m={} n={} k={} (types {} x {} -> {})",
              mm.m, mm.n, mm.k, dtype_name(mm.a_dtype), dtype_name(mm.b_dtype),
              dtype_name(mm.c_dtype));
    plan->algo = result.algo;
    slot = std::move(plan);
  }
  const Descs& d = slot->d;
  check(api.matmul(static_cast<cublasLtHandle_t>(handle_), d.op, &mm.alpha, mm.b, d.a, mm.a, d.b,
                   &mm.beta, mm.c, d.c, mm.c, d.c, &slot->algo, workspace, workspace_bytes,
                   stream),
        "matmul", mm);
}

}  // namespace hyperion::cuda
