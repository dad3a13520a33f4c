#!/usr/bin/env python3
"""Hostile-client scenarios against a running `hyperion serve` (or any OpenAI-compatible
server), with the figures docs/PERFORMANCE.md records for the HTTP front end:

  queue      N requests (half streaming), C at a time, against a server started with a
             small max_concurrent_decodes / max_queue: the status of every response,
             how many were 429, whether any 200 stream carried an error event, and
             the most requests running + waiting seen on /metrics
  slowloris  S connections that each send one header line every 2 s, while /health is
             polled: /health latency (p50, max) and failures
  huge       ten text prompts of B bytes: status, time to the answer and the server's
             RSS before and after them (--pid)
  edges      pipelining, conflicting and negative Content-Length, a wrong method

  bench/serve_abuse.py --url http://127.0.0.1:8000 [--pid PID] [--scenario all] [--json]

Standard library only (Debian's python3); stdout is one JSON object with --json.
"""
import argparse
import concurrent.futures as cf
import json
import socket
import statistics
import threading
import time
import urllib.parse


def host_port(url):
    u = urllib.parse.urlparse(url)
    return u.hostname, u.port or 80


def raw(url, payload, timeout=30.0, until_close=True):
    """Sends raw bytes on a new connection; returns what came back (until close/timeout)."""
    h, p = host_port(url)
    s = socket.create_connection((h, p), timeout=timeout)
    s.sendall(payload)
    out = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
            if not until_close and b"\r\n\r\n" in out:
                break
    except socket.timeout:
        pass
    s.close()
    return out


def post(url, path, body, timeout=120.0):
    data = json.dumps(body).encode()
    req = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data
    t0 = time.monotonic()
    out = raw(url, req, timeout)
    return out, time.monotonic() - t0


def status_of(response):
    try:
        return int(response.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return -1


def queue(url, n, concurrency, max_tokens):
    def one(i):
        body = {"prompt": f"Request {i} of the queue test", "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": i % 2 == 0}
        out, _ = post(url, "/v1/completions", body)
        st = status_of(out)
        error_after_200 = st == 200 and b'"error"' in out
        return st, error_after_200
    # The server's own gauges, sampled while the load runs: running + waiting must never
    # pass max_concurrent_decodes + max_queue.
    stop, peak = threading.Event(), {"running": 0, "waiting": 0, "sum": 0}

    def sample():
        while not stop.is_set():
            g = gauges(url)
            if g:
                r, w = g.get("hyperion_requests_running", 0), g.get("hyperion_requests_waiting", 0)
                peak["running"] = max(peak["running"], r)
                peak["waiting"] = max(peak["waiting"], w)
                peak["sum"] = max(peak["sum"], r + w)
            stop.wait(0.01)
    t = threading.Thread(target=sample)
    t.start()
    with cf.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(n)))
    stop.set()
    t.join()
    statuses = {}
    for st, _ in results:
        statuses[str(st)] = statuses.get(str(st), 0) + 1
    return {"requests": n, "concurrency": concurrency, "statuses": statuses,
            "errors_after_200": sum(1 for _, e in results if e),
            "max_running": int(peak["running"]), "max_waiting": int(peak["waiting"]),
            "max_running_plus_waiting": int(peak["sum"])}


def gauges(url):
    """The unlabelled gauges of /metrics, by name (empty when unreachable)."""
    out = raw(url, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 5)
    g = {}
    for line in out.split(b"\r\n\r\n", 1)[-1].decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#") and "{" not in parts[0]:
            try:
                g[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return g


def rss_kib(pid):
    if not pid:
        return None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def slowloris(url, conns, seconds, probes):
    h, p = host_port(url)
    socks, stop = [], threading.Event()
    for _ in range(conns):
        try:
            s = socket.create_connection((h, p), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\n")
            socks.append(s)
        except OSError:
            break

    def trickle():
        k = 0
        while not stop.is_set():
            for s in socks:
                try:
                    s.sendall(f"X-Slow-{k}: 1\r\n".encode())
                except OSError:
                    pass
            k += 1
            stop.wait(2.0)
    t = threading.Thread(target=trickle)
    t.start()
    latencies, failures = [], 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(latencies) + failures < probes:
        t0 = time.monotonic()
        try:
            out = raw(url, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 10)
            if status_of(out) == 200:
                latencies.append(time.monotonic() - t0)
            else:
                failures += 1
        except OSError:
            failures += 1
        time.sleep(0.2)
    stop.set()
    t.join()
    for s in socks:
        s.close()
    return {"connections": len(socks), "health_probes": len(latencies) + failures,
            "health_failures": failures,
            "health_p50_ms": 1e3 * statistics.median(latencies) if latencies else None,
            "health_max_ms": 1e3 * max(latencies) if latencies else None}


def huge(url, size, pid, repeats=10):
    """`repeats` prompts of `size` bytes, one after another: the status and time of each,
    and the server's RSS before and after all of them (memory must come back)."""
    before = rss_kib(pid)
    statuses, seconds = {}, []
    for _ in range(repeats):
        out, secs = post(url, "/v1/completions", {"prompt": "a " * (size // 2), "max_tokens": 1})
        statuses[str(status_of(out))] = statuses.get(str(status_of(out)), 0) + 1
        seconds.append(secs)
    after = rss_kib(pid)
    return {"bytes": size, "requests": repeats, "statuses": statuses,
            "seconds_max": max(seconds), "rss_before_kib": before, "rss_after_kib": after}


def edges(url):
    pipelined = raw(url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                         b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 10)
    return {
        "pipelined_responses": pipelined.count(b"HTTP/1.1 "),
        "conflicting_content_length": status_of(raw(url, (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
            b"Content-Length: 14\r\nConnection: close\r\n\r\n{}"), 10)),
        "negative_content_length": status_of(raw(url, (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n"
            b"Connection: close\r\n\r\n"), 10)),
        "wrong_method": status_of(raw(url, (
            b"DELETE /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 10)),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--pid", type=int, default=0, help="the server's pid (for RSS)")
    ap.add_argument("--scenario", default="all", choices=["all", "queue", "slowloris", "huge", "edges"])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--slow-connections", type=int, default=320)
    ap.add_argument("--slow-seconds", type=float, default=20)
    ap.add_argument("--huge-bytes", type=int, default=6_500_000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = {"url": a.url}
    if a.scenario in ("all", "edges"):
        out["edges"] = edges(a.url)
    if a.scenario in ("all", "queue"):
        out["queue"] = queue(a.url, a.requests, a.concurrency, a.max_tokens)
    if a.scenario in ("all", "huge"):
        out["huge"] = huge(a.url, a.huge_bytes, a.pid)
    if a.scenario in ("all", "slowloris"):
        out["slowloris"] = slowloris(a.url, a.slow_connections, a.slow_seconds, 50)
    print(json.dumps(out, indent=None if a.json else 2))


if __name__ == "__main__":
    main()
