#!/usr/bin/env bash
# clang-tidy over every source and test file with the checks in .clang-tidy, using the
# compile commands of a configured build (default build/ci). A file that passed is
# remembered by the hash of its text, the project headers it includes (the build's
# dependency log), .clang-tidy and clang-tidy's version, so an unchanged file is not
# checked again (~/.cache/hyperion-lint; a CI run checks only what changed).
#
# Usage: scripts/lint.sh [BUILD_DIR]       Exit status 1 when clang-tidy reports anything.
# (bench/blas/ is left out: it includes OpenBLAS's C header, which is not C++.)
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd -P)
build=${1:-build/ci}
tidy=$(command -v clang-tidy-14 || command -v clang-tidy || true)
[ -n "$tidy" ] || { echo "lint: clang-tidy not found (scripts/setup.sh installs clang-tidy-14)" >&2; exit 2; }
[ -f "$build/compile_commands.json" ] || { echo "lint: $build is not configured (cmake --preset ci)" >&2; exit 2; }
cache=${XDG_CACHE_HOME:-$HOME/.cache}/hyperion-lint
mkdir -p "$cache"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

salt=$( { "$tidy" --version; cat .clang-tidy; } | sha1sum | cut -c1-40)
# Project headers each object depends on, from the build's dependency log.
ninja -C "$build" -t deps 2>/dev/null | awk -v src="$src/" '
  /^[^ ].*: #deps/ { obj = $1; sub(/:$/, "", obj); next }
  /^    / { f = $1; if (index(f, src) == 1 && f ~ /\.h$/) print obj "\t" f }' >"$tmp/deps"

sed -n 's/^ *"file": "\(.*\)",\{0,1\}$/\1/p' "$build/compile_commands.json" |
  grep -E "^$src/(src|tests|bench|fuzz)/" | grep -v -e "/generated/" -e "/bench/blas/" |
  grep -v '\.cu$' |  # nvcc's command lines are not clang's; the host-side .cc files are linted
  sort -u >"$tmp/files"
todo=()
while IFS= read -r f; do
  rel=${f#"$src"/}
  key=$( { echo "$salt"; cat "$f"; awk -F'\t' -v r="/$rel.o" 'substr($1, length($1) - length(r) + 1) == r { print $2 }' "$tmp/deps" | sort -u | xargs -r cat; } | sha1sum | cut -c1-40)
  if [ -e "$cache/$key" ]; then continue; fi
  todo+=("$f")
  echo "$f $key" >>"$tmp/keys"
done <"$tmp/files"
total=$(wc -l <"$tmp/files")
if [ ${#todo[@]} -eq 0 ]; then
  echo "lint: $total files, all unchanged since they last passed"
  exit 0
fi
echo "lint: clang-tidy on ${#todo[@]} of $total files"
status=0
printf '%s\n' "${todo[@]}" | xargs -d '\n' -P "$(nproc)" -I{} sh -c \
  '"$0" -p "$1" --quiet "{}" >"$2/$(echo "{}" | sha1sum | cut -c1-12).out" 2>/dev/null || true' \
  "$tidy" "$build" "$tmp"
for f in "${todo[@]}"; do
  out="$tmp/$(echo "$f" | sha1sum | cut -c1-12).out"
  if grep -qE "(warning|error): " "$out"; then
    grep -E -A3 "(warning|error): " "$out" | head -40
    status=1
  else
    touch "$cache/$(awk -v f="$f" '$1 == f { print $2 }' "$tmp/keys")"
  fi
done
[ $status -eq 0 ] && echo "lint: clean"
exit $status
