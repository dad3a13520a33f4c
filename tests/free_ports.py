"""Free TCP port ranges for the integration tests and benchmark scripts.

A port taken by binding port 0 comes from the kernel's ephemeral range, and is handed out
again to the next outgoing connection (Open MPI's, a test client's) as soon as the probe
socket closes: a parallel test run then finds it taken by the time the daemon under test
binds it. These ranges are picked below the ephemeral range instead, where the kernel never
allocates on its own, and each port is checked bindable.
"""
import random, socket


def ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(n=1):
    """The first of `n` consecutive free loopback ports, outside the ephemeral range."""
    lo, hi = ephemeral_range()
    # Below the ephemeral range when there is room there, else above it.
    span = (10000, lo - n) if lo - n > 10000 + 1000 else (hi + 1, 65535 - n)
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(*span)
        ok = True
        for p in range(base, base + n):
            s = socket.socket()
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", p))
            except OSError:
                ok = False
            finally:
                s.close()
            if not ok:
                break
        if ok:
            return base
    raise SystemExit(f"no {n} free consecutive ports in {span}")


def free_port():
    return free_ports(1)
