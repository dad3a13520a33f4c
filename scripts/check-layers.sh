#!/usr/bin/env bash
# Checks that every source file includes only its own layer and the layers below it
# (docs/ARCHITECTURE.md); the CMake targets enforce the same order at link time.
#   scripts/check-layers.sh [SOURCE_DIR]
# Prints each offending include (file:line: layer -> included layer) and exits 1 when
# there is one.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
declare -A allowed=(
  [base]="base"
  [tensor]="base tensor"
  [kernels]="base tensor kernels"
  [dist]="base dist"
  [monitor]="base monitor"
  [model]="base tensor kernels dist model"
  [io]="base tensor kernels dist model io"
  [recsys]="base tensor kernels dist model io recsys"
  [train]="base tensor kernels dist model io monitor recsys train"
  [serve]="base tensor kernels model io monitor serve"
  [launch]="base tensor kernels dist model io launch"
  [cases]="base tensor kernels dist model cases"
  [cli]="base tensor kernels dist model io monitor recsys train serve launch cases cli"
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
for layer in base tensor kernels dist monitor model io recsys train serve launch cli; do
  check_dir "$layer" "$root/src/$layer"
done
check_dir cases "$root/bench/cases"
if [ "$bad" -ne 0 ]; then
  echo "check-layers: includes that cross the layer order above" >&2
  exit 1
fi
echo "check-layers: every include follows the layer order"
