"""Fake hosts for the multi-host integration tests: scripts/fake-cluster.sh (network
namespaces on a bridge, each with its own address and hostname) as a context manager that
always takes the cluster down, also when a check fails.
"""
import os, shutil, subprocess


def cannot_make_hosts():
    """Why fake hosts cannot be made here (not root, no iproute2, no namespaces), or None."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "fake hosts need root and iproute2"
    name = f"hyprobe{os.getpid()}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a network namespace here: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name])
    return None


class Cluster:
    """`with Cluster(script, 2, "mh1") as c:` hosts c.hosts on subnet c.net (".0/24"), and
    c.env: this environment plus the Open MPI settings that launch ranks on them."""

    def __init__(self, script, n, name):
        self.script, self.n, self.name = script, n, name

    def run(self, *args, check=True):
        return subprocess.run([self.script, *args, "--name", self.name], check=check,
                              capture_output=True, text=True)

    def __enter__(self):
        self.run("down", check=False)
        r = self.run("up", str(self.n), check=False)
        if r.returncode != 0:
            raise RuntimeError(f"fake-cluster up failed: {r.stderr.strip()}")
        try:
            self.env = dict(os.environ)
            for line in self.run("env").stdout.splitlines():
                k, v = line[len("export "):].split("=", 1)
                self.env[k] = v.strip("'")
            self.hosts = self.run("hosts").stdout.split()
            with open(f"/run/hyperion-fake-cluster/{self.name}/net") as f:
                self.net = f.read().strip()
        except BaseException:
            self.run("down", check=False)
            raise
        return self

    def address(self, host):
        """A host's address: HOSTk is NET.(10+k); the machine itself is NET.1."""
        return f"{self.net}.{10 + self.hosts.index(host) + 1}"

    def on_host(self, host, argv):
        """argv run on `host` (its namespace and hostname)."""
        return [self.script, "exec", host, *argv]

    def __exit__(self, *exc):
        self.run("down", check=False)
