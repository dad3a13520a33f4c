#!/usr/bin/env bash
# Checks that every file the build reads from the system (headers, libraries on link
# lines, CMake package and module files, pkg-config files, tools found by CMake) belongs
# to a Debian package that scripts/setup.sh installs, to the closure of their Depends
# (apt-cache depends --recurse --no-recommends --no-suggests), or to the base system
# (priority "required" or Essential). Anything else built here only because this machine
# happened to have it; on a fresh machine the build would fail. Fails naming the file and
# the package to add to scripts/setup.sh.
#
# Usage: scripts/check-deps.sh [--without PKG]... [BUILD_DIR ...]
#   (default: every configured build/*). --without drops a package from setup's list, to
#   show what would fail without it (the test `check_deps_names_a_missing_package`).
# Headers come from the build's dependency log (ninja -t deps) when the tree is built,
# otherwise from preprocessing every translation unit in compile_commands.json.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd -P)

without=()
dirs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --without) [ $# -ge 2 ] || { echo "check-deps: --without needs a package" >&2; exit 2; }
               without+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check-deps: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) dirs+=("$1"); shift ;;
  esac
done
if [ ${#dirs[@]} -eq 0 ]; then
  for d in build/*/; do [ -f "$d/build.ninja" ] && dirs+=("${d%/}"); done
fi
[ ${#dirs[@]} -gt 0 ] || { echo "check-deps: no configured build directory (run cmake --preset ci)" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
used="$tmp/used"
: >"$used"

headers_by_preprocessing() {  # $1: build dir; writes dependency lists of every TU
  local d=$1 i=0
  grep '"command":' "$d/compile_commands.json" |
    sed -e 's/^ *"command": "//' -e 's/",\{0,1\}$//' -e 's/\\"/"/g' -e 's/ -o [^ ]* / /' >"$tmp/commands"
  while IFS= read -r cmd; do
    i=$((i + 1))
    # -M lists every header (system ones too) instead of compiling.
    printf '%s\n' "cd '$d' && $cmd -M -MF '$tmp/dep.$i'"
  done <"$tmp/commands" | xargs -d '\n' -P "$(nproc)" -I{} sh -c '{}'
  cat "$tmp"/dep.* | tr ' \\' '\n\n' | grep '^/' || true
}

for d in "${dirs[@]}"; do
  [ -f "$d/build.ninja" ] || { echo "check-deps: $d is not a configured build directory" >&2; exit 2; }
  # CMake files read while configuring (ninja re-runs CMake when any of them changes).
  ninja -C "$d" -t query build.ninja | sed -n 's/^ *|\{0,1\} *\(\/.*\)$/\1/p' >>"$used"
  # Libraries on link lines: absolute paths, and -lNAME as the linker resolves it.
  for tok in $(sed -n 's/^ *LINK_LIBRARIES = //p' "$d/build.ninja"); do
    case "$tok" in
      /*) echo "$tok" ;;
      -l*) gcc -print-file-name="lib${tok#-l}.so" ;;
    esac
  done | grep '^/' >>"$used" || true
  # Files CMake found (find_library, find_program, ...), directories excluded.
  sed -n 's/^[A-Za-z0-9_]*:FILEPATH=\(\/.*\)$/\1/p' "$d/CMakeCache.txt" >>"$used"
  # pkg-config modules and everything they require.
  for mod in $(sed -n 's/^__pkg_config_arguments_[A-Za-z0-9_]*:INTERNAL=//p' "$d/CMakeCache.txt" |
               tr ';' '\n' | grep -v -e '^REQUIRED$' -e '^QUIET$' -e '^IMPORTED_TARGET$' -e '^GLOBAL$'); do
    for m in "$mod" $(pkg-config --print-requires --print-requires-private "$mod" 2>/dev/null | awk '{print $1}'); do
      pkg-config --path "$m" 2>/dev/null || true
    done
  done >>"$used"
  # Headers. (Read into a file first: `ninja -t deps | grep -q` under pipefail fails when
  # grep stops reading early, which sent every run to the 80 s preprocessing path below.)
  : >"$tmp/deps"
  [ -s "$d/.ninja_deps" ] && ninja -C "$d" -t deps 2>/dev/null | sed -n 's/^    \(\/.*\)$/\1/p' >"$tmp/deps"
  if [ -s "$tmp/deps" ]; then
    cat "$tmp/deps" >>"$used"
  else
    headers_by_preprocessing "$d" >>"$used"
  fi
done

# The CUDA toolkit a CUDA build uses (-DHYPERION_CUDA, docs/GPU.md) is not a Debian
# package: NVIDIA's installer puts it under its own root (/usr/local/cuda), which every
# project machine has. Files under the toolkit root each build recorded are accepted.
toolkits=()
for d in "${dirs[@]}"; do
  root=$(sed -n 's/^HYPERION_CUDA_TOOLKIT_ROOT:INTERNAL=\(\/.*\)$/\1/p' "$d/CMakeCache.txt")
  if [ -n "$root" ]; then
    toolkits+=("$root" "$(realpath -m "$root")")
  fi
done
if [ ${#toolkits[@]} -gt 0 ]; then
  for t in "${toolkits[@]}"; do grep -v "^$t/" "$used" >"$tmp/kept" || true; mv "$tmp/kept" "$used"; done
fi

# Normalise (.. segments) without resolving links, then add each link's final target: a
# development symlink (libfoo.so, -dev package) and its target (libfoo.so.1, runtime
# package) must both be installed.
sort -u "$used" | grep -v -e "^$src/" -e '^/proc/' >"$tmp/raw" || true
xargs -r -d '\n' realpath -s -m -- <"$tmp/raw" | sort -u >"$tmp/plain"
xargs -r -d '\n' realpath -m -- <"$tmp/plain" | sort -u >"$tmp/resolved"
# A link no package owns (update-alternatives' /usr/bin/c++, say) is vouched for by its
# target, which is checked in its own right.
sort -u "$tmp/plain" "$tmp/resolved" | grep -v "^$src/" | while IFS= read -r f; do
  [ -d "$f" ] || echo "$f"
done >"$tmp/files"
while IFS= read -r f; do [ -L "$f" ] && echo "$f"; done <"$tmp/files" >"$tmp/links"

# Who owns each file. Debian 12 merged /usr: packages may list /lib/... for /usr/lib/...
awk '{ p = FILENAME; sub(/.*\//, "", p); sub(/\.list$/, "", p); sub(/:.*/, "", p); print $0 "\t" p }' \
  /var/lib/dpkg/info/*.list >"$tmp/owners"

# Allowed packages: setup's, their Depends closure, and the base system.
scripts/setup.sh --list >"$tmp/listed"
# grep exits 1 when it selects nothing (every package dropped); anything else is an error.
grep -vxF -f <(printf '%s\n' "${without[@]}" "") "$tmp/listed" >"$tmp/setup" || [ $? -eq 1 ]
apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances $(cat "$tmp/setup") 2>/dev/null |
  sed -n 's/^\([^ ].*\)$/\1/p; s/^ *|\{0,1\}\(Pre\)\{0,1\}Depends: \(.*\)$/\2/p' |
  sed 's/[<>]//g; s/:.*//' >"$tmp/allowed"
cat "$tmp/setup" >>"$tmp/allowed"
dpkg-query -W -f='${Package} ${Priority} ${Essential}\n' |
  awk '$2 == "required" || $3 == "yes" { print $1 }' >>"$tmp/allowed"
sort -u -o "$tmp/allowed" "$tmp/allowed"

awk -F'\t' -v allowed="$tmp/allowed" -v owners="$tmp/owners" -v links="$tmp/links" '
  function alt(f) {
    if (f ~ /^\/usr\/(lib|lib32|lib64|libx32|bin|sbin)\//) return substr(f, 5)
    if (f ~ /^\/(lib|lib32|lib64|libx32|bin|sbin)\//) return "/usr" f
    return ""
  }
  BEGIN {
    while ((getline line < allowed) > 0) ok[line] = 1
    while ((getline line < links) > 0) link[line] = 1
    while ((getline line < owners) > 0) {
      split(line, a, "\t")
      own[a[1]] = (a[1] in own) ? own[a[1]] " " a[2] : a[2]
    }
  }
  {
    f = $0; who = ""
    if (f in own) who = own[f]
    a2 = alt(f)
    if (a2 != "" && (a2 in own)) who = who " " own[a2]
    if (who == "") {
      if (!(f in link)) { printf "%s\tnone\n", f; bad++ }
      next
    }
    n = split(who, pk, " "); good = 0
    for (i = 1; i <= n; i++) if (pk[i] != "" && (pk[i] in ok)) good = 1
    if (!good) { printf "%s\t%s\n", f, pk[1]; bad++ }
    files++
  }
  END { printf "%d\n", files > "/dev/stderr" }
' "$tmp/files" >"$tmp/bad" 2>"$tmp/count"

if [ -s "$tmp/bad" ]; then
  echo "check-deps: the build reads files that scripts/setup.sh does not install:" >&2
  awk -F'\t' '$2 == "none" { printf "  %s: belongs to no Debian package (installed by hand?)\n", $1 }
              $2 != "none" { printf "  %s: from package %s\n", $1, $2 }' "$tmp/bad" | head -40 >&2
  pkgs=$(awk -F'\t' '$2 != "none" { print $2 }' "$tmp/bad" | sort -u | tr '\n' ' ')
  [ -n "$pkgs" ] && echo "check-deps: add to PACKAGES in scripts/setup.sh: $pkgs" >&2
  exit 1
fi
echo "check-deps: $(cat "$tmp/count") system files read by ${dirs[*]}, all from packages setup installs, their Depends or the base system"
