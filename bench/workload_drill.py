#!/usr/bin/env python3
"""Workload restart drill (issue 18, docs/ORCHESTRATION.md): a 2-rank `hyperion train`
workload on a cluster; once it has passed a checkpoint, rank 1 is killed with SIGKILL.
Reports, from the run's event log, the time from the kill to the workload's restart, to
the new process's start, to the restored checkpoint and to the first step it finished,
and the steps lost (finished after the checkpoint that was restored). Prints one JSON
object per backend.

  python3 bench/workload_drill.py --hyperion build/release/hyperion [--backend local|slurm|both]

The slurm backend starts its own one-node Slurm (as tests/launch/slurm_workload_test.py
does; root and Debian's slurm-wlm and munge needed).
"""
import argparse, json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "launch"))
import slurm_workload_test as slurm_test  # noqa: E402  (its Slurm and helpers)


def events(run_dir):
    with open(os.path.join(run_dir, "events.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def session_rank_pid(sid, rank):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) != sid:
                continue
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "hyperion":
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(pid)
    return 0


def drill(a, backend, hy, home, kill_after_step):
    root = os.path.join(home, "runs")
    run = f"drill-{backend}"
    cmd = (f"{hy.binary} train {a.config} steps={a.steps} log_period=5 "
           f"checkpoint_period={a.checkpoint_period} sample_count=0 eval_batches=1 "
           f"peak_tflops=1 base_output_directory={root} run_name={run}")
    hy("workload", "create", "--cluster", "hy", "--workload", "drill", "--nproc", "2",
       "--max-restarts", "3", "--command", cmd)
    run_dir = os.path.join(root, run)

    def steps_done():
        try:
            return max([e["step"] for e in events(run_dir) if e["event"] == "step_end"] + [0])
        except (OSError, ValueError):
            return 0

    slurm_test.wait_for(f"step {kill_after_step}", lambda: steps_done() >= kill_after_step,
                        900, 0.05)
    st = hy.status("drill")
    if backend == "slurm":
        victim = slurm_test.wait_for("rank 1", lambda: slurm_test.rank_pid(st["slurm_job_id"], 1), 30)
    else:
        victim = slurm_test.wait_for("rank 1", lambda: session_rank_pid(st["pid"], 1), 30)
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    s = hy.reaches("drill", "succeeded", 1800)
    ev = events(run_dir)
    before = [e for e in ev if e["time"] < killed_at]
    after = [e for e in ev if e["time"] >= killed_at]
    last_done = max(e["step"] for e in before if e["event"] == "step_end")
    restart = next(e for e in after if e["event"] == "process_start")
    restored = next(e for e in after if e["event"] == "restore_end")
    first_step = next(e for e in after if e["event"] == "step_end")
    log = open(os.path.join(home, "clusters", "hy", "workloads", "drill", "output.log")).read()
    goodput = json.loads(hy("goodput", run_dir, "--json"))
    return {
        "backend": backend,
        "command": cmd,
        "killed_after_step": last_done,
        "restored_step": restored["step"],
        "steps_lost": last_done - restored["step"],
        "kill_to_process_start_s": restart["launch_time"] - killed_at,
        "kill_to_restored_s": restored["time"] - killed_at,
        "kill_to_first_resumed_step_s": first_step["time"] - killed_at,
        "first_resumed_step": first_step["step"],
        "restarts": s["restarts"],
        "attempts": s["attempts"],
        "step_s_median": statistics.median(
            e2["time"] - e1["time"] for e1, e2 in zip(ev, ev[1:])
            if e1["event"] == "step_start" and e2["event"] == "step_end"),
        "restart_line": next(l for l in log.splitlines() if "restart 1 of" in l),
        "goodput": goodput["goodput"],
        "wasted_progress_s": goodput["badput"]["wasted_progress"]["seconds"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hyperion", default="build/release/hyperion")
    ap.add_argument("--backend", default="both", choices=["local", "slurm", "both"])
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--checkpoint-period", type=int, default=10)
    ap.add_argument("--kill-after-step", type=int, default=25)
    ap.add_argument("--json", action="store_true", help="(the output is always JSON)")
    a = ap.parse_args()
    os.environ["PATH"] += ":/usr/sbin"
    results = []
    for backend in (["local", "slurm"] if a.backend == "both" else [a.backend]):
        tmp = tempfile.mkdtemp(prefix=f"workload_drill_{backend}_")
        home = os.path.join(tmp, "home")
        os.makedirs(home)
        env = dict(os.environ, HYPERION_HOME=home)
        slurm = None
        try:
            if backend == "slurm":
                slurm = slurm_test.Slurm(os.path.join(tmp, "slurm"))
                os.makedirs(slurm.root)
                slurm.start()
                env.update(slurm.env)
            hy = slurm_test.Hyperion(os.path.abspath(a.hyperion), env, home)
            hy("cluster", "create", "--cluster", "hy", "--backend", backend)
            results.append(drill(a, backend, hy, home, a.kill_after_step))
            hy("cluster", "delete", "--cluster", "hy")
        finally:
            if slurm:
                slurm.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
