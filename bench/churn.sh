#!/usr/bin/env bash
# Issue #43's fourth host: one Python serving process holding a read() copy of a 256 MiB
# model and rewriting a 512 MiB buffer at 52 MiB/s, every 4 MiB write from a newly mapped
# buffer (its mappings come and go every second), and nothing else: bench/host.sh with
# every other part of its host set to zero. Each live view beside htop, btop,
# node-exporter and process-exporter, as there; settings as there (these are defaults).
#   bash bench/churn.sh                 (root)
cd "$(dirname "$0")/.."
export PY_SERVERS=${PY_SERVERS:-1} PY_RATE=${PY_RATE:-52M} MODEL_SIZE=${MODEL_SIZE:-256M}
export KV=${KV:-512M} DAEMONS=${DAEMONS:-0} POOL_SIZE=${POOL_SIZE:-0} IDLE=${IDLE:-0}
export FILES=${FILES:-0} CHURN=${CHURN:-0}
exec bash bench/host.sh "$@"
