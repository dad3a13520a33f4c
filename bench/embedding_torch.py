#!/usr/bin/env python3
"""PyTorch nn.EmbeddingBag speed, the peer of `hyperion bench embedding`.

Measures CPU PyTorch (Debian's python3-torch) on the same cases as hyperion's embedding-bag
bench: forward pooling, and backward + sparse optimizer update with Adagrad and with SGD.
The cases are the CASES list below; keep it in sync with hyperion's bench.

Run with Debian's python (the one with torch), from anywhere:
    /usr/bin/python3 bench/embedding_torch.py [--threads N] [--seconds S] [--json]
        [--cases NAME[,NAME...]] [--zipf A] [--id-sets K] [--seed S]
The two "large" cases hold 2 x 4M x 128 f32 tables (4 GB) plus, while Adagrad runs, the
same again of Adagrad state (8 GB peak); the small cases need well under 1 GB.

What one case does (T = tables, B = batch = bags per call, L = bag = ids per bag, D = dim):
  tables  T separate nn.EmbeddingBag(rows, D, mode="sum", sparse=True) modules, f32, looked
          up one after the other in each call (torch has no table-batched CPU op);
          per_sample_weights none; offsets = [0, L, 2L, ...] (fixed bag sizes).
  ids     int64, uniform in [0, rows) by default (the memory-bound worst case); with
          --zipf A, bounded power law P(rank k) ~ 1 / k^A over k = 1..rows, ranks mapped to
          rows through a fixed random permutation (hot rows scattered over the table).
          K = --id-sets (default 8) independent id batches are drawn per table and cycled
          call by call, so consecutive calls do not reuse the same rows. The pool touches
          about K * T * B * L * D * 4 bytes (64 MiB for large-d128-bag1 at K = 8): where the
          last-level cache is larger than that, rows come from cache, not DRAM; raise K
          past the LLC size for a DRAM-bound figure (hyperion's bench should use the same K).
  forward   time of one call = T lookups `bag(ids, offsets)` -> [B, D] f32 each, under
            torch.no_grad() (inference).
  adagrad   time of one call = T x (forward with autograd + out.backward(G_t)) +
            opt.step() + opt.zero_grad(set_to_none=True), torch.optim.Adagrad(lr=0.01) over
            all T weights (its sparse-gradient path); G_t a fixed random [B, D] f32 output
            gradient per table. Reported adagrad_update_s = that time - forward_train_s,
            where forward_train_s is the same T forwards with autograd on (no backward):
            i.e. backward + update without the forward.
  sgd       the same with torch.optim.SGD(lr=0.01), no momentum (sparse gradients).
Timing: 2 warm-up calls, then calls until --seconds have passed (at least 3); the median
seconds per call is reported. Figures per call over all T tables:

  lookups               ids per call = T * B * L; *_lookups_per_s = that / seconds.
  forward bytes         per table: ids * D * sizeof(row dtype) (every id's row read, f32 = 4,
                        repeated ids counted again) + B * D * 4 (pooled output written).
  update bytes (Adagrad) per table: unique_rows * D * 4 * 4 (each touched row of the weight
                        read + written, and of the Adagrad state read + written)
                        + B * D * 4 (the output gradient read).
  update bytes (SGD)    per table: unique_rows * D * 4 * 2 (weight row read + written)
                        + B * D * 4 (output gradient read).
  unique_rows is counted per call: the distinct ids in that table's id batch (torch.unique),
  averaged over the K id sets. Not counted: ids/offsets reads, the sparse-gradient
  intermediates torch materialises (per-id gradient rows, coalescing), Adagrad's squared
  gradient temporaries. *_gbps = bytes / seconds / 1e9 with the time of that phase
  (forward_s for forward, *_update_s for the updates).
"""

import argparse
import gc
import json
import os
import statistics
import sys
import time

try:
    import torch
except ImportError:  # the pyenv python3 on PATH has no torch; Debian's python3-torch does
    sys.exit("embedding_torch.py: no torch in %s; run it with /usr/bin/python3" % sys.executable)

# name, rows, dim, ids per bag, bags per call, tables. Same shapes as `hyperion bench embedding`.
CASES = [
    {"name": "small-d64-bag1", "rows": 100000, "dim": 64, "bag": 1, "batch": 4096, "tables": 8},
    {"name": "small-d128-bag20", "rows": 100000, "dim": 128, "bag": 20, "batch": 2048, "tables": 4},
    {"name": "large-d128-bag1", "rows": 4000000, "dim": 128, "bag": 1, "batch": 8192, "tables": 2},
    {"name": "large-d128-bag20", "rows": 4000000, "dim": 128, "bag": 20, "batch": 2048, "tables": 2},
]

ROW_BYTES = 4  # f32 tables
LR = 0.01
WARMUP_CALLS = 2
MIN_CALLS = 3


def draw_ids(gen, rows, n, zipf, sampler_cache):
    """n int64 ids in [0, rows): uniform, or bounded power law with exponent zipf."""
    if not zipf:
        return torch.randint(0, rows, (n,), dtype=torch.int64, generator=gen)
    key = (rows, zipf)
    if key not in sampler_cache:
        w = torch.arange(1, rows + 1, dtype=torch.float64).pow_(-zipf)
        cdf = torch.cumsum(w, 0)
        cdf /= cdf[-1].clone()
        perm = torch.randperm(rows, generator=gen)
        sampler_cache[key] = (cdf, perm)
    cdf, perm = sampler_cache[key]
    u = torch.rand(n, dtype=torch.float64, generator=gen)
    rank = torch.searchsorted(cdf, u).clamp_(max=rows - 1)
    return perm[rank]


def time_calls(fn, seconds):
    """Median seconds per call of fn(i) after WARMUP_CALLS; fn gets the call index."""
    i = 0
    for _ in range(WARMUP_CALLS):
        fn(i)
        i += 1
    times = []
    t_end = time.perf_counter() + seconds
    while len(times) < MIN_CALLS or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
        i += 1
    return statistics.median(times), len(times)


def run_case(c, args, sampler_cache):
    rows, dim, bag, batch, tables = c["rows"], c["dim"], c["bag"], c["batch"], c["tables"]
    gen = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    n_ids = batch * bag
    offsets = torch.arange(0, n_ids, bag, dtype=torch.int64)
    bags = [torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True) for _ in range(tables)]
    # ids[k][t]: id set k of table t
    ids = [[draw_ids(gen, rows, n_ids, args.zipf, sampler_cache) for _ in range(tables)]
           for _ in range(args.id_sets)]
    grads = [torch.randn(batch, dim, generator=gen) for _ in range(tables)]
    unique_rows = statistics.mean(torch.unique(x).numel() for s in ids for x in s)  # per table per call
    K = args.id_sets

    def forward(i):
        s = ids[i % K]
        with torch.no_grad():
            for t in range(tables):
                bags[t](s[t], offsets)

    def forward_train(i):
        s = ids[i % K]
        for t in range(tables):
            bags[t](s[t], offsets)

    def make_train(opt):
        def train(i):
            s = ids[i % K]
            for t in range(tables):
                out = bags[t](s[t], offsets)
                out.backward(grads[t])
            opt.step()
            opt.zero_grad(set_to_none=True)
        return train

    params = [b.weight for b in bags]
    fwd_s, fwd_n = time_calls(forward, args.seconds)
    fwd_train_s, _ = time_calls(forward_train, args.seconds)

    opt = torch.optim.Adagrad(params, lr=LR)
    ada_total_s, ada_n = time_calls(make_train(opt), args.seconds)
    del opt  # frees the Adagrad state (as large as the tables) before SGD
    gc.collect()
    opt = torch.optim.SGD(params, lr=LR)
    sgd_total_s, sgd_n = time_calls(make_train(opt), args.seconds)
    del opt, bags, params
    gc.collect()

    lookups = tables * n_ids
    fwd_bytes = tables * (n_ids * dim * ROW_BYTES + batch * dim * 4)
    ada_bytes = tables * (unique_rows * dim * 4 * 4 + batch * dim * 4)
    sgd_bytes = tables * (unique_rows * dim * 4 * 2 + batch * dim * 4)
    ada_s = ada_total_s - fwd_train_s
    sgd_s = sgd_total_s - fwd_train_s

    def per_s(x, s):
        return x / s if s > 0 else float("nan")

    return {
        "name": c["name"], "rows": rows, "dim": dim, "bag": bag, "batch": batch, "tables": tables,
        "forward_s": fwd_s,
        "forward_lookups_per_s": per_s(lookups, fwd_s),
        "forward_gbps": per_s(fwd_bytes, fwd_s) / 1e9,
        "adagrad_update_s": ada_s,
        "adagrad_lookups_per_s": per_s(lookups, ada_s),
        "adagrad_gbps": per_s(ada_bytes, ada_s) / 1e9,
        "sgd_update_s": sgd_s,
        "sgd_lookups_per_s": per_s(lookups, sgd_s),
        "sgd_gbps": per_s(sgd_bytes, sgd_s) / 1e9,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        # supporting figures
        "lookups_per_call": lookups,
        "unique_rows_per_table": unique_rows,
        "forward_bytes": fwd_bytes,
        "adagrad_bytes": ada_bytes,
        "sgd_bytes": sgd_bytes,
        "forward_train_s": fwd_train_s,
        "adagrad_total_s": ada_total_s,
        "sgd_total_s": sgd_total_s,
        "calls": {"forward": fwd_n, "adagrad": ada_n, "sgd": sgd_n},
        "zipf": args.zipf,
    }


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="cases: " + ", ".join(c["name"] for c in CASES))
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--seconds", type=float, default=1.0, help="timed seconds per phase per case (default 1.0)")
    ap.add_argument("--json", action="store_true", help="print one JSON object {..., \"cases\": [...]}")
    ap.add_argument("--cases", nargs="+", metavar="NAME",
                    help="run only these cases (names, space- or comma-separated)")
    ap.add_argument("--zipf", type=float, default=0.0, metavar="A",
                    help="power-law ids with exponent A > 0 instead of uniform (default off)")
    ap.add_argument("--id-sets", type=int, default=8, metavar="K",
                    help="independent id batches per table, cycled call by call (default 8)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.threads < 1 or args.seconds < 0 or args.id_sets < 1 or args.zipf < 0:
        ap.error("need --threads >= 1, --seconds >= 0, --id-sets >= 1, --zipf >= 0")

    cases = CASES
    if args.cases:
        names = [n for arg in args.cases for n in arg.split(",") if n]
        known = {c["name"]: c for c in CASES}
        bad = [n for n in names if n not in known]
        if bad:
            ap.error("unknown case(s) %s; known: %s" % (", ".join(bad), ", ".join(known)))
        cases = [known[n] for n in names]

    torch.set_num_threads(args.threads)
    sampler_cache = {}
    results = []
    if not args.json:
        print("torch %s, %d threads, %s, ids %s, %.2f s per phase" % (
            torch.__version__, torch.get_num_threads(), cpu_model() or "cpu ?",
            "zipf %g" % args.zipf if args.zipf else "uniform", args.seconds))
        hdr = "%-18s %9s %8s %7s | %9s %8s %7s | %9s %8s %7s" % (
            "case", "fwd ms", "Mlook/s", "GB/s", "adagr ms", "Mlook/s", "GB/s", "sgd ms", "Mlook/s", "GB/s")
        print(hdr)
        print("-" * len(hdr))
        sys.stdout.flush()
    for c in cases:
        r = run_case(c, args, sampler_cache)
        sampler_cache.clear()
        results.append(r)
        if not args.json:
            print("%-18s %9.3f %8.1f %7.2f | %9.3f %8.1f %7.2f | %9.3f %8.1f %7.2f" % (
                r["name"],
                r["forward_s"] * 1e3, r["forward_lookups_per_s"] / 1e6, r["forward_gbps"],
                r["adagrad_update_s"] * 1e3, r["adagrad_lookups_per_s"] / 1e6, r["adagrad_gbps"],
                r["sgd_update_s"] * 1e3, r["sgd_lookups_per_s"] / 1e6, r["sgd_gbps"]))
            sys.stdout.flush()
    if args.json:
        print(json.dumps({
            "bench": "embedding_torch",
            "torch_version": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu": cpu_model(),
            "seconds": args.seconds,
            "zipf": args.zipf,
            "id_sets": args.id_sets,
            "seed": args.seed,
            "cases": results,
        }, indent=2))
    else:
        print("ms per call over all tables; adagrad/sgd = backward + update (forward excluded).")


if __name__ == "__main__":
    main()
