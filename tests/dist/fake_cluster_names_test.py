#!/usr/bin/env python3
"""scripts/fake-cluster.sh checks every name it would use before it makes anything, and a
failed `up` removes only what it made: `up 11 --name fq` makes host fq11, so `up 1 --name
fq1` (whose host would be fq11 too) is refused with exit 2 and fq's hosts keep running.
Exit 77 (a visible skip) where namespaces cannot be made.

    tests/dist/fake_cluster_names_test.py --source-dir DIR
"""
import argparse, os, subprocess, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fake_cluster import cannot_make_hosts  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-dir", required=True)
    args = ap.parse_args()
    why = cannot_make_hosts()
    if why:
        print(f"skip: {why}")
        return 77
    script = os.path.join(args.source_dir, "scripts", "fake-cluster.sh")
    run = lambda *a: subprocess.run([script, *a], capture_output=True, text=True)
    first, second = f"fq{os.getpid() % 100}", None
    second = first + "1"
    try:
        run("down", "--name", first), run("down", "--name", second)
        r = run("up", "11", "--name", first)
        assert r.returncode == 0, r.stderr
        # A sleeping process on the host whose name the second cluster would take.
        victim = subprocess.Popen([script, "exec", first + "11", "sleep", "60"])
        r = run("up", "1", "--name", second)
        assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
        assert f"host {first}11 would be made" in r.stderr and first in r.stderr, r.stderr
        ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"hyfc-{first}11" in ns, ns
        assert victim.poll() is None, "the first cluster's process was killed"
        assert not os.path.exists(f"/run/hyperion-fake-cluster/{second}")
        hosts = run("hosts", "--name", first).stdout.split()
        assert hosts == [f"{first}{i}" for i in range(1, 12)], hosts
        victim.kill()
        victim.wait()
        print("ok: the clashing `up` was refused before making anything")
        return 0
    finally:
        run("down", "--name", second), run("down", "--name", first)


if __name__ == "__main__":
    sys.exit(main())
