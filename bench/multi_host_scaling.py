#!/usr/bin/env python3
"""Multi-host scaling against a communication model (docs/SCALING.md, issue 39).

Brings up 4 fake hosts (scripts/fake-cluster.sh: network namespaces on a bridge), then
for data parallel and FSDP on 1, 2 and 4 hosts (one rank of one thread each) and each
link shape, trains a few steps and records per step:

  step_s          mean step time over steps 2..N (rank 0's metrics.jsonl)
  wire_mb         bytes host 1 sent on its link per step (its veth's counters, read at
                  the step boundaries metrics.jsonl shows)
  comm_exposed_s  time the training thread waited for collectives

and the same job on ONE host (ranks over shared memory) as the compute baseline at the
same CPU contention (this machine has 2 cores: 4 ranks share them). The link bandwidth
of each shape and the CPU time the network stack spends per byte (k, from /proc/stat
around a TCP stream) are measured between two hosts. The model (docs/SCALING.md):

  T_pred = T_one_host(N) + exposed + k * (bytes all hosts send) / cores

  data parallel: gradient buckets (LM head, layers last to first, embedding) become
    ready through the backward (2/3 of the step, in proportion to their FLOPs) and go
    over the link one after another, each taking its share of the wire bytes / bandwidth;
    exposed = how long the last one ends after the backward.
  FSDP: each bucket's parameters are gathered while the previous bucket computes
    (forward: gather; backward: gather + reduce-scatter, a third and two thirds of the
    wire bytes); exposed = the first gather + every transfer longer than the compute
    it hides behind.

Prints one JSON line per run and a Markdown table; --analyze FILE recomputes the table
from an earlier run's JSON lines.

  bench/multi_host_scaling.py --hyperion build/release/hyperion [--steps 5] [--batch 2]
"""
import argparse, json, os, socket, statistics, subprocess, sys, tempfile, threading, time

SHAPES = [("unshaped", None), ("25gbit", "25gbit"), ("1gbit", "1gbit")]


# llama-25m's buckets in backward order (parameters; FLOPs per token are 2 x params for
# every bucket but the embedding, a lookup): the LM head, 8 layers, the embedding.
def buckets(dim=512, layers=8, ffn=1408, vocab=8192):
    layer = 4 * dim * dim + 3 * dim * ffn + 2 * dim
    head = vocab * dim + dim
    rows = [("head", head, 2 * head)] + [(f"layer{i}", layer, 2 * layer) for i in range(layers)]
    return rows + [("embedding", vocab * dim, 0)]


def exposed_dp(t_step, wire, bw):
    b = buckets()
    params = sum(p for _, p, _ in b)
    flops = sum(f for _, _, f in b)
    t_bwd = 2.0 / 3.0 * t_step
    ready = link = 0.0
    for _, p, f in b:
        ready += t_bwd * f / flops
        link = max(link, ready) + wire * p / params / bw
    return max(0.0, link - t_bwd)


def exposed_fsdp(t_step, wire, bw):
    b = buckets()
    params = sum(p for _, p, _ in b)
    flops = sum(f for _, _, f in b)
    fwd = [(wire / 3 * p / params / bw, t_step / 3 * f / flops) for _, p, f in reversed(b)]
    bwd = [(2 * wire / 3 * p / params / bw, 2 * t_step / 3 * f / flops) for _, p, f in b]
    out = fwd[0][0]
    for i in range(1, len(fwd)):
        out += max(0.0, fwd[i][0] - fwd[i - 1][1])
    for x, c in bwd:
        out += max(0.0, x - c)
    return out


# The fraction of the link's one-stream bandwidth a collective's bytes move at: Open MPI
# picks reduce + broadcast or recursive doubling at these sizes (each host sends the
# payload once at 2 hosts, twice at 4, measured on the veth counters), whose rounds send
# and receive in turn rather than both at once as a pipelined ring would. Calibrated once
# (data parallel, 2 hosts, 1 Gb/s: the collectives' own time, comm_s, is 2x the wire
# bytes over the link) and used for every other row.
COLLECTIVE_EFFICIENCY = 0.5


def predict(row, k, cores, efficiency=COLLECTIVE_EFFICIENCY):
    t_one, wire, n = row["one_host_step_s"], row["wire_bytes"], row["hosts"]
    bw = row["bandwidth_gbit"] * 1e9 / 8 * efficiency
    exposed = (exposed_dp if row["mode"] == "dp" else exposed_fsdp)(t_one, wire, bw)
    cpu = k * wire * n / cores
    return t_one + exposed + cpu, exposed, cpu


def cpu_per_byte(script, name, a, b, mb=1000):
    """CPU seconds the machine spends per byte sent between two hosts (all cores)."""
    def busy():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v) - v[3] - v[4]  # all but idle and iowait, in USER_HZ ticks
    b0 = busy()
    measure_bandwidth(script, name, a, b, mb)
    return (busy() - b0) / os.sysconf("SC_CLK_TCK") / (mb << 20)


def table(results, k):
    lines = ["| link | mode | hosts | one host (s) | wire MB/step | T_x (s) | exposed (s) | "
             "network CPU (s) | predicted (s) | measured (s) | measured exposed (s) | "
             "measured / predicted |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        pred, exposed, cpu = predict(r, k, os.cpu_count())
        t_x = r["wire_bytes"] / (r["bandwidth_gbit"] * 1e9 / 8 * COLLECTIVE_EFFICIENCY)
        lines.append(
            f"| {r['shape']} ({r['bandwidth_gbit']:.1f} Gb/s) | {r['mode']} | {r['hosts']} | "
            f"{r['one_host_step_s']:.2f} | {r['wire_bytes'] / 1e6:.0f} | {t_x:.2f} | {exposed:.2f} | "
            f"{cpu:.2f} | {pred:.2f} | {r['step_s']:.2f} | {r['comm_exposed_s']:.2f} | "
            f"{r['step_s'] / pred:.2f} |")
    return "\n".join(lines)


def sh(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


def counter(dev, which):
    with open(f"/sys/class/net/{dev}/statistics/{which}") as f:
        return int(f.read())


def measure_bandwidth(script, name, a, b, mb=200):
    """Bytes/s of one TCP stream from host a to host b (python sockets)."""
    server = subprocess.Popen([script, "exec", b, "python3", "-c", """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5601)); s.listen(1); c, _ = s.accept()
while c.recv(1 << 20): pass
"""], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    out = sh(script, "exec", a, "python3", "-c", f"""
import socket, time
s = socket.create_connection(("{b}", 5601)); buf = b"x" * (1 << 20)
t = time.time()
for _ in range({mb}): s.sendall(buf)
s.shutdown(socket.SHUT_WR); s.recv(1); print(({mb} << 20) / (time.time() - t))
""")
    server.wait(timeout=30)
    return float(out.strip())


def run(hyperion, base, name, args, env, veth, steps):
    """Trains; returns step_s, comm_exposed_s and (with veth) bytes sent per step."""
    run_dir = f"{base}/{name}"
    metrics = f"{run_dir}/metrics.jsonl"
    p = subprocess.Popen([hyperion, "train", *args, f"base_output_directory={base}",
                          f"run_name={name}"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    marks = {}

    def lines():
        try:
            with open(metrics) as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    while p.poll() is None:
        n = lines()
        if veth and n >= 1 and 1 not in marks:
            marks[1] = counter(veth, "rx_bytes")  # the bridge side receives what the host sends
        if veth and n >= steps and steps not in marks:
            marks[steps] = counter(veth, "rx_bytes")
        time.sleep(0.02)
    out = p.stdout.read()
    if p.returncode != 0:
        sys.stderr.write(out[-3000:])
        raise SystemExit(f"{name}: exit {p.returncode}")
    rows = [json.loads(l) for l in open(metrics)][1:]
    res = {"step_s": statistics.mean(r["step_s"] for r in rows),
           "comm_exposed_s": statistics.mean(r.get("comm_exposed_s", 0) for r in rows),
           "comm_s": statistics.mean(r.get("comm_s", 0) for r in rows)}
    if veth and 1 in marks and steps in marks:
        res["wire_bytes"] = (marks[steps] - marks[1]) / (steps - 1)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hyperion", required=True)
    ap.add_argument("--source-dir", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--config", default="llama-25m")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--baselines", help="reuse the one-host lines of an earlier run's output")
    ap.add_argument("--analyze", help="only recompute the table from an earlier run's output")
    ap.add_argument("--cpu-per-byte", type=float, help="k for --analyze (s/byte)")
    a = ap.parse_args()
    if a.analyze:
        rows = [json.loads(l) for l in open(a.analyze) if l.startswith('{"shape"') and '"mode"' in l]
        k = a.cpu_per_byte
        if k is None:
            ks = [json.loads(l)["cpu_s_per_byte"] for l in open(a.analyze) if "cpu_s_per_byte" in l]
            k = ks[0] if ks else 0.0
        print(f"k = {k:.3g} CPU s/byte")
        print(table(rows, k))
        return 0
    hyperion = os.path.abspath(a.hyperion)
    script = os.path.join(a.source_dir, "scripts", "fake-cluster.sh")
    os.chdir(a.source_dir)
    name = "sc"
    base = tempfile.mkdtemp(prefix="hy-scaling-")
    common = [a.config, f"steps={a.steps}", f"per_device_batch_size={a.batch}",
              f"max_target_length={a.seq}", "sample_count=0", "eval_batches=1",
              "enable_checkpointing=false", "log_period=1", "--allow-run-as-root",
              "--threads-per-rank", "1"]
    modes = {"dp": [], "fsdp": ["data_parallelism=1", "fsdp_parallelism=-1"]}
    subprocess.run([script, "down", "--name", name], capture_output=True)
    sh(script, "up", "4", "--name", name)
    results = []
    try:
        env = dict(os.environ)
        for line in sh(script, "env", "--name", name).splitlines():
            k, v = line[len("export "):].split("=", 1)
            env[k] = v.strip("'")
        hosts = sh(script, "hosts", "--name", name).split()
        # Compute baselines: the same ranks on one host (shared memory), and one process.
        single = [c for c in common if c not in ("--allow-run-as-root", "--threads-per-rank", "1")]
        one = {}
        if a.baselines:
            for line in open(a.baselines):
                if not line.startswith('{"run": "one'):
                    continue
                r = json.loads(line)
                if r["run"] == "one process":
                    one[("dp", 1)] = one[("fsdp", 1)] = r
                else:
                    _, mode, n = r["run"].split(", ")
                    one[(mode, int(n.split()[0]))] = r
                print(line.strip(), flush=True)
        else:
            r = run(hyperion, base, "one-1", single, dict(os.environ, HYPERION_THREADS="1"), None,
                    a.steps)
            one[("dp", 1)] = one[("fsdp", 1)] = r
            print(json.dumps({"run": "one process", **r}), flush=True)
            for mode, keys in modes.items():
                for n in (2, 4):
                    r = run(hyperion, base, f"one-{mode}-{n}",
                            common + keys + ["--nproc", str(n)], os.environ, None, a.steps)
                    one[(mode, n)] = r
                    print(json.dumps({"run": f"one host, {mode}, {n} ranks", **r}), flush=True)
        for shape, rate in SHAPES:
            if rate:
                sh(script, "shape", "all", "--name", name, "--bandwidth", rate)
            else:
                sh(script, "shape", "all", "--name", name)
            bw = measure_bandwidth(script, name, hosts[0], hosts[1])
            print(json.dumps({"shape": shape, "bandwidth_gbit": round(bw * 8 / 1e9, 2)}), flush=True)
            if rate is None:
                k = cpu_per_byte(script, name, hosts[0], hosts[1])
                print(json.dumps({"cpu_s_per_byte": k}), flush=True)
            for mode, keys in modes.items():
                for n in (2, 4):
                    r = run(hyperion, base, f"{shape}-{mode}-{n}",
                            common + keys + ["--hosts", ",".join(hosts[:n])], env,
                            f"hyfc-{hosts[0]}", a.steps)
                    row = {"shape": shape, "mode": mode, "hosts": n, "bandwidth_gbit": bw * 8 / 1e9,
                           "one_host_step_s": one[(mode, n)]["step_s"], **r}
                    row["pred_step_s"] = predict(row, k, os.cpu_count())[0]
                    results.append(row)
                    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                                      for k, v in row.items()}), flush=True)
    finally:
        subprocess.run([script, "down", "--name", name], capture_output=True)
    print()
    print(table(results, k))
    return 0


if __name__ == "__main__":
    sys.exit(main())
