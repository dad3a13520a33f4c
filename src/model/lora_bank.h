// Several LoRA adapters served side by side from one base (vLLM's multi-LoRA): slots
// 1..S-1 each hold an adapter, padded to the bank's rank R with zeros and its B scaled by
// its s; slot 0 is "no adapter" and never read. Per adapted matrix W [out, in] the bank
// keeps A [S, R, in] and B [S, out, R] in the model's compute dtype on its device, so one
// step's rows, each with its own adapter, are applied in the same step: rows sorted by
// slot, each slot's run of rows multiplied by that slot's matrices (the SGMV idea),
// instead of a step per adapter.
//
// A step's assignment of rows to slots is a LoraRows: the decoder (Decoder::set_lora_rows)
// gathers the rows into slot order when they are not (the engine sorts its decode rows by
// adapter, so a decode step needs no gathers), applies each slot's two GEMMs, and gathers
// them back.
#pragma once

#include <cstdint>
#include <vector>

#include "base/allocator.h"
#include "model/lora.h"
#include "model/param_store.h"

namespace hyperion {

class LoraBank {
 public:
  // Room for `adapters` adapters (slots 1..adapters) of rank <= max_rank on `base`'s
  // device, every dense projection of every layer (q, k, v, o, gate, up, down), in `act`.
  LoraBank(const ParamStore& base, int adapters, int64_t max_rank, DType act);

  int slots() const { return slots_; }  // adapters + 1
  int64_t max_rank() const { return rank_; }
  DType dtype() const { return act_; }
  // Bytes of adapter memory the bank holds.
  int64_t bytes() const { return bytes_; }
  // Whether base parameter `index` has a stack here.
  bool covers(int index) const { return entry(index) != nullptr; }
  // The stacks of base parameter `index`: A [S, R, in] and B [S, out, R].
  TensorView a(int index) const;
  TensorView b(int index) const;

  // Writes `adapter` (any device; read through its host copy) into slot 1..S-1: A padded
  // to rank R, B times the adapter's scale, zeros for matrices it does not adapt. Throws
  // naming the rank when it exceeds R or the base shapes differ.
  void install(int slot, const LoraAdapter& adapter);

 private:
  struct Entry {
    int base = -1;
    int64_t in = 0, out = 0;
    int64_t a_offset = 0, b_offset = 0;  // elements into buf_
  };
  const Entry* entry(int index) const {
    return index >= 0 && index < static_cast<int>(by_base_.size()) && by_base_[static_cast<size_t>(index)] >= 0
               ? &entries_[static_cast<size_t>(by_base_[static_cast<size_t>(index)])]
               : nullptr;
  }

  int slots_;
  int64_t rank_;
  DType act_;
  Device device_;
  std::vector<Entry> entries_;
  std::vector<int> by_base_;  // base parameter -> entry, -1
  DeviceBuffer buf_;
  int64_t bytes_ = 0;
};

// One step's rows by adapter slot: `perm` [n] lists the rows slot by slot (slot 0's
// first, in row order within a slot), `sizes` [S] how many rows each slot has. Built on
// the host; perm lives where the kernels read it (the bank's device), set by the caller.
struct LoraRows {
  const int32_t* perm = nullptr;  // the backend's memory
  const int32_t* inverse = nullptr;  // inverse[row] = its position in perm (backend memory)
  std::vector<int64_t> sizes;     // per slot (host)
  int64_t n = 0;
  bool identity = false;  // perm is 0..n-1 (rows already in slot order): no gathers
  int64_t adapted() const { return n - (sizes.empty() ? n : sizes[0]); }
};

// Host side of a LoraRows: the permutation and sizes from each row's slot (0: none).
// Returns false when no row has an adapter (the step runs without LoRA work).
bool lora_rows_from_slots(const std::vector<int32_t>& slot_of_row, int slots, std::vector<int32_t>& perm,
                          std::vector<int32_t>& inverse, LoraRows& rows);

}  // namespace hyperion
