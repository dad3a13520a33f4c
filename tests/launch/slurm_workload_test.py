#!/usr/bin/env python3
"""Integration test (issue 18): `hyperion cluster` and `hyperion workload` against a real
Slurm. Writes a one-node slurm.conf for this machine in a temporary directory, starts
munged, slurmctld and slurmd from Debian's slurm-wlm and munge (installed by
scripts/setup.sh) on free ports, runs the workload drills against them, and stops them.
Exits 77 (a visible CTest skip) when Slurm is not installed or this is not root (slurmd
must start job steps as their user).

Drills: a user error is not restarted and status says why; rank 1 of a 2-rank training is
SIGKILLed and the workload restarts and ends with the unbroken run's loss; a high-priority
workload preempts a low one, which is requeued, resumes from its checkpoint and finishes;
delete leaves no process behind; cluster delete removes the partitions it made.

  tests/launch/slurm_workload_test.py --hyperion build/release/hyperion --source-dir .
"""
import argparse, json, os, shutil, signal, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slurm_daemons import (Hyperion, Slurm, last_metrics, missing_tools,  # noqa: E402
                           train_command, wait_for)

def processes_with(marker):
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    out.append(int(pid))
        except OSError:
            pass
    return out


def rank_pid(job_id, rank):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "hyperion":
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in env and f"SLURM_PROCID={rank}".encode() in env:
            return int(pid)
    return 0


def drills(hy, slurm, source_dir, home):
    out = hy("cluster", "create", "--cluster", "hy", "--backend", "slurm")
    assert "partitions hy-low, hy, hy-high" in out, out
    d = json.loads(hy("cluster", "describe", "--cluster", "hy", "--json"))
    assert d["backend"] == "slurm" and d["slurm"]["preemption"], d
    assert d["cores"] >= 2, d
    hy("cluster", "create", "--cluster", "hy", "--backend", "slurm", code=2)
    print("cluster: created, partitions hy-low/hy/hy-high, preemption on")

    # A user error: not restarted, and status says why with the output before it.
    hy("workload", "create", "--cluster", "hy", "--workload", "oops", "--max-restarts", "3",
       "--command", "echo reading the config; echo 'error: bad key' >&2; exit 1")
    s = hy.reaches("oops", "failed")
    assert s["restarts"] == 0 and s["last_exit_code"] == 1, s
    assert "a user error, not restarted" in s["reason"], s
    assert any("error: bad key" in l for l in s["last_log_lines"]), s
    assert s["backend"] == "slurm" and s["cluster"] == "hy" and s["workload"] == "oops", s
    print("user error: failed, not restarted:", s["reason"])

    # SIGKILL of rank 1 after the step-50 checkpoint: restart, resume, same final loss.
    root = os.path.join(home, "runs")
    steps = 600  # about 4 s here: time to kill a rank mid-run
    hy("workload", "create", "--cluster", "hy", "--workload", "ref", "--nproc", "2",
       "--command", train_command(hy.binary, source_dir, root, "ref", steps))
    hy.reaches("ref", "succeeded", 600)
    hy("workload", "create", "--cluster", "hy", "--workload", "drill", "--nproc", "2",
       "--max-restarts", "2", "--command",
       train_command(hy.binary, source_dir, root, "drill", steps))
    wait_for("the step-50 checkpoint",
             lambda: os.path.exists(os.path.join(root, "drill", "checkpoints", "50")), 600, 0.02)
    job = hy.status("drill")["slurm_job_id"]
    victim = wait_for("rank 1", lambda: rank_pid(job, 1), 30)
    os.kill(victim, signal.SIGKILL)
    s = hy.reaches("drill", "succeeded", 600)
    assert s["restarts"] == 1 and s["attempts"] == 2, s
    log = open(os.path.join(home, "clusters/hy/workloads/drill/output.log")).read()
    assert "a system failure; restart 1 of 2" in log and "resume: from" in log, log[-3000:]
    ref, drill = last_metrics(os.path.join(root, "ref")), last_metrics(os.path.join(root, "drill"))
    assert ref["step"] == steps and drill["step"] == steps, (ref, drill)
    assert ref["loss"] == drill["loss"], (ref, drill)
    print(f"killed rank: restarted once, final loss {drill['loss']} == unbroken {ref['loss']}")

    # Priorities: high preempts low (Slurm requeues it), low resumes from its checkpoint.
    # Long enough (about 15 s) to be running when the urgent one arrives.
    long_steps = 2000
    hy("workload", "create", "--cluster", "hy", "--workload", "background", "--priority", "low",
       "--nproc", "2", "--command",
       train_command(hy.binary, source_dir, root, "background", long_steps, 100))
    wait_for("background's step-50 checkpoint",
             lambda: os.path.exists(os.path.join(root, "background", "checkpoints", "100")), 600,
             0.02)
    hy("workload", "create", "--cluster", "hy", "--workload", "urgent", "--priority", "high",
       "--nproc", "2", "--command", "sleep 1; echo urgent done")
    s = hy.reaches("background", "preempted", 120)
    assert "requeued" in s["reason"], s
    print("preempted:", s["reason"])
    hy.reaches("urgent", "succeeded", 300)
    s = hy.reaches("background", "succeeded", 600)
    assert s["restarts"] == 0 and s["preemptions"] >= 1, s
    log = open(os.path.join(home, "clusters/hy/workloads/background/output.log")).read()
    assert "requeued by Slurm" in log and "resume: from" in log, log[-3000:]
    assert last_metrics(os.path.join(root, "background"))["step"] == long_steps
    print("preempted workload resumed and finished")

    # Delete: processes that ignore SIGTERM are killed after the grace period.
    marker = "313.25"
    hy("workload", "create", "--cluster", "hy", "--workload", "stubborn", "--command",
       f"trap '' TERM; sleep {marker} & sleep {marker}; wait")
    hy.reaches("stubborn", "running", 120)
    wait_for("stubborn's processes", lambda: len(processes_with(marker)) >= 2, 60)
    out = hy("workload", "delete", "--cluster", "hy", "--workload", "stubborn",
             "--grace-seconds", "1")
    assert "deleted" in out, out
    wait_for("no process left", lambda: not processes_with(marker), 60)
    assert hy.status("stubborn")["state"] == "deleted"
    print("delete: no process left")

    listed = json.loads(hy("workload", "list", "--cluster", "hy", "--json"))
    assert {w["workload"]: w["state"] for w in listed} == {
        "oops": "failed", "ref": "succeeded", "drill": "succeeded", "background": "succeeded",
        "urgent": "succeeded", "stubborn": "deleted"}, listed
    hy("cluster", "delete", "--cluster", "hy")
    parts = slurm.run(["sinfo", "-h", "-o", "%P"])
    assert "hy" not in parts.split(), parts
    print("cluster delete: partitions removed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hyperion", required=True)
    ap.add_argument("--source-dir", required=True)
    a = ap.parse_args()
    missing = missing_tools()
    if missing:
        print(f"SKIP: {', '.join(missing)} not installed (scripts/setup.sh installs Debian's "
              "slurm-wlm and munge)")
        return 77
    if os.geteuid() != 0:
        print("SKIP: a one-node Slurm needs root here (slurmd runs job steps as their user)")
        return 77
    os.environ["PATH"] += ":/usr/sbin"
    tmp = tempfile.mkdtemp(prefix="hy_slurm_")
    slurm = Slurm(os.path.join(tmp, "slurm"))
    os.makedirs(slurm.root)
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    hy = Hyperion(os.path.abspath(a.hyperion), dict(slurm.env, HYPERION_HOME=home), home, "hy")
    ok = False
    try:
        slurm.start()
        drills(hy, slurm, os.path.abspath(a.source_dir), home)
        ok = True
    finally:
        slurm.stop()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp} (slurmctld.log, slurmd.log, workload output)")
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
