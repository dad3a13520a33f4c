#!/usr/bin/env python3
"""Monitoring overhead (issue 17, docs/MONITORING.md): the same training run with
monitoring off (enable_monitoring=false) and on (event log, per-rank gathers every
log_period, the Prometheus endpoint scraped every --scrape-s seconds, and a second
client that connects, sends half a request and stalls: a dead scrape target), alternated
--repeats times. Reports the mean step time after the first --warmup steps of each run, the
medians per mode and the overhead in percent. Prints one JSON object.

  python3 bench/monitor_overhead.py --hyperion build/release/hyperion [--nproc 2]
"""
import argparse, json, os, socket, statistics, subprocess, sys, tempfile, threading, time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from free_ports import free_port  # noqa: E402


def run(a, root, name, monitored):
    port = free_port()
    cmd = [a.hyperion, "train", a.config]
    if a.nproc > 1:
        cmd += ["--nproc", str(a.nproc)] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    cmd += [f"steps={a.steps}", f"log_period={a.log_period}",
           "sample_count=0", "eval_batches=1", "enable_checkpointing=false", "peak_tflops=1",
           f"base_output_directory={root}", f"run_name={name}"] + a.overrides
    cmd += [f"metrics_port={port}", "metrics_host=127.0.0.1"] if monitored else \
        ["enable_monitoring=false"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()
    scrapes = [0]

    def scrape():
        while not stop.is_set() and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    r.read()
                scrapes[0] += 1
            except OSError:
                pass
            stop.wait(a.scrape_s)

    def stall():  # a scraper that dies mid-request, again and again
        while not stop.is_set() and proc.poll() is None:
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=1)
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                stop.wait(10)
                s.close()
            except OSError:
                stop.wait(0.2)

    threads = [threading.Thread(target=scrape), threading.Thread(target=stall)] if monitored else []
    for t in threads:
        t.start()
    proc.wait()
    stop.set()
    for t in threads:
        t.join()
    if proc.returncode != 0:
        sys.exit(f"monitor_overhead: {' '.join(cmd)} failed ({proc.returncode})")
    steps = [json.loads(l) for l in open(os.path.join(root, name, "metrics.jsonl"))]
    times = [s["step_s"] for s in steps if s["step"] > a.warmup]
    return statistics.mean(times), scrapes[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hyperion", default="build/release/hyperion")
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--nproc", type=int, default=1, help="ranks (train --nproc); rank 0 is scraped")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--log-period", type=int, default=10)
    ap.add_argument("--scrape-s", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="(the output is always JSON)")
    ap.add_argument("overrides", nargs="*", help="further key=value overrides")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="monitor_overhead_")
    off, on, scrapes = [], [], 0
    for i in range(a.repeats):
        off.append(run(a, root, f"off{i}", False)[0])
        t, n = run(a, root, f"on{i}", True)
        on.append(t)
        scrapes += n
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(json.dumps({
        "config": a.config, "nproc": a.nproc, "steps": a.steps, "log_period": a.log_period,
        "step_s_off": off, "step_s_on": on,
        "median_step_s_off": m_off, "median_step_s_on": m_on,
        "overhead_percent": 100.0 * (m_on - m_off) / m_off,
        "scrapes": scrapes,
    }, indent=1))


if __name__ == "__main__":
    main()
