#include "model/generator.h"

#include <algorithm>

#include "base/error.h"
#include "base/thread_governor.h"
#include "kernels/attention.h"

namespace hyperion {

ContiguousKvCache::ContiguousKvCache(const DecoderConfig& cfg, DType act, int64_t max_len,
                                     Allocator& alloc)
    : row_bytes_(cfg.kv_dim() * static_cast<int64_t>(dtype_size(act))) {
  const size_t bytes = static_cast<size_t>(max_len * row_bytes_);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    k_.emplace_back(alloc, bytes);
    v_.emplace_back(alloc, bytes);
  }
}

void ContiguousKvCache::place(const Decoder& dec, int l, const PassRows& rows, DecoderActs& s) {
  const size_t at = static_cast<size_t>(rows.position * row_bytes_);
  s.k = k_[static_cast<size_t>(l)].as<unsigned char>() + at;
  s.v = v_[static_cast<size_t>(l)].as<unsigned char>() + at;
}

void ContiguousKvCache::attend(const Decoder& dec, int l, const PassRows& rows, DecoderActs& s) {
  const DecoderConfig& c = dec.config();
  const DType a = dec.act();
  const int64_t n = rows.n(), hq = c.n_heads, hkv = c.n_kv_heads, hd = c.head_dim;
  const int64_t tk = rows.position + n;
  KernelBackend& kern = dec.kernels();
  kern.attention_forward(kern.view(s.q, a, {1, n, hq, hd}),
                         kern.view(k_[static_cast<size_t>(l)].data(), a, {1, tk, hkv, hd}),
                         kern.view(v_[static_cast<size_t>(l)].data(), a, {1, tk, hkv, hd}),
                         kern.view(s.att, a, {1, n, hq, hd}),
                         kern.view(s.lse, DType::kF32, {1, hq, n}), dec.attention_params(l));
}

Generator::Generator(const ParamStore& params, int64_t max_len)
    : cfg_(params.config()),
      act_(params.has_bf16() ? DType::kBF16 : DType::kF32),
      max_len_(max_len),
      weights_(params, params.has_bf16() ? WeightFormat::kBF16 : WeightFormat::kF32),
      decoder_(params, weights_, max_len),
      cache_(params.config(), act_, std::clamp<int64_t>(max_len, 0, params.config().max_seq_len),
             backend_for(params.device()).allocator()) {
  HYP_CHECK(max_len > 0 && max_len <= cfg_.max_seq_len,
            "generator: max_len {} must be in [1, max_seq_len={}]", max_len, cfg_.max_seq_len);
  const size_t vocab = static_cast<size_t>(cfg_.vocab_size);
  logits_ = DeviceBuffer(decoder_.kernels().allocator(), vocab * sizeof(float));
  logits_host_ = AlignedBuffer<float>(vocab);
}

void Generator::ensure_capacity(int64_t n) {
  if (n <= capacity_) return;
  const size_t a = dtype_size(act_);
  const size_t d = static_cast<size_t>(cfg_.dim), q = static_cast<size_t>(cfg_.q_dim());
  const size_t f = static_cast<size_t>(cfg_.ffn_dim), rows = static_cast<size_t>(n);
  Allocator& alloc = decoder_.kernels().allocator();
  x_ = DeviceBuffer(alloc, rows * d * 4);
  rstd_ = DeviceBuffer(alloc, rows * 4);
  lse_ = DeviceBuffer(alloc, rows * static_cast<size_t>(cfg_.n_heads) * 4);
  h_ = DeviceBuffer(alloc, rows * d * a);
  q_ = DeviceBuffer(alloc, rows * q * a);
  att_ = DeviceBuffer(alloc, rows * q * a);
  g_ = DeviceBuffer(alloc, rows * f * a);
  u_ = DeviceBuffer(alloc, rows * f * a);
  if (decoder_.kernels().device() != Device::kHost) tokens_ = DeviceBuffer(alloc, rows * 4);
  if (cfg_.is_moe())
    moe_.reserve(moe_shape(cfg_, MoeOptions{}, 1, n, 1), act_, decoder_.kernels().allocator());
  capacity_ = n;
}

const float* Generator::feed(const int32_t* tokens, int64_t n) {
  HYP_CHECK(n > 0, "generator: feed needs at least one token");
  HYP_CHECK(pos_ + n <= max_len_,
            "generator: {} cached + {} new tokens exceed the context of {} positions", pos_, n,
            max_len_);
  ensure_capacity(n);
  const int64_t d = cfg_.dim;
  KernelBackend& k = decoder_.kernels();
  if (!tokens_.empty()) {  // a device model reads the ids from its own memory
    k.upload(tokens, tokens_.data(), static_cast<size_t>(n) * sizeof(int32_t));
    tokens = tokens_.as<int32_t>();
  }
  float* x = x_.as<float>();
  decoder_.embed(tokens, n, x);
  // Keys and values: the cache places them.
  DecoderActs s = in_place_acts(x, rstd_.as<float>(), h_.data(), q_.data(), nullptr, nullptr,
                                att_.data(), lse_.as<float>(), g_.data(), u_.data());
  if (cfg_.is_moe()) s.moe = moe_.acts();
  const PassRows rows{1, n, pos_};
  const MoeShape ms = cfg_.is_moe() ? moe_shape(cfg_, MoeOptions{}, 1, n, 1) : MoeShape{};
  for (int l = 0; l < cfg_.n_layers; ++l) {
    decoder_.attention_block(l, rows, s, cache_);
    decoder_.mlp_block(l, n, s, ms, MoeOptions{}, x);
  }
  // Only the last position's logits are needed.
  decoder_.head(x + (n - 1) * d, 1, h_.data(), rstd_.as<float>(), logits_.data(), DType::kF32);
  decoder_.cap_logits(logits_.data(), 1, DType::kF32);
  pos_ += n;
  if (k.device() == Device::kHost) return logits_.as<float>();
  k.download(logits_.data(), logits_host_.data(), logits_.bytes());
  return logits_host_.data();
}

std::vector<int32_t> generate_tokens(Generator& gen, const std::vector<int32_t>& prompt,
                                     const GenerateOptions& options,
                                     const std::function<void(int32_t)>& on_token) {
  HYP_CHECK(!prompt.empty(), "generate: the prompt must hold at least one token (BOS)");
  validate(options.sampling);
  Sampler sampler(options.sampling);
  std::vector<int32_t> out;
  const float* logits = gen.feed(prompt.data(), static_cast<int64_t>(prompt.size()));
  std::vector<float> masked;  // a constrained step's logits
  for (int64_t i = 0; i < options.max_tokens; ++i) {
    int32_t tok = 0;
    if (options.constraint != nullptr) {
      masked.assign(logits, logits + gen.vocab_size());
      if (!options.constraint->mask(masked.data(), gen.vocab_size())) break;
      tok = sampler.sample(masked.data(), gen.vocab_size());
      options.constraint->accept(tok);
    } else {
      tok = sampler.sample(logits, gen.vocab_size());
    }
    out.push_back(tok);
    if (on_token) on_token(tok);
    if (options.constraint != nullptr && options.constraint->finished()) break;
    if (options.stop_at_eos &&
        (tok == options.eos_id ||
         std::find(options.end_ids.begin(), options.end_ids.end(), tok) != options.end_ids.end()))
      break;
    if (gen.position() >= gen.max_len()) break;
    adapt_threads_to_contention();  // a busy neighbour: the team it actually gets
    logits = gen.feed(&tok, 1);
  }
  return out;
}

}  // namespace hyperion
