#!/usr/bin/env bash
# Checks that every source file includes only its own layer and the layers below it
# (docs/ARCHITECTURE.md); the CMake targets enforce the same order at link time. Also
# that no source includes <regex>.
#   scripts/check-layers.sh [SOURCE_DIR]
# Prints each offending include (file:line: layer -> included layer) and exits 1 when
# there is one.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
declare -A allowed=(
  [base]="base"
  [tensor]="base tensor"
  [io]="base tensor io"
  [text]="base tensor io text"
  [kernels]="base tensor kernels"
  [dist]="base dist"
  [monitor]="base monitor"
  [model]="base tensor io kernels dist model"
  [convert]="base tensor io text kernels dist model convert"
  [recsys]="base tensor io kernels dist model recsys"
  [diffusion]="base tensor io text kernels dist model diffusion"
  [train]="base tensor io text kernels dist model convert monitor recsys diffusion train"
  [serve]="base tensor io text kernels model monitor diffusion serve"
  [launch]="base tensor io dist launch"
  [cases]="base tensor kernels dist model cases"
  [cli]="base tensor io text kernels dist model convert monitor recsys diffusion train serve launch cases cli"
)
bad=0
check_dir() {  # check_dir LAYER DIR
  local layer=$1 dir=$2
  while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    inc=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$rest")
    case " ${allowed[$layer]} " in
      *" $inc "*) ;;
      *)
        echo "${file#"$root"/}:$line: $layer includes $inc (allowed: ${allowed[$layer]})"
        bad=1
        ;;
    esac
  done < <(grep -rnE '^#include "[a-z_]+/' "$dir" --include='*.cc' --include='*.h' || true)
}
for dir in "$root"/src/*/; do
  layer=$(basename "$dir")
  if [ -z "${allowed[$layer]+x}" ]; then
    echo "src/$layer: a layer this script does not know (add it to 'allowed' and docs/ARCHITECTURE.md)"
    bad=1
    continue
  fi
  check_dir "$layer" "$dir"
done
check_dir cases "$root/bench/cases"
# std::regex stays out of the sources: it is slow, and tests/tsan.supp silences races
# inside it (cpp-httplib's client regex), which would hide a race of ours in it.
while IFS= read -r hit; do
  echo "${hit#"$root"/}: std::regex in src/ (see tests/tsan.supp)"
  bad=1
done < <(grep -rnE '#include <regex>' "$root/src" "$root/bench/cases" || true)
if [ "$bad" -ne 0 ]; then
  echo "check-layers: includes that cross the layer order above, or <regex>" >&2
  exit 1
fi
echo "check-layers: every include follows the layer order"
