#!/usr/bin/env python3
"""Structured output under load: what a JSON-schema request costs the server.

Starts `hyperion serve` on CHECKPOINT, then for batch 1 (one request at a time) and batch 16
(16 concurrent requests) runs `hyperion bench serve` with and without --json-schema,
alternating, ROUNDS times. Every request generates exactly OUTPUT tokens (the schema, an
array of at least 200 short strings, cannot end sooner). From /metrics around each run it
takes the engine's step seconds and the seconds spent on grammar masks and steps.

  python3 bench/structured_serve.py --checkpoint CKPT [--hyperion build/release/hyperion]
      [--rounds 2] [--output 64] [--json]

Prints, per batch size: output tokens/s unconstrained and constrained (medians), their
ratio, and the grammar's share of the engine's step time in the constrained runs.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

SCHEMA = {"type": "array", "minItems": 200,
          "items": {"type": "string", "maxLength": 12}}


def metrics(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for name, key in [("hyperion_engine_grammar_seconds_total", "grammar"),
                      ('hyperion_engine_step_seconds_total{kind="decode"}', "decode"),
                      ('hyperion_engine_step_seconds_total{kind="prefill"}', "prefill")]:
        m = re.search(re.escape(name) + r"\s+([0-9.eE+-]+)", text)
        out[key] = float(m.group(1)) if m else 0.0
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--hyperion", default="build/release/hyperion")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    schema_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(SCHEMA, schema_file)
    schema_file.close()
    server = subprocess.Popen([args.hyperion, "serve", args.checkpoint, "--port", str(args.port),
                               "max_concurrent_decodes=16", "max_seq_len=1024",
                               # (the same prompts run twice: no run may reuse another's prefill)
                               "prefix_caching=false"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=2)
                break
            except Exception:
                if server.poll() is not None:
                    sys.exit("serve exited: " + server.stderr.read())
                time.sleep(1)
        results = {}
        for batch, prompts in [(1, 4), (16, 16)]:
            runs = {"plain": [], "json": [], "grammar_share": []}
            for _ in range(args.rounds):
                for mode in ("plain", "json"):
                    cmd = [args.hyperion, "bench", "serve", "--url", f"http://127.0.0.1:{args.port}",
                           "--tokenizer", args.checkpoint, "--num-prompts", str(prompts),
                           "--max-concurrency", str(batch), "--min-input-len", "32", "--max-input-len", "64",
                           "--min-output-len", str(args.output), "--max-output-len", str(args.output), "--json"]
                    if mode == "json":
                        cmd += ["--json-schema", schema_file.name]
                    before = metrics(args.port)
                    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
                    after = metrics(args.port)
                    runs[mode].append(out["output_tokens_per_s"])
                    assert out["total_output_tokens"] == prompts * args.output, out
                    if mode == "json":
                        step = (after["decode"] - before["decode"]) + (after["prefill"] - before["prefill"])
                        runs["grammar_share"].append((after["grammar"] - before["grammar"]) / step)
            plain, constrained = statistics.median(runs["plain"]), statistics.median(runs["json"])
            results[f"batch{batch}"] = {
                "plain_tokens_per_s": plain, "json_tokens_per_s": constrained,
                "ratio": constrained / plain, "grammar_share_of_step": statistics.median(runs["grammar_share"]),
                "runs": runs}
        if args.json:
            print(json.dumps(results, indent=2))
        else:
            for k, r in results.items():
                print(f"{k}: unconstrained {r['plain_tokens_per_s']:.1f} tok/s, JSON schema "
                      f"{r['json_tokens_per_s']:.1f} tok/s ({r['ratio']:.3f}x); grammar "
                      f"{100 * r['grammar_share_of_step']:.2f}% of the step time")
    finally:
        server.terminate()
        server.wait(timeout=60)
        os.unlink(schema_file.name)


if __name__ == "__main__":
    main()
