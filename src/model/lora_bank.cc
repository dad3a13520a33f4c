#include "model/lora_bank.h"

#include <algorithm>

#include "base/error.h"
#include "kernels/backend.h"
#include "tensor/convert.h"

namespace hyperion {

LoraBank::LoraBank(const ParamStore& base, int adapters, int64_t max_rank, DType act)
    : slots_(adapters + 1), rank_(max_rank), act_(act), device_(base.device()) {
  HYP_USAGE_CHECK(adapters >= 1, "LoRA serving: room for at least one adapter is needed, got {}", adapters);
  HYP_USAGE_CHECK(max_rank >= 1, "LoRA serving: the largest adapter rank must be >= 1, got {}", max_rank);
  by_base_.assign(base.infos().size(), -1);
  int64_t at = 0;
  for (int l = 0; l < base.config().n_layers; ++l) {
    const LayerParamIndex& p = base.layer(l);
    for (int index : {p.q, p.k, p.v, p.o, p.gate, p.up, p.down}) {
      if (p.moe() && (index == p.gate || index == p.up || index == p.down)) continue;
      const ParamInfo& info = base.infos()[static_cast<size_t>(index)];
      Entry e;
      e.base = index;
      e.out = info.shape[0];
      e.in = info.shape[1];
      e.a_offset = at;
      at += slots_ * rank_ * e.in;
      e.b_offset = at;
      at += slots_ * e.out * rank_;
      by_base_[static_cast<size_t>(index)] = static_cast<int>(entries_.size());
      entries_.push_back(e);
    }
  }
  bytes_ = at * static_cast<int64_t>(dtype_size(act_));
  KernelBackend& k = backend_for(device_);
  buf_ = DeviceBuffer(k.allocator(), static_cast<size_t>(bytes_));
  k.zero(buf_.data(), buf_.bytes());
}

TensorView LoraBank::a(int index) const {
  const Entry* e = entry(index);
  HYP_CHECK(e != nullptr, "LoRA bank: parameter {} has no adapters", index);
  TensorView v(static_cast<char*>(const_cast<void*>(buf_.data())) + e->a_offset * dtype_size(act_), act_,
               {slots_, rank_, e->in});
  v.device = device_;
  return v;
}

TensorView LoraBank::b(int index) const {
  const Entry* e = entry(index);
  HYP_CHECK(e != nullptr, "LoRA bank: parameter {} has no adapters", index);
  TensorView v(static_cast<char*>(const_cast<void*>(buf_.data())) + e->b_offset * dtype_size(act_), act_,
               {slots_, e->out, rank_});
  v.device = device_;
  return v;
}

void LoraBank::install(int slot, const LoraAdapter& adapter) {
  HYP_CHECK(slot >= 1 && slot < slots_, "LoRA bank: slot {} is out of range [1, {})", slot, slots_);
  const int64_t r = adapter.rank();
  HYP_USAGE_CHECK(r <= rank_, "LoRA adapter of rank {} exceeds the server's max_lora_rank {}", r, rank_);
  const ParamStore& s = adapter.store();
  s.params_to_host();
  const float* host = s.host_params();
  KernelBackend& k = backend_for(device_);
  const float scale = adapter.scale();
  std::vector<float> fa, fb;
  std::vector<unsigned char> staging;
  for (const Entry& e : entries_) {
    // A [R, in]: the adapter's r rows, then zeros. B [out, R]: s * its r columns, then zeros.
    fa.assign(static_cast<size_t>(rank_ * e.in), 0.0f);
    fb.assign(static_cast<size_t>(e.out * rank_), 0.0f);
    const int ai = adapter.a_of(e.base);
    if (ai >= 0) {
      const ParamInfo& pa = s.infos()[static_cast<size_t>(ai)];
      const ParamInfo& pb = s.infos()[static_cast<size_t>(ai) + 1];
      HYP_CHECK(pa.shape[1] == e.in && pb.shape[0] == e.out, "LoRA adapter {}: shape differs from the base's",
                pa.name);
      std::copy(host + pa.offset, host + pa.offset + r * e.in, fa.begin());
      for (int64_t o = 0; o < e.out; ++o)
        for (int64_t j = 0; j < r; ++j)
          fb[static_cast<size_t>(o * rank_ + j)] = scale * host[pb.offset + o * r + j];
    }
    for (auto [src, count, offset] : {std::tuple{&fa, rank_ * e.in, e.a_offset + slot * rank_ * e.in},
                                      std::tuple{&fb, e.out * rank_, e.b_offset + slot * e.out * rank_}}) {
      staging.resize(static_cast<size_t>(count) * dtype_size(act_));
      convert_any(src->data(), DType::kF32, staging.data(), act_, static_cast<size_t>(count));
      k.upload(staging.data(), static_cast<char*>(buf_.data()) + offset * dtype_size(act_), staging.size());
    }
  }
}

bool lora_rows_from_slots(const std::vector<int32_t>& slot_of_row, int slots, std::vector<int32_t>& perm,
                          std::vector<int32_t>& inverse, LoraRows& rows) {
  const auto n = static_cast<int64_t>(slot_of_row.size());
  rows.n = n;
  rows.sizes.assign(static_cast<size_t>(slots), 0);
  for (int32_t s : slot_of_row) {
    HYP_CHECK(s >= 0 && s < slots, "LoRA rows: slot {} is out of range [0, {})", s, slots);
    ++rows.sizes[static_cast<size_t>(s)];
  }
  if (rows.sizes[0] == n) return false;
  // Counting sort: slot 0's rows first, each slot's rows in row order.
  std::vector<int64_t> next(static_cast<size_t>(slots), 0);
  for (int s = 1; s < slots; ++s) next[static_cast<size_t>(s)] = next[static_cast<size_t>(s) - 1] + rows.sizes[static_cast<size_t>(s) - 1];
  perm.assign(static_cast<size_t>(n), 0);
  inverse.assign(static_cast<size_t>(n), 0);
  rows.identity = true;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t at = next[static_cast<size_t>(slot_of_row[static_cast<size_t>(i)])]++;
    perm[static_cast<size_t>(at)] = static_cast<int32_t>(i);
    inverse[static_cast<size_t>(i)] = static_cast<int32_t>(at);
    if (at != i) rows.identity = false;
  }
  return true;
}

}  // namespace hyperion
