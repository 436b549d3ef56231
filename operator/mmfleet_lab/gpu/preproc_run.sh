#!/usr/bin/env bash
# PreprocessingBound on a real server: the calibration's aggregated vLLM 0.33.0 server (epd_run.sh agg's command line:
# vLLM's defaults, one API server process, --limit-mm-per-prompt '{"image":4,"video":0}', dummy weights) under open-loop
# load meant to make its API server, not the GPU, the bottleneck: PNG images (dearer to decode than JPEG) and very
# short outputs (2 tokens), at rising rates. mm_loadgen.py builds every phase's bodies in worker processes while the
# server starts, waits for it, sends 2 warm-up requests of each kind, scrapes /metrics before the first phase and after
# each; preproc_sampler.py samples the series the operator reads every 2 s; preproc_table.py makes the per-phase table.
#
# Usage (on the GPU host): preproc_run.sh stage|run
#   stage: copy the carried bundle parts (.gpu/pre/pre_*) to $PARTS and stop (one part per call: the tree's limit);
#   run:   the same, extract the parts into $STAGE if not yet done, then the run above.
# Env: STAGE (/root/stage), PARTS (/root/parts), OUT (results), RUN_SECONDS (the whole run ends inside it), PY, PHASES
# (mm_loadgen's --phases: rate:seconds:WxH:fmt:n_img:n_out:words,...), DRAIN (its --drain), JOBS (prebuild workers), SERVER_CMD (a stand-in
# server instead of vLLM, to try the script out without a GPU).
set -u
MODE=${1:-run}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
STAGE=${STAGE:-/root/stage}
PARTS=${PARTS:-/root/parts}
OUT=${OUT:-/tmp/pre_out}
PY=${PY:-$(command -v python3)}
RUN_SECONDS=${RUN_SECONDS:-500}
JOBS=${JOBS:-10}
T0=$(date +%s)
END=$((T0 + RUN_SECONDS))
PHASES=${PHASES:-20:15:1280x720:png:1:2:20,100:15:112x112:png:4:2:10,200:15:112x112:png:4:2:10,40:15:1280x720:png:1:2:20}
DRAIN=${DRAIN:-8}
LOGS=/tmp/pre_logs
log() { echo "[preproc $(date -u +%H:%M:%S) +$(($(date +%s) - T0))s] $*"; }

mkdir -p "$PARTS" "$OUT" "$LOGS"
for f in "$REPO"/.gpu/pre/pre_*; do [ -f "$f" ] && cp "$f" "$PARTS/"; done
log "mode $MODE; parts here: $(cd "$PARTS" && for f in pre_*; do printf '%s %s ' "$f" "$(stat -c %s "$f" 2> /dev/null)"; done)"
[ "$MODE" = stage ] && exit 0

if [ ! -d "$STAGE/site/vllm" ] && [ -z "${SERVER_CMD:-}" ]; then
  mkdir -p "$STAGE"
  cat "$PARTS"/pre_* | xz -dc -T0 | tar -x -C "$STAGE" || { log "extract FAILED"; exit 1; }
  log "extracted: $(du -sh "$STAGE" | cut -f1)"
fi
export PYTHONPATH=$STAGE/site:$STAGE/depsite${PYTHONPATH:+:$PYTHONPATH}
[ -d "$STAGE/nixlsite" ] && export PYTHONPATH=$PYTHONPATH:$STAGE/nixlsite
export HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
ulimit -n 65536 2> /dev/null || ulimit -n 16384 2> /dev/null
log "python $PY; $(nproc) cores; ulimit -n $(ulimit -n); run ends by $(date -u -d @$END +%H:%M:%S)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
lscpu 2> /dev/null | grep -E "Model name|^CPU\(s\)" | tr -s ' '

if [ -n "${SERVER_CMD:-}" ]; then  # a stand-in server, for trying the script out without a GPU
  $SERVER_CMD > "$LOGS/aggregated.log" 2>&1 &
else
  $PY -m vllm.entrypoints.cli.main serve "$STAGE/model" --served-model-name qwen-vl --load-format dummy \
    --limit-mm-per-prompt '{"image":4,"video":0}' > "$LOGS/aggregated.log" 2>&1 &
fi
A_PID=$!
log "server started (pid $A_PID); building the bodies meanwhile"
MM_LOADGEN_MODEL=qwen-vl $PY "$HERE/mm_loadgen.py" --base http://127.0.0.1:8000 --phases "$PHASES" --skip-batch1 \
  --prebuild "$JOBS" --wait-health $((RUN_SECONDS - 60)) --warm 2 --scrape-start --phases-log "$OUT/phases_pre.jsonl" \
  --drain "$DRAIN" --deadline $((END - 30)) --out "$OUT" --tag pre &
LG_PID=$!

hok() { $PY -S -c 'import sys, urllib.request as u; sys.exit(0 if u.urlopen(sys.argv[1], timeout=2).status == 200 else 1)' \
  "$1" 2> /dev/null; }
healthy=0
while [ "$(date +%s)" -lt $((END - 50)) ]; do
  if hok http://127.0.0.1:8000/health; then healthy=1; break; fi
  kill -0 $A_PID 2> /dev/null || break
  sleep 1
done
if [ $healthy = 1 ]; then
  log "server healthy after $(($(date +%s) - T0))s"
  $PY "$HERE/preproc_sampler.py" --base http://127.0.0.1:8000 --pid $A_PID --every 2 --out "$OUT/samples_2s.txt" &
  S_PID=$!
  while kill -0 $LG_PID 2> /dev/null && [ "$(date +%s)" -lt $((END - 20)) ]; do sleep 1; done
  kill $LG_PID 2> /dev/null
  wait $LG_PID 2> /dev/null
  log "load done"
  { echo "### SCRAPE final $(date +%s.%N)"; $PY -S -c 'import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=10).read().decode())' http://127.0.0.1:8000/metrics; } > "$OUT/metrics_final_pre.txt" 2>&1
  kill $S_PID 2> /dev/null
else
  log "server NOT healthy; its log's tail:"
  grep -v "it/s]" "$LOGS/aggregated.log" | tail -40
  kill $LG_PID 2> /dev/null
fi
kill $A_PID 2> /dev/null
for _ in 1 2 3 4 5 6; do kill -0 $A_PID 2> /dev/null || break; sleep 1; done
kill -9 $A_PID 2> /dev/null
pkill -9 -P $A_PID 2> /dev/null
# The server's log without the per-request access lines (counted), under 200 KB.
L="$LOGS/aggregated.log"
{
  echo "# $(wc -l < "$L") lines; $(grep -c 'POST /v1/chat/completions' "$L") access-log lines for /v1/chat/completions" \
    "and $(grep -c 'GET /metrics' "$L") for /metrics left out; $(grep -c ' WARNING ' "$L") WARNING, $(grep -c ' ERROR ' "$L") ERROR"
  grep -v 'POST /v1/chat/completions\|GET /metrics\|GET /health\|it/s\]' "$L" > "$LOGS/trim.log"
  if [ "$(stat -c %s "$LOGS/trim.log")" -gt 190000 ]; then
    head -c 120000 "$LOGS/trim.log"; echo; echo "# ... (cut) ..."; tail -c 60000 "$LOGS/trim.log"
  else cat "$LOGS/trim.log"; fi
} > "$OUT/server_aggregated.log"
[ -f "$OUT/phases_pre.jsonl" ] && $PY "$HERE/preproc_table.py" --dir "$OUT" --tag pre | tee "$OUT/table.md"
log "done"; ls -la "$OUT"
