#!/usr/bin/env python3
"""Integration test (issue 17): a real Prometheus (Debian's `prometheus`, installed by
scripts/setup.sh) scrapes a 2-rank `hyperion train --nproc 2 metrics_port=P` run, and its
HTTP API answers per-rank series and the PromQL of docs/MONITORING.md (mean, max and
top-k by rank). Exits 77 (a visible CTest skip) when prometheus is not installed.

  tests/monitor/prometheus_scrape_test.py --hyperion build/release/hyperion
"""
import argparse, json, os, shutil, signal, subprocess, sys, tempfile, time
import urllib.parse, urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from free_ports import free_ports  # noqa: E402


def query(port, promql):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hyperion", required=True)
    ap.add_argument("--prometheus", default="/usr/bin/prometheus")
    a = ap.parse_args()
    if not os.path.exists(a.prometheus):
        print(f"SKIP: {a.prometheus} is not installed (scripts/setup.sh installs Debian's "
              "prometheus)")
        return 77

    root = tempfile.mkdtemp(prefix="prometheus_scrape_")
    metrics_port = free_ports(2)
    prom_port = free_ports(1)
    train_log = open(os.path.join(root, "train.log"), "w")
    train = subprocess.Popen(
        [a.hyperion, "--threads", "1", "train", "tiny", "--nproc", "2", "--allow-run-as-root",
         "steps=100000", "log_period=5", "per_device_batch_size=2", "max_target_length=64",
         "sample_count=0", "enable_checkpointing=false", "peak_tflops=1",
         f"metrics_port={metrics_port}", "metrics_host=127.0.0.1",
         f"base_output_directory={root}", "run_name=scraped"],
        stdout=train_log, stderr=subprocess.STDOUT, start_new_session=True)
    config = os.path.join(root, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
scrape_configs:
  - job_name: hyperion
    honor_labels: true
    static_configs:
      - targets: ['127.0.0.1:{metrics_port}', '127.0.0.1:{metrics_port + 1}']
""")
    prom_log = open(os.path.join(root, "prometheus.log"), "w")
    prom = subprocess.Popen(
        [a.prometheus, f"--config.file={config}", f"--storage.tsdb.path={root}/tsdb",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=prom_log, stderr=subprocess.STDOUT, start_new_session=True)
    failures = []
    try:
        deadline = time.time() + 240
        ranks = {}
        while time.time() < deadline:
            if train.poll() is not None:
                failures.append(f"training ended early ({train.returncode}); see {train_log.name}")
                break
            try:
                res = query(prom_port, 'hyperion_train_step{job="scraped"}')
                ranks = {r["metric"].get("rank"): float(r["value"][1]) for r in res}
                if set(ranks) == {"0", "1"} and min(ranks.values()) >= 10:
                    break
            except OSError:
                pass  # prometheus still starting
            time.sleep(1)
        else:
            failures.append(f"no per-rank hyperion_train_step series within 240 s: {ranks}")
        if not failures:
            for r in query(prom_port, 'hyperion_train_step{job="scraped"}'):
                for label in ("job", "rank", "host"):
                    if label not in r["metric"]:
                        failures.append(f"series without label {label}: {r['metric']}")
            # The PromQL of docs/MONITORING.md.
            checks = {
                "avg(hyperion_train_compute_seconds)": 1,
                "max(hyperion_train_compute_seconds)": 1,
                "max by (rank) (hyperion_train_step_seconds)": 2,
                "topk(1, hyperion_train_compute_seconds)": 1,
                "sum by (rank) (hyperion_train_collective_sent_bytes_total)": 2,
                "hyperion_process_cpu_cores": 2,
                "process_resident_memory_bytes": 2,
                "hyperion_train_straggler": 2,  # rank 0's flags, one per rank
            }
            for promql, want in checks.items():
                got = query(prom_port, promql)
                if len(got) != want:
                    failures.append(f"{promql}: {len(got)} series, expected {want}: {got}")
                else:
                    print(f"ok  {promql}: " +
                          ", ".join(f"{r['metric'].get('rank', '*')}={r['value'][1]}" for r in got))
            # Rank 0's gathers over the communicator: every rank, every log period.
            gathers = [json.loads(l) for l in open(os.path.join(root, "scraped", "ranks.jsonl"))
                       if l.endswith("\n")]
            if not gathers or any(len(g["ranks"]) != 2 for g in gathers):
                failures.append(f"ranks.jsonl: expected 2 ranks per gather: {gathers[:1]}")
            elif any(g["step"] % 5 for g in gathers) or \
                    set(gathers[-1]["summary"]) < {"step_s", "compute_s", "rss_bytes"}:
                failures.append(f"ranks.jsonl: bad gather {gathers[-1]}")
            else:
                print(f"ok  ranks.jsonl: {len(gathers)} gathers of 2 ranks")
    finally:
        for p in (train, prom):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in (train, prom):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        print(open(train_log.name).read()[-3000:])
        return 1
    shutil.rmtree(root, ignore_errors=True)
    print("PASS: Prometheus scraped both ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
