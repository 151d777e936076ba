#!/usr/bin/env bash
# The whole test suite, as README and CI run it. Installs the peer tools the tests
# compare against (util-linux fincore, smem, bpftrace), the BPF toolchain (clang, llvm,
# libbpf-dev) and lavapipe, the CPU Vulkan driver the probe tests run on
# (mesa-vulkan-drivers, libvulkan1), when they are missing and we are root.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v fincore >/dev/null 2>&1 || need+=(util-linux)
command -v smem >/dev/null 2>&1 || need+=(smem)
# eBPF tests (tests/trace/): bpftrace as the independent counter; clang, llvm-strip
# and libbpf's headers to rebuild ebpf/*.bpf.o and compare them with the committed ones.
command -v bpftrace >/dev/null 2>&1 || need+=(bpftrace)
command -v clang >/dev/null 2>&1 || need+=(clang)
command -v llvm-strip >/dev/null 2>&1 || need+=(llvm)
[ -e /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
# Recordings (tests/exact/record.rs): promtool checks and backfills `dump --format openmetrics`,
# and a real Prometheus serves the backfilled blocks (queried with curl).
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v curl >/dev/null 2>&1 || need+=(curl)
# serve's TLS test makes a self-signed certificate.
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# `twofold top` end to end (tests/exact/top.rs): a detached tmux session, driven with send-keys.
command -v tmux >/dev/null 2>&1 || need+=(tmux)
# The container image (tests/host/image.rs): buildah assembles it from a local root file
# system, podman runs it with runc (crun refuses hybrid cgroup layouts).
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
# llama.cpp, built from source for tests/exact/llama.rs (scripts/llama-cache.sh): a C++
# compiler (cmake and ninja come from pip).
command -v g++ >/dev/null 2>&1 || need+=(g++)
# Hung and slow filesystems (tests/exact/fuse.rs): a FUSE filesystem of the test's own
# (tests/helpers/slowfuse.py, fusepy), which needs libfuse.so.2 (Debian 12: libfuse2) and
# the fusermount helper (Debian 12: fuse3, whose /bin/fusermount is fusermount3).
command -v fusermount >/dev/null 2>&1 || need+=(fuse3)
ldconfig -p 2>/dev/null | grep 'libfuse.so.2 ' >/dev/null || need+=(libfuse2)
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || need+=(mesa-vulkan-drivers)
ldconfig -p 2>/dev/null | grep 'libvulkan.so.1 ' >/dev/null || need+=(libvulkan1)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "test.sh: missing ${need[*]} (install them, or run as root to have them installed)" >&2
  fi
fi

# Real runtimes for tests/exact/runtimes.rs: NumPy and safetensors from PyPI; onnx for the
# cross-check of the ONNX parser (tests/it/container/onnx_initializers.rs); prometheus-client, the official
# Python client, whose OpenMetrics parser reads `twofold serve`'s body (tests/exact/serve.rs).
# kubernetes-validate: the Kubernetes OpenAPI schemas, offline, for deploy/k8s
# (tests/it/deploy.rs; the kustomize base is rendered with `kubectl kustomize`).
# bcrypt: the hashes of serve's --web.config.file test (tests/exact/serve/web.rs).
# ml_dtypes: bfloat16 for NumPy (JAX's), the BF16 conversions of tests/exact/convert.rs where
# torch is not installed. pyyaml: imported by llama.cpp's gguf-py, which writes the model of
# tests/exact/llama.rs. fusepy (imported as `fuse`): the FUSE filesystem of tests/exact/fuse.rs.
if ! python3 -c "import numpy, safetensors, onnx, onnxruntime, prometheus_client, kubernetes_validate, bcrypt, ml_dtypes, yaml, fuse" >/dev/null 2>&1; then
  echo "test.sh: installing numpy, safetensors, onnx, onnxruntime, prometheus-client, kubernetes-validate, bcrypt, ml_dtypes, pyyaml and fusepy (pip)"
  python3 -m pip install -q numpy safetensors onnx onnxruntime prometheus-client kubernetes-validate bcrypt ml_dtypes pyyaml fusepy
fi
# llama.cpp (tests/exact/llama.rs: CPU repack end to end), built once into target/llama-cache
# before the tests (about 15 minutes on a 2-core machine the first time, then nothing); the
# build's output stays in the cache's log files. A failed build fails those tests, not this.
llama_cache=$(scripts/llama-cache.sh path)
mkdir -p "$llama_cache"
llama_start=$SECONDS
if scripts/llama-cache.sh tools >/dev/null 2>"$llama_cache/tools.log"; then
  echo "test.sh: llama.cpp tools in $llama_cache ($((SECONDS - llama_start)) s)"
else
  echo "test.sh: building llama.cpp failed (scripts/llama-cache.sh tools; see $llama_cache/*.log)" >&2
fi
# That llama.cpp is built for haswell's features (AVX2, no AVX-512, no AMX): twofold is told
# so, as a user of such a build is told to (docs/dupes.md). On a host with AVX-512 and AMX
# granted, twofold would otherwise look for the layouts of a build for that host (AMX tiles)
# and rightly find none of them in the tests' llama.cpp. Tests of other builds' layouts set
# or remove the variable themselves.
export TWOFOLD_LLAMA_CPU=haswell
command -v kubectl >/dev/null 2>&1 || echo "test.sh: kubectl is missing (tests/it/deploy.rs renders the kustomize base with it)" >&2

status=0
cargo fmt --all -- --check || status=1
cargo clippy --workspace --all-targets -- -D warnings || status=1
log=$(mktemp)
# The proof's point cache (src/dupes/pointcache.rs) of the tests' model files: in a
# directory of the run's own, not the host's /var/cache/twofold.
export TWOFOLD_INDEX_CACHE
TWOFOLD_INDEX_CACHE=$(mktemp -d /tmp/twofold-test-index.XXXXXX)
trap 'rm -f "$log"; rm -rf "$TWOFOLD_INDEX_CACHE"' EXIT
# Every test binary runs even after one fails (--no-fail-fast); --show-output keeps the
# "SKIPPED: <reason>" lines of tests that found a capability missing, so that they are
# counted as skipped, not passed.
cargo test --workspace --all-targets --no-fail-fast -- --show-output 2>&1 | tee "$log" || status=1
cargo test --workspace --doc --no-fail-fast 2>&1 | tee -a "$log" || status=1
# Why each failed test failed, again at the end (a long log's tail is what a reader sees
# first): the panic's line and the four after it, 80 lines at most.
grep -A4 "^thread '.*' .*panicked at" "$log" | head -80 | sed 's/^/failure: /' || true
# One closing line for the whole suite (cargo prints one per test binary), always printed.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1); if ($(i) ~ /^ignored;?$/) g += $(i-1) } }
     /^SKIPPED: / { s += 1 }
     /^error(\[E[0-9]+\])?: / && !/^error: ([0-9]+ targets? failed|test failed)/ { e += 1 }
     END { printf "tests: %d passed, %d failed, %d skipped (%d at run time: a capability missing here, %d ignored)%s\n", p - s, f, s + g, s, g, (e ? sprintf(", %d build errors", e) : "") }' "$log"
exit $status
