// Paged KV cache and ragged (decode) attention over it, vLLM / JetStream style.
//
// The KV cache of one decoder layer lives in fixed-size pages from one pool; a sequence
// owns a page table (page ids in position order), so sequences of any length share the
// pool without padding and pages need not be contiguous or in order.
//
// Layout of one layer (all contiguous, row-major):
//   k, v              [num_pages, n_kv_heads, page_tokens, head_dim] of dtype
//   k_scale, v_scale  [num_pages, n_kv_heads, page_tokens] f32 (kI8 / kE4M3 only, else null)
// Position p of a sequence is slot pages[p / page_tokens] * page_tokens + p % page_tokens.
// Quantised caches hold one absmax scale per (token, kv head) row of head_dim values
// (quantize_row in kernels/quantize.h): value = q * scale.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace hyperion {

struct PagedKvCache {
  void* k = nullptr;         // [num_pages, n_kv_heads, page_tokens, head_dim] of dtype
  void* v = nullptr;         // same
  float* k_scale = nullptr;  // [num_pages, n_kv_heads, page_tokens] (kI8 / kE4M3 only, else null)
  float* v_scale = nullptr;
  DType dtype = DType::kBF16;  // kF32, kBF16, kI8 or kE4M3
  int64_t num_pages = 0, page_tokens = 0, n_kv_heads = 0, head_dim = 0;
};

// Bytes of one layer's cache for one token (K and V, with scales): what "KV memory per
// token" reports. 2 * n_kv_heads * (head_dim * dtype_size + (quantised ? 4 : 0)).
int64_t paged_kv_bytes_per_token(DType dtype, int64_t n_kv_heads, int64_t head_dim);

// Writes n tokens' keys and values (k, v: [n, n_kv_heads, head_dim], each f32 or bf16,
// contiguous) into the cache at slots[i] = page * page_tokens + offset_in_page. f32 / bf16
// caches store the values converted (bf16 rounded to nearest even); int8 / e4m3 caches
// quantise each (token, kv head) row of head_dim values with quantize_row (its own scale).
// Slots must lie in [0, num_pages * page_tokens) and be distinct (checked).
void paged_kv_write(const PagedKvCache& cache, const TensorView& k, const TensorView& v,
                    const int64_t* slots);

// Reads positions [0, length) of one sequence (its page table `pages`) back into
// contiguous k, v [length, n_kv_heads, head_dim] (f32 or bf16), dequantising int8 / e4m3
// (value = q * scale). Chunked prefill uses it to run the tiled flash-attention kernel
// over a sequence's whole cached context; decode never copies the cache.
void paged_kv_read(const PagedKvCache& cache, const int32_t* pages, int64_t length,
                   const TensorView& k, const TensorView& v);

struct PagedAttentionRow {
  const int32_t* pages = nullptr;  // this row's page table (page ids in position order)
  int64_t length = 0;              // keys visible: positions [0, length), length >= 1
};

// One step's paged-cache index arrays for n rows, in the memory of the backend that reads
// them (a GPU's, uploaded once per step; the host's on the host), shared by every layer.
//   slots       [n] i64: the cache slot of row r's new key and value; < 0: nothing written
//   page_start  [n] i64: where row r's page table starts in `pages`
//   lengths     [n] i64: keys row r attends to, [0, lengths[r]); 0: the row gets zeros
//   pages       i32: the rows' page tables back to back, n_pages entries in all
// A table's entries before a row's window (PagedAttentionParams::window) are never read.
struct PagedStepTables {
  const int64_t* slots = nullptr;
  const int64_t* page_start = nullptr;
  const int64_t* lengths = nullptr;
  const int32_t* pages = nullptr;
  int64_t n = 0;
  int64_t n_pages = 0;
};

enum class PagedAttentionMode : uint8_t { kRagged, kPadded };

struct PagedAttentionParams {
  float scale = 0.0f;  // 0 means 1/sqrt(head_dim); otherwise finite and > 0
  PagedAttentionMode mode = PagedAttentionMode::kRagged;
  // kPadded only: every row computes scores for padded_length keys (its page table must
  // cover them) and masks positions >= its length -- the non-ragged baseline that pads every
  // sequence of the batch to the longest. Must be >= every row's length.
  int64_t padded_length = 0;
  // > 0: a sliding window (kRagged only): row i attends to its `window` latest keys,
  // [max(0, length - window), length), and reads nothing older.
  int64_t window = 0;
  // > 0: scores capped to (-softcap, softcap) by softcap * tanh(s / softcap) (Gemma 2's
  // attn_logit_softcapping); the portable path runs it.
  float softcap = 0.0f;
  bool force_portable = false;  // testing aid: scalar path even when AVX-512 is present
};

// q [n, n_heads, head_dim] (f32|bf16), out [n, n_heads, head_dim] (f32|bf16), contiguous.
// Query head h reads kv head h / (n_heads / n_kv_heads) (GQA). Row i attends (no further
// causal mask) to keys [0, rows[i].length) of its page table: softmax(scale * q k^T) v.
//
// kRagged reads each row's keys exactly once, page by page, with an online softmax; all
// query heads of a GQA group go together, so each K/V page is read once per group.
// Quantised keys and values are dequantised on the fly (never copied). Work is split into
// tasks of (row, range of pages, kv heads): a long row's ranges (about 512 positions of
// whole pages each) are merged afterwards (flash-decoding), and a task takes all kv heads
// of its range (each page is then one contiguous stream) unless there are too few ranges
// to keep the threads busy. The position split depends on lengths only and merges run in
// a fixed order, so the result is bitwise identical for any thread count.
// kPadded runs one range per row over padded_length keys (also reading K and V beyond each
// row's length) and masks the tail: the same numerics, a padded batch's cost.
//
// Checked (hyperion::Error naming paged_attention): shapes and dtypes, the cache's
// pointers (scales for quantised caches), length >= 1, padded_length >= every length,
// every page id the row reads in [0, num_pages). NOT checkable: that each page table
// really holds ceil(length / page_tokens) entries (ceil(padded_length / page_tokens) in
// kPadded) -- it is a raw pointer, so a short table is read out of bounds.
void paged_attention(const PagedKvCache& cache, const TensorView& q, const PagedAttentionRow* rows,
                     const TensorView& out, const PagedAttentionParams& params = {});

// The step-table forms (PagedStepTables, host memory here): the write skips rows with a
// negative slot; the attention gives rows of length 0 zeros and runs the others as above
// (ragged mode only). Same checks, naming the row.
void paged_kv_write(const PagedKvCache& cache, const TensorView& k, const TensorView& v,
                    const PagedStepTables& tables);
void paged_attention(const PagedKvCache& cache, const TensorView& q, const PagedStepTables& tables,
                     const TensorView& out, const PagedAttentionParams& params = {});

namespace ref {
// Scalar double-precision reference (dequantises each key/value as it reads it). Same
// arguments and checks; the mode only changes which page ids are checked (the result is
// the same mathematically).
void paged_attention(const PagedKvCache& cache, const TensorView& q, const PagedAttentionRow* rows,
                     const TensorView& out, const PagedAttentionParams& params = {});
}  // namespace ref

}  // namespace hyperion
