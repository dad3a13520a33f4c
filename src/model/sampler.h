// Token sampling for `generate` and the server.
//
// sample(logits[vocab]) with temperature T, top_k K and top_p P:
//   T == 0: greedy, the argmax (lowest index on ties); no random number is drawn.
//   T > 0: z = logits / T; if 0 < K < vocab keep the K largest logits (ties to the lower
//     index); p = softmax(z) over the kept tokens; if P < 1 keep the smallest set of the
//     most probable kept tokens (probability descending, ties to the lower index) whose
//     mass is >= P of the kept mass (at least one token); renormalise and draw one token
//     with one draw of the sampler's RNG.
// The RNG is splitmix64 (state += 0x9e3779b97f4a7c15, then the usual mix) and a draw is
// u = (next() >> 11) * 2^-53 in [0, 1); the token is the first kept token, in the
// sampler's internal candidate order, whose cumulative mass exceeds u * total. The state
// is a single uint64_t, initialised to SamplingParams::seed, so a generation is
// reproducible and can be resumed with set_rng_state.
//
// Logits may contain -inf (masked tokens, never drawn); NaN, +inf, or all -inf are errors
// naming the sampler and the index. exp uses a vectorised polynomial (~1 ulp; terms
// below e^-86 relative to the max are 0).
//
// Cost for a 32k-128k vocabulary: one SIMD pass for the max and validity check, one SIMD
// exp pass with block sums (the draw scans the block sums, then one block). top_k: a
// one-pass selection with a size-K heap (nth_element when K > vocab/8), no sort unless
// top_p is also set (then K log K). top_p alone: the 64 most probable tokens first
// (one SIMD search pass); if they do not reach P, two passes that bucket the
// probabilities by 1/16 octave and keep the buckets above the boundary, plus a weighted
// quickselect inside the boundary bucket (O(vocab), no sort). Scratch buffers live in the Sampler:
// after the first call with the largest vocabulary and settings, sample() does not allocate. A
// Sampler is not thread-safe (use one per sequence or thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hyperion {

struct SamplingParams {
  float temperature = 1.0f;
  int top_k = 0;  // 0 = off
  float top_p = 1.0f;
  uint64_t seed = 0;
};

// Throws hyperion::Error naming the field: temperature < 0 or not finite, top_k < 0,
// top_p outside (0, 1].
void validate(const SamplingParams& p);

// The sampling knobs as a user gives them, with one meaning for each value in every place
// that takes them (hyperion generate, the OpenAI API): temperature in [0, 2] (0: greedy);
// top_k -1 or 0: off, else the k most likely; top_p in (0, 1]. Each returns "" for a valid
// value, else what is wrong ("must be in [0, 2], got 3"), for the caller to prefix with
// the name its user knows (--top-k, 'top_k').
std::string temperature_error(double temperature);
std::string top_k_error(int64_t top_k);
std::string top_p_error(double top_p);
// top_k as SamplingParams holds it: -1 (off) -> 0.
inline int top_k_param(int64_t top_k) { return top_k < 0 ? 0 : static_cast<int>(top_k); }

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);

  // Picks a token from logits[vocab] (f32, see above). If `logprob` is non-null, stores
  // log softmax(logits)[token] of the raw distribution (temperature 1, no filtering).
  int32_t sample(const float* logits, int64_t vocab, float* logprob = nullptr);
  // log softmax(logits)[token] (temperature 1, no filtering); draws no random number.
  // What sample() reports, for a token drawn from other logits (a grammar's masked ones).
  float logprob(const float* logits, int64_t vocab, int32_t token);

  uint64_t rng_state() const { return state_; }
  void set_rng_state(uint64_t s) { state_ = s; }
  const SamplingParams& params() const { return params_; }

 private:
  uint64_t next_u64();
  double next_double();          // [0, 1), 53 random bits
  float scale() const;           // 1 / temperature
  size_t top_k(size_t n) const;  // number of top-k candidates (n when off)
  // exp((x - max) * scale) into out (unless null) and blocks_; returns the sum.
  double exp_blocks(const float* x, size_t n, float max, float scale, float* out);
  int32_t draw_all(const float* logits, size_t n, float max, double u, double* raw_sum);
  int32_t draw_nucleus(const float* logits, size_t n, float max, double u, double* raw_sum);
  size_t nucleus_all(size_t n, double target);

  SamplingParams params_;
  uint64_t state_;
  std::vector<float> probs_;    // unnormalised probabilities (vocab or K entries)
  std::vector<float> blocks_;   // per-block sums of probs_
  std::vector<float> vals_;     // gathered logits, then weights, of the candidates
  std::vector<int32_t> cand_;   // candidate token ids (top-k heap / nucleus order)
  std::vector<uint64_t> keys_;  // (probability, token) keys of the nucleus boundary
};

}  // namespace hyperion
