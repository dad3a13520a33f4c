"""A Slurm of its own for the integration tests: munged, slurmctld and slurmd from Debian's
slurm-wlm and munge (installed by scripts/setup.sh), configured in a temporary directory
on free ports, started and stopped by the test.

One node (this machine, addressed as 127.0.0.1), or one node per fake host
(tests/fake_cluster.py): then each host runs its own slurmd in its namespace under its
own hostname, slurmctld runs on this machine at the hosts' bridge address, and every
daemon shares one munge key, as the nodes of a real cluster do.
"""
import json, os, shutil, signal, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from free_ports import free_port  # noqa: E402

TOOLS = ["munged", "slurmctld", "slurmd", "sinfo", "squeue", "scontrol", "sbatch", "srun",
         "scancel"]


def missing_tools():
    return [t for t in TOOLS
            if shutil.which(t) is None and not os.path.exists(os.path.join("/usr/sbin", t))]


def wait_for(what, fn, timeout=180, every=0.2):
    end = time.time() + timeout
    while time.time() < end:
        v = fn()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Slurm:
    """munged, slurmctld and the slurmds, in a directory of their own.

    cluster: a started tests/fake_cluster.Cluster for one node per fake host (each with
    `cpus_per_node` CPUs), or None for one node that is this machine."""

    def __init__(self, root, cluster=None, cpus_per_node=1, slurmd_timeout=None):
        self.root = root
        # Seconds before slurmctld marks a silent node down (and requeues its jobs);
        # Slurm's default (300) when None.
        self.slurmd_timeout = slurmd_timeout
        self.cluster, self.cpus_per_node = cluster, cpus_per_node
        self.conf = os.path.join(root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.env["PATH"] += ":/usr/sbin"
        self.daemons = []
        self.slurmds = {}  # node name -> Popen

    def _nodes(self, host):
        """The slurm.conf lines naming the nodes and where slurmctld runs."""
        if self.cluster is None:
            node = subprocess.check_output(["slurmd", "-C"], text=True,
                                           env=self.env).splitlines()[0]
            # Addressed as 127.0.0.1: the test must not depend on this machine's name
            # resolving (containers and fresh roots often lack it in /etc/hosts).
            return f"SlurmctldHost={host}(127.0.0.1)", [f"{node} NodeAddr=127.0.0.1"]
        c = self.cluster
        return (f"SlurmctldHost={host}({c.net}.1)",
                [f"NodeName={h} NodeAddr={c.address(h)} CPUs={self.cpus_per_node}"
                 for h in c.hosts])

    def start(self):
        d = self.root
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        key = os.path.join(d, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        host = subprocess.check_output(["hostname", "-s"], text=True).strip()
        ctld, nodes = self._nodes(host)
        names = [line.split()[0].split("=", 1)[1] for line in nodes]
        for n in names:  # SlurmdSpoolDir=.../%n: each node's own
            os.makedirs(os.path.join(d, "spool", n), exist_ok=True)
        ctld_port, slurmd_port = free_port(), free_port()
        node_lines = "\n".join(f"{line} State=UNKNOWN" for line in nodes)
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=hytest
{ctld}
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock,cred_expire=10
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
ReturnToService=2
{f"SlurmdTimeout={self.slurmd_timeout}" if self.slurmd_timeout else ""}
TmpFS=/var/tmp
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
KillWait=5
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
{node_lines}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        self.daemons.append(subprocess.Popen(
            ["munged", "-F", "--force", f"--socket={d}/munge.sock", f"--key-file={key}",
             f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
             f"--seed-file={d}/munge.seed"], env=self.env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL))
        wait_for("munged", lambda: os.path.exists(f"{d}/munge.sock"), 30)
        self.daemons.append(subprocess.Popen(["slurmctld", "-D", "-f", self.conf], env=self.env,
                                             stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL))
        for n in names:
            self.start_slurmd(n)
        wait_for(f"{len(names)} idle Slurm node(s)",
                 lambda: self.run(["sinfo", "-h", "-N", "-o", "%T"],
                                  check=False).split().count("idle") == len(names), 60)

    def start_slurmd(self, node):
        """Starts (or restarts, after its host was killed) one node's slurmd."""
        argv = ["slurmd", "-D", "-f", self.conf]
        if self.cluster is not None:
            argv = self.cluster.on_host(node, [shutil.which("slurmd", path=self.env["PATH"]),
                                               *argv[1:]])
        self.slurmds[node] = subprocess.Popen(argv, env=self.env, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL)

    def node_states(self):
        """{node: state} as sinfo reports them ("idle", "alloc", "down*", ...)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def run(self, argv, check=True):
        r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: {r.stderr}")
        return r.stdout

    def stop(self):
        subprocess.run(["scancel", "--user=root"], env=self.env, capture_output=True)
        procs = list(self.slurmds.values()) + list(reversed(self.daemons))
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Hyperion:
    """`hyperion` run against one cluster of this Slurm: hy("workload", ...) returns its
    output and checks its exit code."""

    def __init__(self, binary, env, workdir, cluster):
        self.binary, self.env, self.workdir, self.cluster = binary, env, workdir, cluster

    def __call__(self, *args, code=0):
        r = subprocess.run([self.binary, *args], env=self.env, cwd=self.workdir,
                           capture_output=True, text=True, timeout=900)
        out = r.stdout + r.stderr
        if code is not None and r.returncode != code:
            raise AssertionError(f"hyperion {' '.join(args)}: exit {r.returncode}, "
                                 f"expected {code}:\n{out}")
        return out

    def status(self, workload):
        return json.loads(self("workload", "status", "--json", "--cluster", self.cluster,
                               "--workload", workload))

    def reaches(self, workload, state, timeout=300):
        """Waits for the state; a workload that fails on the way fails the test at once."""
        def check():
            s = self.status(workload)
            if s["state"] == "failed" and state != "failed":
                raise AssertionError(f"{workload} failed: {s}")
            return s if s["state"] == state else None
        return wait_for(f"{workload} {state}", check, timeout, 0.5)


def train_command(hyperion, source_dir, root, run, steps, checkpoint_period=25,
                  collective_timeout_s=None):
    """A small training on the bundled corpus, as a workload's command line."""
    overrides = [f"dataset_path={source_dir}/data/corpus/fortunes.txt", "vocab_size=512",
                 "base_emb_dim=64", "base_num_decoder_layers=2", "base_num_query_heads=4",
                 "base_num_kv_heads=2", "base_mlp_dim=176", "max_target_length=64",
                 "per_device_batch_size=8", f"steps={steps}", "learning_rate=3e-3",
                 "warmup_steps_fraction=0.05", "dtype=float32", "remat_policy=minimal",
                 f"base_output_directory={root}", f"run_name={run}", "peak_tflops=1",
                 "sample_count=0", "eval_batches=1", "log_period=1000",
                 f"checkpoint_period={checkpoint_period}"]
    if collective_timeout_s is not None:
        overrides.append(f"collective_timeout_s={collective_timeout_s}")
    return " ".join([hyperion, "train", *overrides])


def last_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return json.loads([line for line in f if line.strip()][-1])
