#!/usr/bin/env python3
"""Straggler drill (issue 17, docs/MONITORING.md): a 2-rank `hyperion train --nproc 2` run
in which rank 1 is throttled from outside with SIGSTOP/SIGCONT cycles (stopped for
`--duty` of every `--cycle-ms`), starting at step `--throttle-at`. Reports the first
ranks.jsonl gather that names rank 1 a straggler, in log periods after the throttling
began, and the per-rank compute times rank 0 saw. Prints one JSON object.

  python3 bench/straggler_drill.py --hyperion build/release/hyperion
"""
import argparse, json, os, re, signal, subprocess, sys, tempfile, threading, time


def read_jsonl(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line being written
    except FileNotFoundError:
        pass
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hyperion", default="build/release/hyperion")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--log-period", type=int, default=5)
    ap.add_argument("--throttle-at", type=int, default=20)
    ap.add_argument("--duty", type=float, default=0.6, help="fraction of each cycle stopped")
    ap.add_argument("--cycle-ms", type=float, default=100)
    ap.add_argument("--json", action="store_true", help="(the output is always JSON)")
    a = ap.parse_args()

    root = tempfile.mkdtemp(prefix="straggler_drill_")
    run = os.path.join(root, "drill")
    cmd = [a.hyperion, "train", "tiny", "--nproc", "2", "--allow-run-as-root",
           f"steps={a.steps}", f"log_period={a.log_period}", "sample_count=0",
           "eval_interval=0", "eval_batches=1", "checkpoint_period=0", "enable_checkpointing=false",
           "per_device_batch_size=4", f"base_output_directory={root}", "run_name=drill"]
    log = open(os.path.join(root, "train.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    # Rank 1's pid from its log line "rank 1 of 2: pid N".
    pid = None
    deadline = time.time() + 300
    while pid is None and time.time() < deadline and proc.poll() is None:
        try:
            with open(os.path.join(run, "logs", "rank-1.log")) as f:
                m = re.search(r"rank 1 of 2: pid (\d+)", f.read())
                pid = int(m.group(1)) if m else None
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    if pid is None:
        sys.exit(f"straggler_drill: rank 1 never started (log {log.name})")

    # Throttle from step --throttle-at on.
    while proc.poll() is None:
        rows = read_jsonl(os.path.join(run, "metrics.jsonl"))
        if rows and rows[-1]["step"] >= a.throttle_at:
            break
        time.sleep(0.02)
    start_step = read_jsonl(os.path.join(run, "metrics.jsonl"))[-1]["step"]
    stop = threading.Event()

    def throttle():
        stopped_s = a.cycle_ms * a.duty / 1000.0
        running_s = a.cycle_ms * (1 - a.duty) / 1000.0
        while not stop.is_set() and proc.poll() is None:
            try:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(stopped_s)
                os.kill(pid, signal.SIGCONT)
                time.sleep(running_s)
            except ProcessLookupError:
                return

    t = threading.Thread(target=throttle)
    t.start()
    named_at = None
    while proc.poll() is None and named_at is None:
        for g in read_jsonl(os.path.join(run, "ranks.jsonl")):
            if g["step"] > start_step and any(s["rank"] == 1 for s in g["stragglers"]):
                named_at = g
                break
        time.sleep(0.05)
    stop.set()
    t.join()
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    proc.wait(timeout=600)
    log.close()

    gathers = read_jsonl(os.path.join(run, "ranks.jsonl"))
    # The first gather whose whole window was throttled: the periods count from there.
    first_full = next((g["step"] for g in gathers if g["step"] - g["steps"] >= start_step), None)
    out = {
        "machine_cores": os.cpu_count(),
        "throttle_started_after_step": start_step,
        "duty": a.duty, "cycle_ms": a.cycle_ms, "log_period": a.log_period,
        "named_at_step": named_at["step"] if named_at else None,
        "periods_after_throttle": (None if named_at is None else
                                   (named_at["step"] - start_step) / a.log_period),
        "periods_after_first_full_window": (None if named_at is None or first_full is None else
                                            (named_at["step"] - first_full) / a.log_period + 1),
        "straggler": named_at["stragglers"][0] if named_at else None,
        "compute_s_by_rank_before": next(([r["compute_s_mean"] for r in g["ranks"]]
                                          for g in gathers if g["step"] <= start_step), None),
        "compute_s_by_rank_at_detection": ([r["compute_s_mean"] for r in named_at["ranks"]]
                                           if named_at else None),
        "false_alarms_before_throttle": sum(1 for g in gathers
                                            if g["step"] <= start_step and g["stragglers"]),
        "gathers_before_throttle": sum(1 for g in gathers if g["step"] <= start_step),
        "exit_code": proc.returncode,
        "log": log.name,
    }
    log_text = open(log.name).read()
    m = re.search(r"straggler: rank 1[^\n]*", log_text)
    out["log_line"] = m.group(0) if m else None
    print(json.dumps(out, indent=1))
    return 0 if named_at else 1


if __name__ == "__main__":
    sys.exit(main())
