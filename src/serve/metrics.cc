#include "serve/metrics.h"

#include "base/error.h"

namespace hyperion::serve {

namespace {
const std::vector<double> kTtftBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                          0.5,   1,      2.5,   5,    10,    30,   60};
const std::vector<double> kTpotBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                          0.075, 0.1,    0.25,  0.5,  1};
const std::vector<double> kE2eBuckets = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,  2.5,
                                         5,    10,    20,   30,  60,   120, 300};
const char* const kFinishedHelp = "Finished requests by finish reason.";
const char* const kRejectedHelp = "Requests rejected before admission, by reason.";
const char* const kStepsHelp =
    "Engine steps: decode rows only (kind=decode), or also prompt chunks (kind=prefill).";
const char* const kStepSecondsHelp =
    "Wall seconds of engine steps (batch, model, sampling, queueing tokens), by kind.";
}  // namespace

ServerMetrics::ServerMetrics(MetricsRegistry& r)
    : requests_running(
          r.gauge("hyperion_requests_running", "Requests currently prefilling or decoding.")),
      requests_waiting(
          r.gauge("hyperion_requests_waiting", "Requests queued and not yet admitted.")),
      slots_used(r.gauge("hyperion_slots_used", "Batch slots occupied by requests.")),
      slots_total(r.gauge("hyperion_slots_total", "Batch slots configured.")),
      kv_pages_used(r.gauge("hyperion_kv_pages_used", "KV cache pages referenced by requests.")),
      kv_pages_free(r.gauge("hyperion_kv_pages_free", "KV cache pages on the free list.")),
      kv_pages_cached(r.gauge("hyperion_kv_pages_cached",
                              "Unreferenced KV cache pages kept for prefix reuse (evictable).")),
      kv_pages_total(r.gauge("hyperion_kv_pages_total", "KV cache pages in the pool.")),
      prefix_cache_hit_rate(r.gauge("hyperion_prefix_cache_hit_rate",
                                    "Prefix cache hits / queries since start (0..1).")),
      prefix_cache_queries(
          r.counter("hyperion_prefix_cache_queries_total", "Prefix cache page lookups.")),
      prefix_cache_hits(
          r.counter("hyperion_prefix_cache_hits_total", "Prefix cache page lookups that hit.")),
      prompt_tokens(r.counter("hyperion_prompt_tokens_total", "Prompt tokens prefilled.")),
      generation_tokens(
          r.counter("hyperion_generation_tokens_total", "Tokens generated (sampled).")),
      decode_steps(r.counter("hyperion_engine_steps_total", kStepsHelp, {{"kind", "decode"}})),
      prefill_steps(r.counter("hyperion_engine_steps_total", kStepsHelp, {{"kind", "prefill"}})),
      decode_step_seconds(
          r.counter("hyperion_engine_step_seconds_total", kStepSecondsHelp, {{"kind", "decode"}})),
      prefill_step_seconds(
          r.counter("hyperion_engine_step_seconds_total", kStepSecondsHelp, {{"kind", "prefill"}})),
      forward_seconds(r.counter("hyperion_engine_forward_seconds_total",
                                "Wall seconds of the model's forward passes in engine steps.")),
      grammar_seconds(r.counter("hyperion_engine_grammar_seconds_total",
                                "Wall seconds of structured-output grammar masks and steps in engine "
                                "steps.")),
      finished_stop(
          r.counter("hyperion_requests_total", kFinishedHelp, {{"finish_reason", "stop"}})),
      finished_length(
          r.counter("hyperion_requests_total", kFinishedHelp, {{"finish_reason", "length"}})),
      finished_abort(
          r.counter("hyperion_requests_total", kFinishedHelp, {{"finish_reason", "abort"}})),
      finished_error(
          r.counter("hyperion_requests_total", kFinishedHelp, {{"finish_reason", "error"}})),
      rejected_invalid(
          r.counter("hyperion_requests_rejected_total", kRejectedHelp, {{"reason", "invalid"}})),
      rejected_queue_full(
          r.counter("hyperion_requests_rejected_total", kRejectedHelp, {{"reason", "queue_full"}})),
      rejected_draining(
          r.counter("hyperion_requests_rejected_total", kRejectedHelp, {{"reason", "draining"}})),
      http_connections(r.gauge("hyperion_http_connections", "Open HTTP connections.")),
      http_connections_rejected(
          r.counter("hyperion_http_connections_rejected_total",
                    "Connections refused (HTTP 503) because max_connections were open.")),
      http_timeouts(r.counter("hyperion_http_timeouts_total",
                              "Connections closed because a request or a write was too slow, "
                              "or a keep-alive connection sat idle.")),
      http_bad_requests(r.counter("hyperion_http_bad_requests_total",
                                  "Requests rejected as malformed HTTP (HTTP 400/413/431).")),
      ttft(r.histogram("hyperion_time_to_first_token_seconds",
                       "Time from request arrival to its first generated token.", kTtftBuckets)),
      tpot(r.histogram("hyperion_time_per_output_token_seconds",
                       "Time between consecutive generated tokens after the first.", kTpotBuckets)),
      e2e(r.histogram("hyperion_e2e_request_latency_seconds",
                      "Time from request arrival to its finish.", kE2eBuckets)) {}

ImageMetrics::ImageMetrics(MetricsRegistry& r)
    : images_running(r.gauge("hyperion_images_running", "Images being denoised.")),
      images_generated(r.counter("hyperion_images_generated_total", "Images generated and returned.")),
      steps(r.counter("hyperion_diffusion_steps_total", "UNet calls (one denoising step of a batch).")),
      step_images(r.counter("hyperion_diffusion_step_images_total",
                            "Images over all UNet calls (divided by the calls: the mean batch).")),
      step_seconds(r.counter("hyperion_diffusion_step_seconds_total", "Wall seconds of UNet calls.")),
      encode_seconds(
          r.counter("hyperion_diffusion_encode_seconds_total", "Wall seconds of prompt encoding.")),
      decode_seconds(
          r.counter("hyperion_diffusion_decode_seconds_total", "Wall seconds of VAE decoding.")),
      queue(r.histogram("hyperion_image_queue_seconds", "Time from request arrival to its first step.",
                        kE2eBuckets)) {}

Counter& ServerMetrics::finished(std::string_view reason) {
  if (reason == "stop") return finished_stop;
  if (reason == "length") return finished_length;
  if (reason == "abort") return finished_abort;
  if (reason == "error") return finished_error;
  fail("ServerMetrics::finished: unknown finish reason '{}' (stop, length, abort, error)", reason);
}

}  // namespace hyperion::serve
