#!/usr/bin/env bash
# Proves the README's two commands on a fresh Debian 12: builds a minimal root with
# `debootstrap --variant=minbase bookworm` (from the mirror in this machine's apt sources),
# clones this repository's committed HEAD into it, and runs `scripts/run.sh` and then
# `scripts/test.sh` inside it with chroot. The root is laid out as a booted machine's is:
# /proc, /sys with the cgroup file system, /dev (with /dev/pts and /dev/shm) and /run are
# mounted for the run (and unmounted afterwards, whatever happens); /etc/hostname and
# /etc/hosts name this machine, so its own hostname resolves; and the root trusts the
# certificate authorities this machine trusts (a network whose TLS goes through an
# intercepting proxy needs them for npm's registry), as any machine on that network does.
#
# Usage: scripts/fresh-machine.sh [--root DIR] [--only run|test] [--keep] [--ccache DIR]
#   --root DIR   where to build the root (default /tmp/hyperion-fresh; replaced if present)
#   --only X     run only scripts/run.sh or only scripts/test.sh
#   --keep       keep the root afterwards (default: delete it)
#   --ccache DIR bind-mount this compiler cache as the root's (default: none, every file
#                compiles). Packages, configuring, headers and linking stay the fresh
#                root's own: a hit needs every header it read to be there, unchanged.
#   --lint-cache DIR  the same for scripts/lint.sh's record of files that passed
#                (~/.cache/hyperion-lint; keyed by their text, headers and clang-tidy)
# Needs root and Debian's archive; installs debootstrap on this machine if missing.
# Prints each command's exit status and time; exits non-zero if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd -P)

root=/tmp/hyperion-fresh
only=""
keep=0
cache=""
lint_cache=""
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --ccache) [ $# -ge 2 ] || { echo "fresh-machine: --ccache needs a directory" >&2; exit 2; }
              cache=$(realpath -m "$2"); shift 2 ;;
    --lint-cache) [ $# -ge 2 ] || { echo "fresh-machine: --lint-cache needs a directory" >&2; exit 2; }
              lint_cache=$(realpath -m "$2"); shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fresh-machine: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$only" in ""|run|test) ;; *) echo "fresh-machine: --only takes run or test" >&2; exit 2 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "fresh-machine: needs root (debootstrap, chroot, mount)" >&2; exit 2; }

# The Debian mirror this machine installs from (deb822 sources, or the classic list).
mirror=$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)\/\{0,1\} *$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian
command -v debootstrap >/dev/null || {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}

mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -R "${mounted[i]}" 2>/dev/null || umount -R -l "${mounted[i]}" 2>/dev/null || true
  done
  if [ "$keep" -eq 0 ] && [ -d "$root" ]; then rm -rf --one-file-system "$root"; fi
}
trap cleanup EXIT

if [ -d "$root" ]; then
  grep -q " $root/" /proc/mounts && { echo "fresh-machine: $root has mounts; unmount them first" >&2; exit 1; }
  rm -rf --one-file-system "$root"
fi
start=$(date +%s)
echo "fresh-machine: debootstrap --variant=minbase bookworm $root $mirror"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
  { tail -20 "$root.debootstrap.log" >&2; exit 1; }
# The same suites a Debian 12 install has (main, updates, security), from this mirror.
cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian}/debian-security bookworm-security main
EOF
cp /etc/resolv.conf "$root/etc/resolv.conf"
# This machine's name, resolving to itself (slurmd, MPI and others look it up).
host=$(hostname)
echo "$host" >"$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' "$host" >"$root/etc/hosts"
# The certificate authorities this machine adds to Debian's (update-ca-certificates in the
# root takes them in when its ca-certificates package is installed), and this machine's
# whole bundle for Node.js (npm), which reads NODE_EXTRA_CA_CERTS.
mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ssl/certs"
cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
host_bundle=""
for b in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
  if [ -s "$b" ]; then host_bundle=$b; break; fi
done
if [ -n "$host_bundle" ]; then
  cp "$host_bundle" "$root/etc/ssl/certs/host-ca-bundle.crt"
  ca_env="NODE_EXTRA_CA_CERTS=/etc/ssl/certs/host-ca-bundle.crt"
else
  ca_env=""
fi
git clone -q --no-local "$src" "$root/root/hyperion"
echo "fresh-machine: root ready in $(( $(date +%s) - start )) s; cloned $(git -C "$src" rev-parse --short HEAD)"

for m in proc sys dev run; do mkdir -p "$root/$m"; done
mount -t proc proc "$root/proc" && mounted+=("$root/proc")
mount -t sysfs sysfs "$root/sys" && mounted+=("$root/sys")
# The cgroup file system, where a booted machine has it (slurmd looks for it there), with
# the mounts under it: on cgroup v1 each controller (and systemd's named hierarchy) is its
# own mount, and slurmd refuses a /sys/fs/cgroup/systemd that is not a cgroup ("Unexpected
# fs type"). Recursive, kept from propagating back, and unmounted recursively.
if mountpoint -q /sys/fs/cgroup; then
  mount --rbind /sys/fs/cgroup "$root/sys/fs/cgroup" && mounted+=("$root/sys/fs/cgroup")
  mount --make-rslave "$root/sys/fs/cgroup"
fi
mount --bind /dev "$root/dev" && mounted+=("$root/dev")
mount --make-private "$root/dev"  # what is mounted under it stays in the root
mkdir -p "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts" && mounted+=("$root/dev/pts")
mount -t tmpfs -o mode=1777 shm "$root/dev/shm" && mounted+=("$root/dev/shm")
mount -t tmpfs -o mode=0755 run "$root/run" && mounted+=("$root/run")
if [ -n "$cache" ]; then
  mkdir -p "$cache" "$root/root/.cache/ccache"
  mount --bind "$cache" "$root/root/.cache/ccache" || exit 1
  mounted+=("$root/root/.cache/ccache")
  echo "fresh-machine: compiler cache $cache mounted as the root's"
fi
if [ -n "$lint_cache" ]; then
  mkdir -p "$lint_cache" "$root/root/.cache/hyperion-lint"
  mount --bind "$lint_cache" "$root/root/.cache/hyperion-lint" || exit 1
  mounted+=("$root/root/.cache/hyperion-lint")
  echo "fresh-machine: lint cache $lint_cache mounted as the root's"
fi

status=0
in_root() {  # $1: label; rest: the command, run in the clone inside the root
  local label=$1 t0 rc
  shift
  t0=$(date +%s)
  echo "fresh-machine: $label: $*"
  set +e
  chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb $ca_env \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "cd /root/hyperion && $*" >"$root.$label.log" 2>&1
  rc=$?
  set -e
  tail -15 "$root.$label.log"
  echo "fresh-machine: $label: exit $rc after $(( $(date +%s) - t0 )) s (log: $root.$label.log)"
  [ "$rc" -eq 0 ] || status=1
}
[ "$only" = test ] || in_root run scripts/run.sh
[ "$only" = run ] || in_root test scripts/test.sh
echo "fresh-machine: $([ $status -eq 0 ] && echo PASSED || echo FAILED) in $(( $(date +%s) - start )) s"
exit $status
