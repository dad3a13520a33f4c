// The step-table forms of the paged cache's write and attention on the host
// (kernels/paged_attention.h, PagedStepTables): runs of real rows go to the per-call ops,
// padding rows are skipped (write) or zeroed (attention).
#include <cstring>
#include <vector>

#include "base/error.h"
#include "kernels/paged_attention.h"

namespace hyperion {
namespace {

// A view of rows [r0, r1) of a [n, ...] activation.
TensorView row_range(const TensorView& t, int64_t r0, int64_t r1) {
  const size_t row_bytes = t.shape[0] > 0 ? t.nbytes() / static_cast<size_t>(t.shape[0]) : 0;
  TensorView v = t;
  v.data = static_cast<unsigned char*>(t.data) + static_cast<size_t>(r0) * row_bytes;
  v.shape = Shape{r1 - r0, t.shape[1], t.shape[2]};
  return v;
}

// Calls fn(r0, r1) for every maximal run of rows where keep(r) holds.
template <typename Keep, typename Fn>
void for_runs(int64_t n, Keep keep, Fn fn) {
  for (int64_t r = 0; r < n;) {
    if (!keep(r)) {
      ++r;
      continue;
    }
    int64_t e = r + 1;
    while (e < n && keep(e)) ++e;
    fn(r, e);
    r = e;
  }
}

}  // namespace

void paged_kv_write(const PagedKvCache& cache, const TensorView& k, const TensorView& v,
                    const PagedStepTables& t) {
  const char* op = "paged_kv_write";
  HYP_CHECK(k.rank() == 3 && k.shape == v.shape && k.shape[0] == t.n,
            "{}: k {} and v {} must be [{} rows of the step tables, ...]", op, k.str(), v.str(),
            t.n);
  HYP_CHECK(t.slots != nullptr || t.n == 0, "{}: the step tables have no slots", op);
  for_runs(
      t.n, [&](int64_t r) { return t.slots[r] >= 0; },
      [&](int64_t r0, int64_t r1) {
        paged_kv_write(cache, row_range(k, r0, r1), row_range(v, r0, r1), t.slots + r0);
      });
}

void paged_attention(const PagedKvCache& cache, const TensorView& q, const PagedStepTables& t,
                     const TensorView& out, const PagedAttentionParams& params) {
  const char* op = "paged_attention";
  HYP_CHECK(params.mode == PagedAttentionMode::kRagged,
            "{}: the step tables run the ragged mode only", op);
  HYP_CHECK(q.rank() == 3 && out.shape == q.shape && q.shape[0] == t.n,
            "{}: q {} and out {} must be [{} rows of the step tables, heads, head_dim]", op,
            q.str(), out.str(), t.n);
  std::vector<PagedAttentionRow> rows(static_cast<size_t>(t.n));
  for (int64_t r = 0; r < t.n; ++r) {
    const int64_t len = t.lengths[r];
    HYP_CHECK(len >= 0 && (len == 0 || (t.page_start[r] >= 0 &&
                                        t.page_start[r] + (len + cache.page_tokens - 1) /
                                                              cache.page_tokens <=
                                            t.n_pages)),
              "{}: row {} (length {}, table at {}) reads outside the step's {} page entries", op,
              r, len, t.page_start[r], t.n_pages);
    rows[static_cast<size_t>(r)] = PagedAttentionRow{t.pages + t.page_start[r], len};
  }
  const size_t row_bytes = t.n > 0 ? out.nbytes() / static_cast<size_t>(t.n) : 0;
  for_runs(
      t.n, [&](int64_t r) { return t.lengths[r] == 0; },
      [&](int64_t r0, int64_t r1) {
        std::memset(static_cast<unsigned char*>(out.data) + static_cast<size_t>(r0) * row_bytes,
                    0, static_cast<size_t>(r1 - r0) * row_bytes);
      });
  for_runs(
      t.n, [&](int64_t r) { return t.lengths[r] > 0; },
      [&](int64_t r0, int64_t r1) {
        paged_attention(cache, row_range(q, r0, r1), rows.data() + r0, row_range(out, r0, r1),
                        params);
      });
}

}  // namespace hyperion
