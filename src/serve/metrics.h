// The inference server's metric set (`GET /metrics`), on the shared registry of
// monitor/metrics_registry.h.
#pragma once

#include <string_view>

#include "monitor/metrics_registry.h"

namespace hyperion::serve {

using monitor::Counter;
using monitor::Gauge;
using monitor::Histogram;
using monitor::Labels;
using monitor::MetricsRegistry;

// hyperion's server metric set (vLLM-like names under `hyperion_`), registered in the
// constructor; members refer to children of `r` and are updated directly, e.g.
// `m.prompt_tokens.inc(n); m.ttft.observe(seconds); m.requests_running.set(k);`.
struct ServerMetrics {
  explicit ServerMetrics(MetricsRegistry& r);

  // Scheduler state (gauges, set by the engine thread each step).
  Gauge& requests_running;       // hyperion_requests_running: requests decoding/prefilling
  Gauge& requests_waiting;       // hyperion_requests_waiting: queued, not yet admitted
  Gauge& slots_used;             // hyperion_slots_used: batch slots occupied
  Gauge& slots_total;            // hyperion_slots_total: batch slots configured
  Gauge& kv_pages_used;          // hyperion_kv_pages_used: KV pages referenced by requests
  Gauge& kv_pages_free;          // hyperion_kv_pages_free: KV pages on the free list
  Gauge& kv_pages_cached;        // hyperion_kv_pages_cached: unreferenced prefix-cache pages
  Gauge& kv_pages_total;         // hyperion_kv_pages_total: pool size
  Gauge& prefix_cache_hit_rate;  // hyperion_prefix_cache_hit_rate: hits / queries, 0..1

  // Totals since start (counters).
  Counter& prefix_cache_queries;  // hyperion_prefix_cache_queries_total: page lookups
  Counter& prefix_cache_hits;     // hyperion_prefix_cache_hits_total: lookups that hit
  Counter& prompt_tokens;         // hyperion_prompt_tokens_total: prefilled prompt tokens
  Counter& generation_tokens;     // hyperion_generation_tokens_total: sampled tokens
  // hyperion_engine_steps_total{kind=decode|prefill} and
  // hyperion_engine_step_seconds_total{kind=...}: engine steps with decode rows only, and
  // those that also prefill prompt chunks, and their wall seconds; with
  // hyperion_engine_forward_seconds_total (the model's part of every step) they show where
  // the engine thread's time goes (prefill against decode, the model against the rest).
  Counter& decode_steps;
  Counter& prefill_steps;
  Counter& decode_step_seconds;
  Counter& prefill_step_seconds;
  Counter& forward_seconds;
  Counter& grammar_seconds;  // structured output's share of the steps

  // hyperion_requests_total{finish_reason=...}: finished requests by reason.
  Counter& finished_stop;    // stop sequence / EOS
  Counter& finished_length;  // max_tokens or context limit
  Counter& finished_abort;   // client went away or cancelled
  Counter& finished_error;   // internal failure
  // hyperion_requests_rejected_total{reason=...}: requests refused before admission.
  Counter& rejected_invalid;     // bad request (HTTP 400)
  Counter& rejected_queue_full;  // queue at capacity (HTTP 429)
  Counter& rejected_draining;    // arrived while the server drains for shutdown (HTTP 503)

  // The HTTP front end.
  Gauge& http_connections;             // hyperion_http_connections: open connections
  Counter& http_connections_rejected;  // hyperion_http_connections_rejected_total: over the cap
  Counter& http_timeouts;              // hyperion_http_timeouts_total: slow or idle clients cut
  Counter& http_bad_requests;          // hyperion_http_bad_requests_total: malformed HTTP

  // Latency histograms, seconds.
  Histogram& ttft;  // hyperion_time_to_first_token_seconds: arrival -> first token
  Histogram& tpot;  // hyperion_time_per_output_token_seconds: gap between later tokens
  Histogram& e2e;   // hyperion_e2e_request_latency_seconds: arrival -> finish

  // The finish-reason counter for "stop", "length", "abort" or "error" (else Error).
  Counter& finished(std::string_view reason);
};

// The image server's own metrics (serve on a diffusion checkpoint), beside ServerMetrics'
// request, rejection, HTTP and latency ones; refreshed from ImageEngineStats at a scrape.
struct ImageMetrics {
  explicit ImageMetrics(MetricsRegistry& r);
  Gauge& images_running;        // hyperion_images_running: images being denoised
  Counter& images_generated;    // hyperion_images_generated_total: images returned
  Counter& steps;               // hyperion_diffusion_steps_total: UNet calls
  Counter& step_images;         // hyperion_diffusion_step_images_total: images over those
                                // calls (/ steps = the mean batch)
  Counter& step_seconds;        // hyperion_diffusion_step_seconds_total: their wall seconds
  Counter& encode_seconds;      // hyperion_diffusion_encode_seconds_total: text encoders
  Counter& decode_seconds;      // hyperion_diffusion_decode_seconds_total: VAE decoder
  Histogram& queue;             // hyperion_image_queue_seconds: arrival -> first step
};

}  // namespace hyperion::serve
