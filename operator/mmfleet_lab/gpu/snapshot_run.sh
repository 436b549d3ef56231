#!/usr/bin/env bash
# vLLM 0.33's snapshot restore against a cold start (issue 26), on the GPU host: measure_snapshot.py with the carried
# vLLM tree (the PyPI wheel trimmed to what an H100/H200 runs, with its resolved dependencies, as tests/data/README.md
# describes), CRIU 4.2 with its CUDA plugin, NVIDIA's cuda-checkpoint, and the Qwen2.5-VL-7B config of the calibration
# runs with Qwen2's tokenizer files.
#
# Usage (on the GPU host, as root): snapshot_run.sh stage|run
#   stage: copy the carried bundle parts (.gpu/snap/part_*) to $PARTS and stop (the working tree's limit: a call each);
#   run:   the same, extract the parts into $STAGE if not yet done, apply vllm_snapshot_lab.patch if not yet applied,
#          check the tools, then measure_snapshot.py; every vLLM process is stopped at the end.
# Carried beside the parts: .gpu/snap/tools (bin/criu, bin/cuda-checkpoint, plugins/cuda_plugin.so, lib/) and
# .gpu/snap/model. Env: STAGE (/root/snapstage), PARTS (/root/snapparts), OUT (results), RUN_SECONDS (the whole run
# ends inside it), RESTORES (3).
set -u
MODE=${1:-run}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
STAGE=${STAGE:-/root/snapstage}
PARTS=${PARTS:-/root/snapparts}
OUT=${OUT:-/tmp/snap_out}
RUN_SECONDS=${RUN_SECONDS:-540}
RESTORES=${RESTORES:-3}
SNAP=/root/snapshots/qwen
T0=$(date +%s)
log() { echo "[snapshot $(date -u +%H:%M:%S) +$(($(date +%s) - T0))s] $*"; }

mkdir -p "$PARTS" "$OUT"
for f in "$REPO"/.gpu/snap/part_*; do [ -f "$f" ] && cp "$f" "$PARTS/"; done
log "mode $MODE; parts here: $(cd "$PARTS" && for f in part_*; do printf '%s %s ' "$f" "$(stat -c %s "$f" 2> /dev/null)"; done)"
[ "$MODE" = stage ] && exit 0

if [ ! -d "$STAGE/site/vllm" ]; then
  mkdir -p "$STAGE"
  cat "$PARTS"/part_* | xz -dc -T0 | tar -x -C "$STAGE" || { log "extract FAILED"; exit 1; }
  log "extracted: $(du -sh "$STAGE" | cut -f1)"
fi
if (cd "$STAGE/site" && patch -p1 -R -s -f --dry-run < "$HERE/vllm_snapshot_lab.patch" > /dev/null 2>&1); then
  log "lab patch already applied"
else
  (cd "$STAGE/site" && patch -p1 -s < "$HERE/vllm_snapshot_lab.patch") || { log "patch FAILED"; exit 1; }
fi

TOOLS=$REPO/.gpu/snap/tools
chmod +x "$TOOLS"/bin/*
export PATH=$TOOLS/bin:$PATH CRIU_CUDA_PLUGIN_DIR=$TOOLS/plugins
export PYTHONPATH=$STAGE/site:$STAGE/depsite:$REPO/operator
export HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 MMFLEET_LAB_LOCAL_MODEL=1
ulimit -n 65536 2> /dev/null || ulimit -n 16384 2> /dev/null
sysctl -w kernel.io_uring_disabled=2
criu --version | head -1
criu check 2>&1 | tail -1
cuda-checkpoint --help > /dev/null 2>&1 && echo "cuda-checkpoint runs"
nvidia-smi --query-gpu=name,uuid,memory.total,driver_version --format=csv,noheader
uname -r
rm -rf /root/model /root/snapshots && mkdir -p /root/model && cp "$REPO"/.gpu/snap/model/* /root/model/

timeout -k 10 $((RUN_SECONDS - (($(date +%s) - T0)) - 30)) python3 -m mmfleet_lab.gpu.measure_snapshot \
  --out "$OUT/snapshot.csv" --log "$OUT/commands.log" --snapshot-dir "$SNAP" --restores "$RESTORES" --cold-start -- \
  /root/model --served-model-name qwen --load-format dummy --limit-mm-per-prompt '{"image":4,"video":0}'
log "measure_snapshot exit $?"

pkill -9 -f "vllm" 2> /dev/null
for f in child.log manifest.json images/dump.log images/restore.log; do [ -f "$SNAP/$f" ] && cp "$SNAP/$f" "$OUT/"; done
[ -d "$SNAP/images" ] && du -sb "$SNAP/images" > "$OUT/images_bytes.txt"
ls -la "$SNAP" 2> /dev/null
log "done"
