#!/usr/bin/env python3
"""hyperion against llama.cpp on the same GGUF files (docs/QUANTIZATION.md, docs/PERFORMANCE.md).

From a checkpoint directory (bench/random_checkpoint.py writes one of Llama 3.2 1B's shape),
  1. `hyperion convert --to gguf --type bf16` writes the base file,
  2. llama.cpp's llama-quantize makes the Q4_K_M and Q8_0 files from it (llama.cpp's own
     quantisation: "the same files" a user downloads), and `hyperion convert --quant q4_k_m`
     makes ours, which llama-bench must load too,
  3. per file, in alternating rounds (the host's speed drifts: compare side by side),
     llama-bench tg32 and pp512 against `hyperion bench decode --prefill 512` at batch 1,
     and hyperion's batch 16,
  4. perplexity: llama-perplexity -c 128 against `hyperion eval --ppl-chunk 128` on the
     first --ppl-bytes of --text.
The bound is bytes read per token over the bandwidth `hyperion bench peak` measures (its
median over --rounds), the same for every run.

  python3 bench/gguf_vs_llamacpp.py --checkpoint /tmp/l1b/ckpt --llama-bin /tmp/llama-src/build/bin \\
      --workdir /tmp/l1b --text data/corpus/fortunes.txt --json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run(cmd, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-3000:]}")
    return p.stdout, p.stderr


def llama_bench(bin_dir, model, threads, test):
    args = ["-p", "0", "-n", "32"] if test == "tg" else ["-p", "512", "-n", "0"]
    out, _ = run([os.path.join(bin_dir, "llama-bench"), "-m", model, "-t", str(threads), "-r", "1", "-o", "json"] + args)
    return json.loads(out)[0]["avg_ts"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--hyperion", default=os.path.join(os.path.dirname(__file__), "..", "build", "release", "hyperion"))
    ap.add_argument("--text", default=os.path.join(os.path.dirname(__file__), "..", "data", "corpus", "fortunes.txt"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ppl-bytes", type=int, default=12000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    H, w = args.hyperion, args.workdir
    os.makedirs(w, exist_ok=True)
    base = os.path.join(w, "base-bf16.gguf")
    if not os.path.exists(base):
        run([H, "convert", "--checkpoint", args.checkpoint, "--to", "gguf", "--type", "bf16", "--output", base])
    files = {}
    for q in ("Q4_K_M", "Q8_0"):
        f = os.path.join(w, f"llamacpp-{q}.gguf")
        if not os.path.exists(f):
            run([os.path.join(args.llama_bin, "llama-quantize"), base, f, q, str(args.threads)])
        files[q] = f
    ours = os.path.join(w, "hyperion-q4_k_m.gguf")
    if not os.path.exists(ours):
        run([H, "convert", "--checkpoint", args.checkpoint, "--to", "gguf", "--quant", "q4_k_m", "--output", ours])
    env = dict(os.environ, HYPERION_THREADS=str(args.threads))
    bw = []
    for _ in range(args.rounds):
        out, _ = run([H, "bench", "peak", "--json"], env=env)
        bw.append(json.loads(out)["mem_gbps"])
    gbps = statistics.median(bw)
    result = {"threads": args.threads, "read_gbps": gbps, "read_gbps_runs": bw, "files": {}}
    cases = dict(files)
    cases["hyperion-q4_k_m"] = ours
    for name, f in cases.items():
        r = {"file": f, "bytes": os.path.getsize(f), "llama_tg32": [], "llama_pp512": [], "hyperion_tg": [],
             "hyperion_pp512": [], "hyperion_b16": []}
        for _ in range(args.rounds):
            r["llama_tg32"].append(llama_bench(args.llama_bin, f, args.threads, "tg"))
            r["llama_pp512"].append(llama_bench(args.llama_bin, f, args.threads, "pp"))
            out, _ = run([H, "bench", "decode", f, "--batch", "1", "--context-min", "32", "--steps", "32",
                          "--prefill", "512", "--bandwidth-gbps", str(gbps), "--json", "max_seq_len=1024"], env=env)
            d = json.loads(out)
            r["hyperion_tg"].append(d["tokens_per_s"])
            r["hyperion_pp512"].append(d["prefill_tokens_per_s"])
            r["bound_tokens_per_s"] = d["bandwidth_bound_tokens_per_s"]
            r["weight_bytes"] = d["weight_bytes"]
            out, _ = run([H, "bench", "decode", f, "--batch", "16", "--context-min", "32", "--steps", "16",
                          "--bandwidth-gbps", str(gbps), "--json", "max_seq_len=1024"], env=env)
            r["hyperion_b16"].append(json.loads(out)["tokens_per_s"])
        med = {k: statistics.median(r[k]) for k in ("llama_tg32", "llama_pp512", "hyperion_tg", "hyperion_pp512", "hyperion_b16")}
        r["median"] = med
        r["tg_ratio"] = med["hyperion_tg"] / med["llama_tg32"]
        r["pp_ratio"] = med["hyperion_pp512"] / med["llama_pp512"]
        r["fraction_of_bound"] = med["hyperion_tg"] / r["bound_tokens_per_s"]
        r["b16_over_b1"] = med["hyperion_b16"] / med["hyperion_tg"]
        result["files"][name] = r
    # Perplexity on the same file and text.
    text = os.path.join(w, "ppl.txt")
    with open(args.text, "rb") as src, open(text, "wb") as dst:
        dst.write(src.read(args.ppl_bytes))
    ppl = {}
    for name, f in files.items():
        _, err = run([os.path.join(args.llama_bin, "llama-perplexity"), "-m", f, "-f", text, "-c", "128", "-b", "128",
                      "-t", str(args.threads)])
        line = [l for l in err.splitlines() if "Final estimate" in l][0]
        llama = float(line.split("PPL =")[1].split()[0])
        out, _ = run([H, "eval", "--checkpoint", f, "--text", text, "--ppl-chunk", "128", "--json"], env=env)
        ours_ppl = json.loads(out)["perplexity"]
        ppl[name] = {"llama_perplexity": llama, "hyperion": ours_ppl, "relative_difference": abs(ours_ppl - llama) / llama}
    result["perplexity"] = ppl
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"bandwidth {gbps:.1f} GB/s (bench peak, median of {args.rounds})")
        for name, r in result["files"].items():
            m = r["median"]
            print(f"{name}: tg {m['hyperion_tg']:.1f} vs llama.cpp {m['llama_tg32']:.1f} t/s ({r['tg_ratio']:.2f}x, "
                  f"{100 * r['fraction_of_bound']:.0f}% of the bound), pp512 {m['hyperion_pp512']:.1f} vs "
                  f"{m['llama_pp512']:.1f} ({r['pp_ratio']:.2f}x), batch 16 {m['hyperion_b16']:.1f} t/s "
                  f"({r['b16_over_b1']:.1f}x batch 1)")
        for name, p in ppl.items():
            print(f"perplexity {name}: hyperion {p['hyperion']:.4f}, llama-perplexity {p['llama_perplexity']:.4f} "
                  f"({100 * p['relative_difference']:.3f}%)")


if __name__ == "__main__":
    main()
