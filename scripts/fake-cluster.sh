#!/usr/bin/env bash
# Several hosts on one machine, for multi-host runs and their failures on a laptop or in a
# test: each host is a Linux network namespace with its own address on a bridge and its
# own hostname; Open MPI starts ranks there through this script as its rsh agent (no ssh).
# Needs root (ip netns, veth, a bridge) and Debian's iproute2 and util-linux.
#
# Usage: scripts/fake-cluster.sh COMMAND [ARGS] [--name C]
#   up N [--bandwidth RATE] [--latency T]   make hosts C1..CN (default C = h: h1, h2, ...)
#                                           on a bridge; links shaped to RATE (tc tbf:
#                                           25gbit, 1gbit, 100mbit) and delayed by T (tc
#                                           netem: 100us, 1ms) in both directions
#   down                                    remove the hosts, their processes, the links and
#                                           the /etc/hosts entries (always safe to run)
#   env                                     the Open MPI settings that launch on the hosts
#                                           (export lines: eval "$(... env)")
#   hosts                                   the host names, one per line
#   exec HOST CMD...                        run CMD on HOST (its namespace and hostname)
#   rsh HOST CMD...                         the same with CMD as one shell string (what
#                                           Open MPI's plm_rsh_agent calls)
#   kill HOST [SIGNAL]                      signal every process on HOST (default KILL;
#                                           STOP and CONT freeze and thaw it)
#   link HOST up|down                       plug or unplug HOST's link
#   shape HOST|all --bandwidth RATE [--latency T]   reshape links (a straggler: one host's)
#   hide HOST DIR                           processes started on HOST from now on see an
#                                           empty DIR (a directory it does not share)
#
# The hosts share this machine's filesystem (a shared filesystem, as a cluster's /home or
# Lustre) except what `hide` hides and /var/tmp, which is each host's own (node-local
# scratch: Slurm's TmpFS, where srun's PMIx keeps per-node files of the same name).
# Names resolve through /etc/hosts entries tagged "hyperion-fake-cluster C", removed by
# `down`. State lives in /run/hyperion-fake-cluster/C.
set -eEuo pipefail
self=$(readlink -f "$0")
state_root=/run/hyperion-fake-cluster

die() { echo "fake-cluster: $*" >&2; exit 2; }
usage() { sed -n '2,31p' "$self" | sed 's/^# \{0,1\}//' >&2; exit 2; }

[ $# -ge 1 ] || usage
cmd=$1
shift
name=h bandwidth="" latency="" args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --name) [ $# -ge 2 ] || die "--name needs a value"; name=$2; shift 2 ;;
    --bandwidth) [ $# -ge 2 ] || die "--bandwidth needs a rate (25gbit, 1gbit)"; bandwidth=$2; shift 2 ;;
    --latency) [ $# -ge 2 ] || die "--latency needs a time (100us, 1ms)"; latency=$2; shift 2 ;;
    -h|--help) usage ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ "$name" =~ ^[a-z][a-z0-9]{0,5}$ ]] || die "--name '$name': 1 to 6 of a-z0-9, starting with a letter"
state=$state_root/$name
bridge=hyfc-$name-br
tag="hyperion-fake-cluster $name"

need_root() { [ "$(id -u)" -eq 0 ] || die "$cmd needs root (network namespaces)"; }
ns_of() { echo "hyfc-$1"; }
veth_of() { echo "hyfc-$1"; }  # the host's link, bridge side
hosts_of() { [ -f "$state/hosts" ] && cat "$state/hosts" || true; }
# The cluster a host belongs to (rsh, exec, kill... name a host, not a cluster).
state_of_host() {
  local d
  for d in "$state_root"/*/; do
    [ -f "$d/hosts" ] && grep -qx "$1" "$d/hosts" && { echo "${d%/}"; return 0; }
  done
  die "no fake host '$1' (scripts/fake-cluster.sh up N makes them)"
}

# tbf needs a bucket of at least one timer tick of traffic: 10 ms worth, >= 64 KiB.
tbf_args() {
  python3 - "$1" <<'EOF'
import re, sys
m = re.fullmatch(r'(\d+(?:\.\d+)?)([kmg]?)bit', sys.argv[1].lower())
if not m:
    sys.exit("fake-cluster: --bandwidth '%s' is not a rate such as 25gbit, 1gbit, 100mbit" % sys.argv[1])
bits = float(m.group(1)) * {'': 1, 'k': 1e3, 'm': 1e6, 'g': 1e9}[m.group(2)]
burst = max(64 * 1024, int(bits / 8 * 0.01))
print(f"rate {sys.argv[1]} burst {burst} latency 200ms")
EOF
}

# Shapes one device's egress: tbf for the rate, netem (under it) for the delay.
shape_dev() {  # shape_dev NETNS-or-"" DEV
  local in=() dev=$2
  [ -n "$1" ] && in=(ip netns exec "$1")
  "${in[@]}" tc qdisc del dev "$dev" root 2>/dev/null || true
  if [ -n "$latency" ]; then
    "${in[@]}" tc qdisc add dev "$dev" root handle 1: netem delay "$latency" 2>/dev/null ||
      die "--latency $latency: this kernel has no netem qdisc (sch_netem), so delay cannot be emulated here; shape the bandwidth alone"
    if [ -n "$bandwidth" ]; then
      # shellcheck disable=SC2046
      "${in[@]}" tc qdisc add dev "$dev" parent 1: handle 2: tbf $(tbf_args "$bandwidth")
    fi
  elif [ -n "$bandwidth" ]; then
    # shellcheck disable=SC2046
    "${in[@]}" tc qdisc add dev "$dev" root tbf $(tbf_args "$bandwidth")
  fi
}
shape_host() {
  shape_dev "" "$(veth_of "$1")"      # traffic to the host
  shape_dev "$(ns_of "$1")" eth0      # traffic from it
}

down() {
  local h
  if [ -f "$state/hosts" ]; then
    for h in $(hosts_of); do
      if ip netns list | grep -qw "$(ns_of "$h")"; then
        # shellcheck disable=SC2046
        kill -9 $(ip netns pids "$(ns_of "$h")") 2>/dev/null || true
        ip netns del "$(ns_of "$h")" 2>/dev/null || true
      fi
      ip link del "$(veth_of "$h")" 2>/dev/null || true
    done
  fi
  ip link del "$bridge" 2>/dev/null || true
  if grep -q "# $tag\$" /etc/hosts 2>/dev/null; then
    # In place (cat >, not mv): /etc/hosts may be a bind mount.
    grep -v "# $tag\$" /etc/hosts >"/tmp/hyfc-hosts.$$" || true
    cat "/tmp/hyfc-hosts.$$" >/etc/hosts
    rm -f "/tmp/hyfc-hosts.$$"
  fi
  rm -rf "$state"
}

up() {
  local n=${args[0]:-}
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "up N: N must be 1 to 200 hosts"
  command -v ip >/dev/null || die "ip not found (iproute2)"
  command -v unshare >/dev/null || die "unshare not found (util-linux)"
  [ ! -d "$state" ] || die "cluster '$name' is up already (scripts/fake-cluster.sh down --name $name)"
  [ -z "$bandwidth" ] || tbf_args "$bandwidth" >/dev/null || exit 2
  # A /24 of 10.213.0.0/16 that no other fake cluster uses (two `up`s at once take turns).
  local net="" k
  mkdir -p "$state_root"
  exec 9>"$state_root/.lock"
  flock 9
  for k in $(seq 1 250); do
    if ! grep -qsx "10.213.$k" "$state_root"/*/net; then net=10.213.$k; break; fi
  done
  [ -n "$net" ] || die "every 10.213.x.0/24 is taken by another fake cluster"
  # Every name this cluster would use is checked before anything is made: `up 1 --name
  # pq1` would make host pq11, which may be another cluster's (`up 11 --name pq`).
  local i h
  ! ip link show "$bridge" >/dev/null 2>&1 || die "a link named $bridge exists already"
  for i in $(seq 1 "$n"); do
    h=$name$i
    if grep -qsx "$h" "$state_root"/*/hosts; then
      die "host $h would be made, but another fake cluster has a host of that name ($(grep -lsx "$h" "$state_root"/*/hosts | xargs -n1 dirname | xargs -n1 basename | paste -sd' ')): choose another --name"
    fi
    ! ip netns list | grep -qw "$(ns_of "$h")" || die "a network namespace named $(ns_of "$h") exists already"
    ! ip link show "$(veth_of "$h")" >/dev/null 2>&1 || die "a link named $(veth_of "$h") exists already"
  done
  # A failed `up` removes what it made, and only that.
  local made_ns=() made_links=() made_bridge=0
  undo_up() {
    local x
    for x in "${made_ns[@]}"; do
      # shellcheck disable=SC2046
      kill -9 $(ip netns pids "$x") 2>/dev/null || true
      ip netns del "$x" 2>/dev/null || true
    done
    for x in "${made_links[@]}"; do ip link del "$x" 2>/dev/null || true; done
    [ "$made_bridge" = 0 ] || ip link del "$bridge" 2>/dev/null || true
    rm -rf "$state"
  }
  mkdir -p "$state"
  trap 'rc=$?; if [ $rc -ne 0 ]; then echo "fake-cluster: up failed; removing what it made" >&2; undo_up; fi' EXIT
  echo "$net" >"$state/net"
  ip link add "$bridge" type bridge
  made_bridge=1
  ip addr add "$net.1/24" dev "$bridge"
  ip link set "$bridge" up
  local entries="$net.1 $name-head # $tag"$'\n'
  for i in $(seq 1 "$n"); do
    h=$name$i
    mkdir -p "$state/local/$h"
    ip netns add "$(ns_of "$h")"
    made_ns+=("$(ns_of "$h")")
    echo "$h" >>"$state/hosts"
    ip link add "$(veth_of "$h")" type veth peer name eth0 netns "$(ns_of "$h")"
    made_links+=("$(veth_of "$h")")
    ip link set "$(veth_of "$h")" master "$bridge" up
    ip netns exec "$(ns_of "$h")" ip addr add "$net.$((10 + i))/24" dev eth0
    ip netns exec "$(ns_of "$h")" ip link set eth0 up
    ip netns exec "$(ns_of "$h")" ip link set lo up
    shape_host "$h"
    entries+="$net.$((10 + i)) $h # $tag"$'\n'
  done
  printf '%s' "$entries" >>/etc/hosts
  trap - EXIT
  echo "fake-cluster $name: $n hosts ($(hosts_of | paste -sd' ')) on $net.0/24${bandwidth:+, $bandwidth}${latency:+, +$latency}"
}

# Shell commands that mount this machine's cgroup hierarchies again: `ip netns exec` mounts a
# fresh /sys without them, and slurmd will not start without its cgroup plugin. Only
# mounts whose fields are plain words (letters, digits, _ . / , = : -) are repeated: they
# go into a shell string.
cgroup_mounts() {
  awk '$2 ~ "^/sys/fs/cgroup" && ($3 == "tmpfs" || $3 == "cgroup" || $3 == "cgroup2") &&
       ($1 $2 $3 $4) ~ /^[A-Za-z0-9_.\/,=:-]+$/ {
         printf "mkdir -p '\''%s'\'' && mount -t %s -o '\''%s'\'' '\''%s'\'' '\''%s'\''; ",
                $2, $3, $4, $1, $2 }' /proc/mounts
}

# Runs the shell string $2 on host $1: in its namespace, with its hostname, and with the
# directories `hide` named for it replaced by empty ones.
on_host() {
  local h=$1 line st hides="" cgroups
  st=$(state_of_host "$h")
  cgroups=$(cgroup_mounts)
  if [ -f "$st/hidden" ]; then
    while IFS=' ' read -r line; do
      [ "${line%% *}" = "$h" ] && hides+="mount -t tmpfs hyfc-hidden '${line#* }' && "
    done <"$st/hidden"
  fi
  exec ip netns exec "$(ns_of "$h")" unshare --uts --mount --propagation private -- \
    sh -c "hostname '$h' && { ${cgroups}true; } 2>/dev/null && mkdir -p '$st/local/$h' &&
      mount --bind '$st/local/$h' /var/tmp && ${hides} exec bash -c \"\$0\"" "$2"
}

case "$cmd" in
  up) need_root; up ;;
  down) need_root; down ;;
  hosts) hosts_of ;;
  env)
    [ -f "$state/net" ] || die "cluster '$name' is not up"
    net=$(cat "$state/net")
    echo "export OMPI_MCA_plm_rsh_agent='$self rsh'"
    echo "export OMPI_MCA_btl_tcp_if_include=$net.0/24"
    echo "export OMPI_MCA_oob_tcp_if_include=$net.0/24"
    ;;
  rsh)
    [ ${#args[@]} -ge 2 ] || die "rsh HOST CMD"
    on_host "${args[0]}" "${args[*]:1}"
    ;;
  exec)
    [ ${#args[@]} -ge 2 ] || die "exec HOST CMD..."
    on_host "${args[0]}" "$(printf '%q ' "${args[@]:1}")"
    ;;
  kill)
    need_root
    [ ${#args[@]} -ge 1 ] || die "kill HOST [SIGNAL]"
    state_of_host "${args[0]}" >/dev/null
    pids=$(ip netns pids "$(ns_of "${args[0]}")")
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -s "${args[1]:-KILL}" $pids
    echo "fake-cluster: ${args[1]:-KILL} to $(echo $pids | wc -w) process(es) on ${args[0]}"
    ;;
  link)
    need_root
    [ ${#args[@]} -eq 2 ] && { [ "${args[1]}" = up ] || [ "${args[1]}" = down ]; } ||
      die "link HOST up|down"
    state_of_host "${args[0]}" >/dev/null
    ip link set "$(veth_of "${args[0]}")" "${args[1]}"
    ;;
  shape)
    need_root
    [ ${#args[@]} -eq 1 ] || die "shape HOST|all --bandwidth RATE [--latency T]"
    if [ "${args[0]}" = all ]; then
      for h in $(hosts_of); do shape_host "$h"; done
    else
      state_of_host "${args[0]}" >/dev/null
      shape_host "${args[0]}"
    fi
    ;;
  hide)
    [ ${#args[@]} -eq 2 ] || die "hide HOST DIR"
    st=$(state_of_host "${args[0]}")
    dir=$(readlink -m "${args[1]}")
    echo "${args[0]} $dir" >>"$st/hidden"
    ;;
  *) usage ;;
esac
