#!/usr/bin/env python3
"""Goodput drill (issue 17, docs/MONITORING.md "Goodput"): a training run that crashes
once (crash_at_step, an abort on the first attempt only) and is resumed by the same
command. The job's event log is then accounted twice: by `hyperion goodput --json` and by
the hand computation below, written from the rules in docs/MONITORING.md and kept apart
from the C++ on purpose. Prints one JSON object with both, the per-process figures the
hand computation used, and the largest difference in seconds.

  python3 bench/goodput_drill.py --hyperion build/release/hyperion
"""
import argparse, json, os, subprocess, sys, tempfile


def hand_goodput(events):
    """Goodput from an event log, step by step as a person would do it on paper."""
    procs = []  # one dict per process_start
    for e in events:
        if e["event"] == "job_start":
            continue
        if e["event"] == "process_start":
            procs.append({"events": []})
        procs[-1]["events"].append(e)
    bad = dict.fromkeys(["program_startup", "initialization", "data_loading", "checkpoint_save",
                         "checkpoint_restore", "wasted_progress", "recovery", "other"], 0.0)
    productive = 0.0
    start_of_job = min(min(e["time"] for e in events),
                       min(p["events"][0].get("launch_time", p["events"][0]["time"])
                           for p in procs))
    end_of_job = max(e["time"] for e in events)
    per_process = []
    for i, p in enumerate(procs):
        ev = p["events"]
        first, last = ev[0], ev[-1]
        launch = min(first.get("launch_time", first["time"]), first["time"])
        by_kind = {}
        for e in ev:
            by_kind.setdefault(e["event"], []).append(e)
        restore = sum(b["time"] - a["time"] for a, b in
                      zip(by_kind.get("restore_start", []), by_kind.get("restore_end", [])))
        init_end = by_kind["init_done"][0]["time"] if "init_done" in by_kind else last["time"]
        saves = sum(b["time"] - a["time"] for a, b in
                    zip(by_kind.get("checkpoint_save_start", []),
                        by_kind.get("checkpoint_save_end", [])))
        # Which steps survive: those up to the step the next process restored.
        kept_up_to = float("inf")
        if i + 1 < len(procs):
            restored = [e["step"] for e in procs[i + 1]["events"] if e["event"] == "restore_end"]
            kept_up_to = restored[-1] if restored else 0
        starts = {e["step"]: e["time"] for e in by_kind.get("step_start", [])}
        kept = lost = 0
        step_s = wait_s = wasted_s = 0.0
        for e in by_kind.get("step_end", []):
            secs = e["time"] - starts[e["step"]]
            wait = min(max(e.get("data_wait_s", 0.0), 0.0), secs)
            if e["step"] <= kept_up_to:
                kept += 1
                step_s += secs
                wait_s += wait
            else:
                lost += 1
                wasted_s += secs
        ended_cleanly = "job_end" in by_kind or "process_end" in by_kind
        unfinished = [s for s in starts if s not in {e["step"] for e in by_kind.get("step_end", [])}]
        if not ended_cleanly and unfinished:  # the step it died in, up to its last event
            wasted_s += last["time"] - starts[max(unfinished)]
        recovery = 0.0
        if i + 1 < len(procs):
            nxt = procs[i + 1]["events"][0]
            recovery = max(0.0, min(nxt.get("launch_time", nxt["time"]), nxt["time"]) - last["time"])
        row = {"launch": launch, "process_start": first["time"], "init_done": init_end,
               "last_event": last["time"], "last_kind": last["event"],
               "startup_s": first["time"] - launch, "restore_s": restore,
               "init_s": max(0.0, init_end - first["time"] - restore), "save_s": saves,
               "steps_kept": kept, "steps_lost": lost, "kept_step_s": step_s,
               "data_wait_s": wait_s, "wasted_s": wasted_s, "recovery_s": recovery}
        per_process.append(row)
        productive += step_s - wait_s
        bad["program_startup"] += row["startup_s"]
        bad["checkpoint_restore"] += restore
        bad["initialization"] += row["init_s"]
        bad["checkpoint_save"] += saves
        bad["data_loading"] += wait_s
        bad["wasted_progress"] += wasted_s
        bad["recovery"] += recovery
    total = end_of_job - start_of_job
    bad["other"] = max(0.0, total - productive - sum(bad.values()))
    return {"total_s": total, "productive_s": productive, "goodput": productive / total,
            "badput_s": bad, "processes": per_process}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hyperion", default="build/release/hyperion")
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--crash-at", type=int, default=15)
    ap.add_argument("--checkpoint-period", type=int, default=10)
    ap.add_argument("--json", action="store_true", help="(the output is always JSON)")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="goodput_drill_")
    cmd = [a.hyperion, "train", a.config, f"steps={a.steps}", "log_period=5",
           f"checkpoint_period={a.checkpoint_period}", "sample_count=0", "eval_batches=1",
           f"crash_at_step={a.crash_at}", f"base_output_directory={root}", "run_name=drill"]
    with open(os.path.join(root, "train.log"), "w") as log:
        first = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
        second = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if first.returncode == 0 or second.returncode != 0:
        sys.exit(f"goodput_drill: expected a crash then a clean resume, got exit codes "
                 f"{first.returncode} and {second.returncode} (log {root}/train.log)")
    run = os.path.join(root, "drill")
    cli = json.loads(subprocess.check_output([a.hyperion, "goodput", run, "--json"]))
    events = [json.loads(l) for l in open(os.path.join(run, "events.jsonl")) if l.strip()]
    hand = hand_goodput(events)
    diffs = [abs(cli["total_s"] - hand["total_s"]), abs(cli["productive_s"] - hand["productive_s"])]
    diffs += [abs(cli["badput"][k]["seconds"] - v) for k, v in hand["badput_s"].items()]
    print(json.dumps({
        "command": " ".join(cmd), "run_dir": run,
        "first_exit_code": first.returncode, "events": len(events),
        "crash_events": sum(e["event"] == "crash" for e in events),
        "stack_dumps": sorted(os.listdir(os.path.join(run, "stacks")))
        if os.path.isdir(os.path.join(run, "stacks")) else [],
        "hyperion_goodput": cli, "hand": hand, "max_abs_difference_s": max(diffs),
    }, indent=1))


if __name__ == "__main__":
    main()
