#!/usr/bin/env bash
# Installs every system dependency hyperion needs from Debian 12 packages.
# Non-interactive and idempotent: packages already present are skipped.
# `scripts/setup.sh --list` prints the package names, one per line, and installs nothing
# (scripts/check-deps.sh reads them).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ccache
  libdnnl-dev        # oneDNN: GEMM (f32, bf16, int8), OpenMP runtime
  ocl-icd-opencl-dev # OpenCL headers + loader: Debian's oneDNN CMake package requires them
                     # (libdnnl-dev only recommends it, and recommends are not installed)
  libhwy-dev         # Highway: portable SIMD with run-time dispatch
  libfmt-dev         # formatting
  nlohmann-json3-dev # JSON
  libyaml-cpp-dev    # YAML configs
  libsentencepiece-dev  # tokenizer training and encoding
  libpcre2-dev       # Hugging Face tokenizer.json: the pre-tokenizers' Unicode regexes
  libutf8proc-dev    # Hugging Face tokenizer.json: NFC/NFKC normalizers
  libboost1.81-dev   # Boost.Beast + Asio: the HTTP server of hyperion serve
  libcpp-httplib-dev # HTTP client (bench serve, tests)
  libdw-dev          # elfutils libdw: symbolized stack dumps of crashed and hung ranks
  libpng-dev libturbojpeg0-dev  # PNG and JPEG images (diffusion datasets and outputs)
  zlib1g-dev         # gzip: the Fashion-MNIST idx files
  dataset-fashion-mnist  # the diffusion models' embedded default dataset (/usr/share/datasets)
  libgtest-dev libgmock-dev  # tests
  clang-14 libclang-rt-14-dev  # libFuzzer fuzzers (scripts/fuzz.sh)
  libomp-14-dev      # clang's OpenMP runtime (the fuzz build compiles with clang -fopenmp)
  llvm-14 lld-14     # the tools CMake picks for a clang build (llvm-ar, ld.lld), and
                     # llvm-symbolizer for sanitizer stack traces
  clang-tidy-14      # scripts/lint.sh
  libbenchmark-dev   # microbenchmarks
  libopenblas-dev    # GEMM comparison benchmark only (never linked into libhyperion)
  libopenmpi-dev openmpi-bin  # MPI: multi-process training (hyperion train --nproc)
  python3-torch      # reference tests and bench/compare_torch.py only (/usr/bin/python3)
  python3-jinja2     # chat-template reference test only: the engine transformers renders with
  python3-jsonschema # structured-output test only: an independent JSON Schema validator
  chromium           # headless browser: the hyperion monitor test checks that its page draws
  prometheus         # the monitoring integration test scrapes a 2-rank run with it
  slurm-wlm munge    # the Slurm backend's integration test runs a one-node Slurm
  iproute2 util-linux  # scripts/fake-cluster.sh: hosts as network namespaces (multi-host tests)
)

if [ "${1:-}" = "--list" ]; then
  printf '%s\n' "${PACKAGES[@]}"
  exit 0
fi
with_tests=0
case "${1:-}" in
  "") ;;
  --tests) with_tests=1 ;;  # also the test-only npm packages (tests/js): scripts/test.sh
  *) echo "usage: scripts/setup.sh [--list|--tests]" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
apt_install() {
  echo "setup: installing $*"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "$@"
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
else
  apt_install "${missing[@]}"
fi

# hyperion monitor's page embeds uPlot, which the build reads from web/node_modules
# (cmake/web_assets.cmake): installed from npm's registry at the version web/package-lock.json
# pins, not copied into the repository. `npm ci` runs only when the installed version is
# missing or differs; the machine's npm, or Debian's when there is none.
web="$(cd "$(dirname "$0")/.." && pwd)/web"
json_value() {  # FILE KEY...: the value at that path, empty when absent
  python3 -c 'import json, sys
try:
    v = json.load(open(sys.argv[1]))
    for k in sys.argv[2:]: v = v[k]
    print(v)
except Exception: pass' "$@"
}
locked=$(json_value "$web/package-lock.json" packages node_modules/uplot version)
installed=$(json_value "$web/node_modules/uplot/package.json" version)
if [ "$installed" = "$locked" ]; then
  echo "setup: web/node_modules has uplot $locked"
else
  command -v npm >/dev/null || apt_install npm
  echo "setup: npm ci --prefix web (uplot ${installed:-missing}, locked $locked)"
  npm ci --prefix "$web" --no-audit --no-fund
fi

# The tests' reference implementations (tests/js/package.json: transformers.js's
# tokenizers with the real Llama 3, Qwen3, Gemma 3 and Llama 2 tokenizer files, the OpenAI
# Node SDK), at the versions tests/js/package-lock.json pins; test runs only (--tests), as
# they are large (~500 MB) and nothing at run time uses them.
if [ "$with_tests" -eq 1 ]; then
  tests_js="$(cd "$(dirname "$0")/.." && pwd)/tests/js"
  stale=$(python3 -c 'import json, os, sys
d = sys.argv[1]
lock = json.load(open(os.path.join(d, "package-lock.json")))["packages"]
for name in json.load(open(os.path.join(d, "package.json")))["dependencies"]:
    try:
        have = json.load(open(os.path.join(d, "node_modules", name, "package.json")))["version"]
    except Exception:
        have = None
    if have != lock["node_modules/" + name]["version"]:
        print(name)' "$tests_js")
  if [ -z "$stale" ]; then
    echo "setup: tests/js/node_modules is as tests/js/package-lock.json pins"
  else
    command -v npm >/dev/null || apt_install npm
    echo "setup: npm ci --prefix tests/js ($(echo $stale | tr '\n' ' ')missing or other versions)"
    npm ci --prefix "$tests_js" --no-audit --no-fund
  fi
fi
