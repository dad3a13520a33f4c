#!/usr/bin/env python3
"""Integration test (issue 39): `hyperion workload` on a multi-node Slurm. Brings up three
fake hosts (tests/fake_cluster.py: network namespaces with their own addresses and
hostnames), one slurmd on each (one CPU per node), slurmctld and munged on this machine
(tests/launch/slurm_daemons.py), and runs:

  - a 2-rank training spread over 2 nodes (--nodes 2): the ranks run on two different
    hosts (each names its own), talk over TCP, and give the losses of 2 ranks on one host;
  - the same with --max-restarts 2, and the second host of its allocation killed (every
    process on it, slurmd too) after the step-50 checkpoint: the workload sees the host
    gone, Slurm marks it down and requeues the job onto the two hosts left, the run resumes
    from its last checkpoint and ends with the unbroken run's loss; `hyperion goodput`
    accounts the lost time;
  - the killed host's slurmd restarted: Slurm returns it to service.

The cluster and the daemons are always taken down, also when a check fails. Exits 77 (a
visible CTest skip) when Slurm is not installed, this is not root, or namespaces cannot be
made here.

  tests/launch/slurm_multi_node_test.py --hyperion build/release/hyperion --source-dir .
"""
import argparse, json, os, re, shutil, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from fake_cluster import Cluster, cannot_make_hosts  # noqa: E402
from slurm_daemons import (Hyperion, Slurm, last_metrics, missing_tools,  # noqa: E402
                           train_command, wait_for)


# The drill's collective timeout is shorter than SLURMD_TIMEOUT_S: the rank left times out
# and the attempt ends before Slurm marks the lost host down, so the workload's own check
# (a task on every host of the allocation) finds the host gone and waits for Slurm's
# requeue instead of restarting onto it.
DRILL_TIMEOUT_S = 8
SLURMD_TIMEOUT_S = 50


def job_hosts(slurm, job):
    """The hosts of a running Slurm job, and the one that runs its batch script."""
    fields = dict(w.split("=", 1) for w in slurm.run(["scontrol", "show", "job", job, "-o"]).split()
                  if "=" in w)
    return (slurm.run(["scontrol", "show", "hostnames", fields["NodeList"]]).split(),
            fields["BatchHost"])


def drills(hy, slurm, c, source_dir, home):
    cluster = hy.cluster
    hy("cluster", "create", "--cluster", cluster, "--backend", "slurm")
    d = json.loads(hy("cluster", "describe", "--cluster", cluster, "--json"))
    nodes = {n["node"] for n in d["slurm"]["nodes"]}
    assert nodes == set(c.hosts), d
    out = hy("workload", "create", "--cluster", cluster, "--workload", "bad", "--nodes", "3",
             "--nproc", "2", "--command", "true", code=2)
    assert "--nodes must be between 1 and --nproc (2), got 3" in out, out
    print(f"cluster {cluster}: {len(nodes)} nodes ({', '.join(sorted(nodes))})")

    root = os.path.join(home, "runs")
    steps = 300
    # Unbroken, across two hosts.
    hy("workload", "create", "--cluster", cluster, "--workload", "ref", "--nproc", "2",
       "--nodes", "2", "--command", train_command(hy.binary, source_dir, root, "ref", steps))
    s = hy.reaches("ref", "succeeded", 600)
    log = open(os.path.join(home, f"clusters/{cluster}/workloads/ref/output.log")).read()
    m = re.search(r"hosts: (\S+) \(rank 0\), (\S+) \(rank 1\)", log)
    assert m and m.group(1) != m.group(2) and {m.group(1), m.group(2)} <= set(c.hosts), \
        log[-3000:]
    ref = last_metrics(os.path.join(root, "ref"))
    assert ref["step"] == steps, ref
    print(f"2 ranks on 2 hosts ({m.group(1)}, {m.group(2)}): final loss {ref['loss']}")

    # The same 2 ranks on one host (this machine, no Slurm): the same losses.
    one = subprocess.run(train_command(hy.binary, source_dir, root, "one", steps).split()
                         + ["--nproc", "2", "--allow-run-as-root"], env=hy.env, cwd=home,
                         capture_output=True, text=True, timeout=900)
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-2000:]
    got = last_metrics(os.path.join(root, "one"))
    assert abs(got["loss"] - ref["loss"]) <= 1e-5 * abs(ref["loss"]), (got, ref)
    print(f"2 ranks on one host: final loss {got['loss']} (2 hosts: {ref['loss']})")

    # A host of the allocation killed mid-run: Slurm requeues onto the hosts left.
    hy("workload", "create", "--cluster", cluster, "--workload", "drill", "--nproc", "2",
       "--nodes", "2", "--max-restarts", "2",
       "--command", train_command(hy.binary, source_dir, root, "drill", steps,
                                  collective_timeout_s=DRILL_TIMEOUT_S))
    wait_for("the step-50 checkpoint",
             lambda: os.path.exists(os.path.join(root, "drill", "checkpoints", "50")), 600, 0.02)
    job = hy.status("drill")["slurm_job_id"]
    first, batch_host = job_hosts(slurm, job)
    assert len(first) == 2 and batch_host in first, (first, batch_host)
    victim = next(h for h in first if h != batch_host)  # the batch script lives on
    t_kill = time.time()
    c.run("kill", victim)
    wait_for(f"Slurm to mark {victim} down",
             lambda: slurm.node_states().get(victim, "").startswith("down"), 120, 0.5)
    t_down = time.time() - t_kill
    wait_for("the drill's second attempt",
             lambda: hy.status("drill")["attempts"] >= 2, 300, 0.5)
    t_running = time.time() - t_kill
    s = hy.reaches("drill", "succeeded", 900)
    log = open(os.path.join(home, f"clusters/{cluster}/workloads/drill/output.log")).read()
    for line in log.splitlines():  # the workload's account of the failure, for the record
        if line.startswith("== hyperion workload drill:"):
            print("  " + line[:240])
    assert re.search(rf"rank \d \(host {victim}\) not responding", log), log[-4000:]
    # Whichever notices first: the workload's probe of its allocation, or Slurm cancelling
    # the job for its node's failure (under load Slurm can be first); Slurm requeues it
    # either way.
    assert ("a host of the allocation does not answer" in log or
            "DUE TO NODE FAILURE" in log), log[-4000:]
    assert "requeued by Slurm" in log and "resume: from" in log, log[-4000:]
    m = re.findall(r"hosts: (\S+) \(rank 0\), (\S+) \(rank 1\)", log)
    assert len(m) >= 2 and victim not in m[-1], (m, victim)
    drill = last_metrics(os.path.join(root, "drill"))
    assert drill["step"] == steps and drill["loss"] == ref["loss"], (drill, ref)
    assert s["preemptions"] >= 1, s
    print(f"killed host {victim}: down in Slurm after {t_down:.1f} s, running again after "
          f"{t_running:.1f} s on {', '.join(m[-1])}; final loss {drill['loss']} == unbroken "
          f"{ref['loss']}")
    g = json.loads(subprocess.run([hy.binary, "goodput", os.path.join(root, "drill"), "--json"],
                                  capture_output=True, text=True, check=True).stdout)
    assert g["processes"] >= 2 and g["disruptions"] >= 1 and g["finished"], g
    assert g["badput"]["recovery"]["seconds"] > 0 and g["goodput"] < 1.0, g
    print(f"goodput {g['goodput']:.3f}: {g['steps_lost']} step(s) lost to the host, recovery "
          f"{g['badput']['recovery']['seconds']:.1f} s of {g['total_s']:.1f} s")

    # The host comes back: its slurmd registers and Slurm returns it to service.
    slurm.start_slurmd(victim)
    wait_for(f"{victim} back in service",
             lambda: slurm.node_states().get(victim) == "idle", 120, 0.5)
    print(f"{victim}: slurmd restarted, back in service")
    hy("cluster", "delete", "--cluster", cluster)


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
    why = cannot_make_hosts()
    if why:
        print(f"SKIP: {why}")
        return 77
    os.environ["PATH"] += ":/usr/sbin"
    source_dir = os.path.abspath(a.source_dir)
    script = os.path.join(source_dir, "scripts", "fake-cluster.sh")
    tmp = tempfile.mkdtemp(prefix="hy_slurm_nodes_")
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    name = f"sn{os.getpid() % 10000}"
    ok = False
    slurm = None
    try:
        with Cluster(script, 3, name) as c:
            slurm = Slurm(os.path.join(tmp, "slurm"), cluster=c, cpus_per_node=1,
                          slurmd_timeout=SLURMD_TIMEOUT_S)
            try:
                slurm.start()
                hy = Hyperion(os.path.abspath(a.hyperion), dict(slurm.env, HYPERION_HOME=home),
                              home, name)
                drills(hy, slurm, c, source_dir, home)
                ok = True
            finally:
                slurm.stop()
    finally:
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp} (slurm/slurmctld.log, slurm/slurmd-<node>.log, workload output)")
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
