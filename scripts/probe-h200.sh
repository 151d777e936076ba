#!/usr/bin/env bash
# The H200 run behind docs/probe-h200.md. Run on the GPU machine from the folder that
# holds a stripped x86-64 release build of `twofold` and the Debian .debs of libvulkan1,
# libglvnd0, libegl1, libgl1, libglx0, libgles2, libopengl0 (`apt-get download ...`):
# that machine has no Vulkan loader, and NVIDIA's ICD comes with the driver. Results go
# to $OUT (default ./out): caps.{txt,json}, probe-8g.{json,txt}.
set -u
C=${1:-.}
OUT=${OUT:-./out}
mkdir -p "$OUT"
for f in "$C"/*.deb; do dpkg -x "$f" /; done
ldconfig
export PATH=$C:$PATH
ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f $ICD ] && export VK_DRIVER_FILES=$ICD
twofold probe --caps > "$OUT/caps.txt" 2>&1; cat "$OUT/caps.txt"
twofold probe --caps --json > "$OUT/caps.json" 2>/dev/null
CMD="twofold probe --size 8G --dir /tmp --passes 5 --processes 3 --timeout 120"
echo "\$ $CMD --json"
T0=$(date +%s)
timeout 500 $CMD --json > "$OUT/probe-8g.json" 2> "$OUT/probe-8g.err"
echo "exit $? after $(( $(date +%s) - T0 )) s"; tail -5 "$OUT/probe-8g.err"
twofold probe --report "$OUT/probe-8g.json" | tee "$OUT/probe-8g.txt"
