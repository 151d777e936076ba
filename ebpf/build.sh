#!/usr/bin/env bash
# Builds the BPF objects twofold embeds (ebpf/*.bpf.o, committed) and records
# what they were built from in ebpf/objects.lock. Needs clang (Debian clang 14
# is what the committed objects come from) and libbpf's headers (libbpf-dev).
#
#   ebpf/build.sh            rebuild the committed objects in ebpf/
#   ebpf/build.sh OUTDIR     build into OUTDIR instead (the tests compare them)
set -euo pipefail
cd "$(dirname "$0")"
out="${1:-.}"
mkdir -p "$out"
CLANG="${CLANG:-clang}"
for src in *.bpf.c; do
  obj="$out/${src%.c}.o"
  # Relative paths and -fdebug-prefix-map keep the object independent of where
  # the checkout lives; -g gives the BTF (and CO-RE relocations) aya needs;
  # -mcpu=v3 for atomic fetch-and-modify; DWARF is stripped, BTF kept.
  "$CLANG" -g -O2 -target bpf -mcpu=v3 -D__TARGET_ARCH_x86 \
    -fdebug-prefix-map="$PWD"=. -I. -Wall -Werror \
    -c "$src" -o "$obj"
  if command -v llvm-strip >/dev/null 2>&1; then
    llvm-strip -g "$obj"
  else
    "$(dirname "$(readlink -f "$(command -v "$CLANG")")")/llvm-strip" -g "$obj"
  fi
done
if [ "$out" = . ]; then
  {
    echo "# Written by ebpf/build.sh; checked by tests/trace.rs."
    echo "clang: $("$CLANG" --version | head -1)"
    echo "sources: $(cat build.sh twofold.h kernel.h common.h uargs.h *.bpf.c | sha256sum | cut -d' ' -f1)"
    for o in *.bpf.o; do echo "object $o: $(sha256sum "$o" | cut -d' ' -f1)"; done
  } > objects.lock
fi
