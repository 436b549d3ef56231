#!/usr/bin/env bash
# The encode tier (issue 27) measured on one GPU host: an encode-only vLLM 0.33.0 instance and a prefill/decode one
# sharing the GPU, each started with the command line and env mmfleet renders for examples/qwen-vl-encode-tier.yaml
# (results_epd/rendered.json, made by epd_argv.py render; epd_argv.py shell applies the deviations that one host
# forces and lists them), mmfleet's sidecar operator/mmfleet/encode_proxy.py in front of the prefill/decode server as
# the pod runs it, then the calibration's open-loop load (mm_loadgen.py) through the sidecar. Mode "agg" runs the
# calibration's aggregated server (real-vllm-h200-mm: vLLM's defaults, --limit-mm-per-prompt) under the same load.
#
# Usage (on the GPU host, the carried vLLM tree unpacked under $STAGE): epd_run.sh epd|agg
# Env: STAGE (default /root/stage: site/, depsite/, nixlsite/, model/), OUT (results), DEADLINE_EPOCH (the load is cut
# to end before it), PY (the host's python3), PHASES (mm_loadgen's --phases).
set -u
MODE=${1:-epd}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
STAGE=${STAGE:-/root/stage}
OUT=${OUT:-/tmp/epd_out}
PY=${PY:-$(command -v python3)}
DEADLINE_EPOCH=${DEADLINE_EPOCH:-$(($(date +%s) + 560))}
PHASES=${PHASES:-2:60,5:45,10:45,20:45,5:45:1280x720}
LOGS=$STAGE/logs_$MODE
rm -rf "$LOGS"
mkdir -p "$LOGS" "$OUT" /cache
export PYTHONPATH=$STAGE/site:$STAGE/depsite:$STAGE/nixlsite
export HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
# UCX's CUDA transport (NIXL) loads libcudart.so.13, which the host has inside its Python environment only.
CUDART=$(find "$($PY -c 'import sys; print(sys.prefix)')" -name 'libcudart.so.13*' 2>/dev/null | head -1)
[ -n "$CUDART" ] && export LD_LIBRARY_PATH=$(dirname "$CUDART")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# vLLM's own log format, with the EC connector's scheduler at DEBUG (its transfers: "EC consumer: starting NIXL xfer",
# "NIXL xfer complete", "EC producer: announcing NIXL-readable encodings").
cat > "$STAGE/logging.json" << 'EOF'
{"version": 1, "disable_existing_loggers": false,
 "formatters": {"vllm": {"()": "vllm.logging_utils.NewLineFormatter", "datefmt": "%m-%d %H:%M:%S",
   "format": "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"}},
 "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "level": "DEBUG", "stream": "ext://sys.stdout"}},
 "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": false},
   "vllm.distributed.ec_transfer.ec_connector.cpu.scheduler": {"level": "DEBUG"}}}
EOF
# GET URL [SECONDS]: the body on stdout, status 0 for a 200 (urllib, so the host needs no curl).
hget() {
  $PY -S -c 'import sys, urllib.request as u
try:
    r = u.urlopen(sys.argv[1], timeout=float(sys.argv[2]))
    sys.stdout.write(r.read().decode("utf-8", "replace"))
    sys.exit(0 if r.status == 200 else 1)
except Exception as e:
    sys.exit(1)' "$1" "${2:-5}"
}
log() { echo "[epd_run $(date -u +%H:%M:%S) +$(($(date +%s) - DEADLINE_EPOCH))s] $*"; }
left() { echo $((DEADLINE_EPOCH - $(date +%s))); }

# wait_health URL PID NAME SECONDS: 0 healthy, 1 the process died, 2 timed out
wait_health() {
  local url=$1 pid=$2 name=$3 until=$(($(date +%s) + $4))
  while [ "$(date +%s)" -lt "$until" ]; do
    if hget "$url/health" 2 > /dev/null; then log "$name healthy"; return 0; fi
    if ! kill -0 "$pid" 2> /dev/null; then log "$name DIED"; return 1; fi
    sleep 2
  done
  log "$name not healthy in time"
  return 2
}
stop() {  # stop PID...: SIGTERM, then SIGKILL after 15 s
  local p
  for p in "$@"; do [ -n "$p" ] && kill "$p" 2> /dev/null; done
  for _ in $(seq 15); do
    local alive=0
    for p in "$@"; do [ -n "$p" ] && kill -0 "$p" 2> /dev/null && alive=1; done
    [ $alive = 0 ] && return
    sleep 1
  done
  for p in "$@"; do [ -n "$p" ] && kill -9 "$p" 2> /dev/null; done
}
scrape() { echo "### SCRAPE $2 $(date +%s.%N)"; hget "$1/metrics" 10; }
fail_tail() { log "last lines of $1:"; grep -v "it/s]" "$1" | tail -40; }

run_load() {  # run_load BASE TAG
  log "load through $1 ($PHASES), deadline in $(left)s"
  MM_LOADGEN_MODEL=qwen-vl $PY "$HERE/mm_loadgen.py" --base "$1" --phases "$PHASES" --skip-batch1 \
    --deadline $((DEADLINE_EPOCH - 45)) --out "$OUT" --tag "$2"
  log "load done (rc $?)"
}

summary() {  # summary CSV: per phase n, errors, TTFT and e2e p50/p90 (from the client's clock, as the calibration)
  $PY - "$1" << 'EOF'
import csv, sys
import numpy as np
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["part"] == "load"]
for phase in sorted({int(r["phase"]) for r in rows}):
    rs = [r for r in rows if int(r["phase"]) == phase]
    ok = [r for r in rs if not r["err"]]
    ttft = np.array([float(r["t_first"]) - float(r["t_send"]) for r in ok]) * 1e3
    e2e = np.array([float(r["t_end"]) - float(r["t_send"]) for r in ok])
    errs = sorted({r["err"][:60] for r in rs if r["err"]})
    print(f"phase {phase} rate {rs[0]['rate']} {rs[0]['img_w']}x{rs[0]['img_h']}: n {len(rs)} ok {len(ok)} "
          f"ttft p50 {np.percentile(ttft, 50):.0f} p90 {np.percentile(ttft, 90):.0f} ms, "
          f"e2e p50 {np.percentile(e2e, 50):.3f} p90 {np.percentile(e2e, 90):.3f} s, "
          f"prompt tokens {sorted({r['prompt_tokens'] for r in ok})[:3]} errors {errs[:3]}" if ok else
          f"phase {phase}: n {len(rs)} ok 0 errors {errs[:3]}")
EOF
}

probe_requests() {  # probe_requests BASE N: N sequential fresh 448x448 JPEG requests (stream), each's TTFT and e2e
  MM_LOADGEN_MODEL=qwen-vl $PY - "$1" "$2" "$HERE" << 'EOF'
import asyncio, json, sys, time
import aiohttp, numpy as np
sys.path.insert(0, sys.argv[3])
import mm_loadgen as lg
async def main(base, n):
    rng = np.random.default_rng(7)
    async with aiohttp.ClientSession() as s:
        for i in range(n):
            body = json.dumps(lg.body_for([(lg.make_image(rng, 448, 448, "jpeg"), "jpeg")], lg.make_text(rng, 190), 150))
            rec = lg.new_rec(part="probe", idx=i)
            t = time.perf_counter()
            await lg.one(s, base + "/v1/chat/completions", body.encode(), t, rec)
            print(f"probe {i}: ttft {rec['t_first']} e2e {rec['t_end']} prompt {rec['prompt_tokens']} "
                  f"out {rec['completion_tokens']} err {rec['err'][:300]}", flush=True)
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
EOF
}

encode_direct() {  # what the encode instance answers the sidecar's request (one image), as the sidecar asks it
  $PY - "$1" "$HERE" << 'EOF'
import json, sys, time, urllib.request
import numpy as np
sys.path.insert(0, sys.argv[2])
import mm_loadgen as lg
body = lg.body_for([(lg.make_image(np.random.default_rng(11), 448, 448, "jpeg"), "jpeg")], "x", 1)
items = [p for p in body["messages"][0]["content"] if p["type"] == "image_url"]
req = {"model": "qwen-vl", "messages": [{"role": "user", "content": items}], "stream": False, "max_tokens": 1}
t = time.perf_counter()
try:
    r = urllib.request.urlopen(urllib.request.Request(sys.argv[1] + "/v1/chat/completions", json.dumps(req).encode(),
                                                      {"Content-Type": "application/json"}), timeout=60)
    answer = json.loads(r.read())
    print(f"encode direct: {r.status} in {(time.perf_counter() - t) * 1e3:.0f} ms; ec_transfer_params "
          f"{json.dumps(answer.get('ec_transfer_params'))[:600]}; usage {answer.get('usage')}; "
          f"choices {json.dumps(answer.get('choices'))[:200]}")
except Exception as e:
    print("encode direct failed:", type(e).__name__, str(getattr(e, "read", lambda: b"")()[:500] or e))
EOF
}

finish() {  # logs and expositions into $OUT
  for f in "$LOGS"/*.log; do
    n=$(wc -l < "$f")
    log "$(basename "$f"): $n lines, $(grep -c ' WARNING ' "$f") WARNING, $(grep -c ' ERROR ' "$f") ERROR"
  done
  for pat in "EC producer: announcing" "EC consumer: starting NIXL xfer" "NIXL xfer complete" "using local input" \
    "NIXL xfer failed" "retryable" "encode tier" "Traceback"; do
    log "log lines with '$pat': $(cat "$LOGS"/*.log | grep -c "$pat")"
  done
  tar -czf "$OUT/logs_$MODE.tar.gz" -C "$LOGS" .
  ls -la "$OUT"
}

log "mode $MODE; python $PY; stage $STAGE; LD_LIBRARY_PATH ${LD_LIBRARY_PATH:-}; $(left)s left"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
df -h /dev/shm | tail -1

if [ "$MODE" = agg ]; then
  $PY -m vllm.entrypoints.cli.main serve "$STAGE/model" --served-model-name qwen-vl --load-format dummy \
    --limit-mm-per-prompt '{"image":4,"video":0}' > "$LOGS/aggregated.log" 2>&1 &
  A_PID=$!
  if wait_health http://127.0.0.1:8000 $A_PID aggregated $(($(left) - 60)); then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    probe_requests http://127.0.0.1:8000 3
    run_load http://127.0.0.1:8000 agg
    scrape http://127.0.0.1:8000 final > "$OUT/metrics_final_agg.txt"
    summary "$OUT/requests_agg.csv"
  else
    fail_tail "$LOGS/aggregated.log"
  fi
  stop $A_PID
  finish
  exit 0
fi

eval "$($PY "$HERE/epd_argv.py" shell --rendered "$HERE/results_epd/rendered.json" --model "$STAGE/model" \
  --python "$PY" --proxy "$REPO/operator/mmfleet/encode_proxy.py")"
echo "encode:  $(printf '%q ' "${E_ENV[@]}" "${E_CMD[@]}")"
echo "server:  $(printf '%q ' "${PD_ENV[@]}" "${PD_CMD[@]}")"
echo "sidecar: $(printf '%q ' "${PROXY_ENV[@]}" "${PROXY_CMD[@]}")"
start_e() { env "${E_ENV[@]}" VLLM_LOGGING_CONFIG_PATH="$STAGE/logging.json" "${E_CMD[@]}" >> "$LOGS/encode.log" 2>&1 & E_PID=$!; }
start_pd() { env "${PD_ENV[@]}" VLLM_LOGGING_CONFIG_PATH="$STAGE/logging.json" "${PD_CMD[@]}" >> "$LOGS/server.log" 2>&1 & PD_PID=$!; }
# Both at once (a pod each, in production); one that fails is started again alone, once, while the other runs.
start_e
start_pd
log "started encode (pid $E_PID) and prefill/decode (pid $PD_PID)"
wait_health http://127.0.0.1:8100 $E_PID encode 330 & WE=$!
wait_health http://127.0.0.1:8001 $PD_PID prefill/decode 330 & WPD=$!
wait $WE; E_OK=$?
wait $WPD; PD_OK=$?
if [ $E_OK != 0 ] && [ "$(left)" -gt 300 ]; then
  fail_tail "$LOGS/encode.log"; stop $E_PID; echo "=== RESTART (alone) ===" >> "$LOGS/encode.log"
  start_e; wait_health http://127.0.0.1:8100 $E_PID encode 200; E_OK=$?
fi
if [ $PD_OK != 0 ] && [ "$(left)" -gt 300 ]; then
  fail_tail "$LOGS/server.log"; stop $PD_PID; echo "=== RESTART (alone) ===" >> "$LOGS/server.log"
  start_pd; wait_health http://127.0.0.1:8001 $PD_PID prefill/decode 200; PD_OK=$?
fi
[ $E_OK != 0 ] && fail_tail "$LOGS/encode.log"
[ $PD_OK != 0 ] && fail_tail "$LOGS/server.log"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
grep -h "KV cache size\|Available KV cache\|Model loading took\|Encoder cache will\|EC mmap\|NIXL\|encoder-only\|init engine" \
  "$LOGS/encode.log" "$LOGS/server.log" | cut -c1-300 | head -30

if [ $E_OK = 0 ]; then
  scrape http://127.0.0.1:8100 startup > "$LOGS/metrics_encode_scrapes.txt"
  encode_direct http://127.0.0.1:8100
fi
if [ $PD_OK = 0 ]; then
  env "${PROXY_ENV[@]}" "${PROXY_CMD[@]}" > "$LOGS/proxy.log" 2>&1 &
  PROXY_PID=$!
  for _ in $(seq 20); do hget http://127.0.0.1:8000/health 2 > /dev/null && break; sleep 0.5; done
  log "sidecar answers /health: $(hget http://127.0.0.1:8000/health 2 > /dev/null && echo yes || echo NO)"
  probe_requests http://127.0.0.1:8000 4
  grep -h "EC consumer\|EC producer\|encode tier" "$LOGS"/*.log | cut -c1-400 | head -12
  TAG=epd
  [ $E_OK != 0 ] && TAG=epd_no_encoder  # the sidecar falls back to the server's own encoder: measured all the same
  (while sleep 20; do scrape http://127.0.0.1:8100 periodic; done) >> "$LOGS/metrics_encode_scrapes.txt" 2>&1 &
  SCRAPER=$!
  run_load http://127.0.0.1:8000 $TAG
  kill $SCRAPER 2> /dev/null
  {
    scrape http://127.0.0.1:8000 "final-sidecar(server+front-door)"
    scrape http://127.0.0.1:8001 final-server
    scrape http://127.0.0.1:8100 final-encode
  } > "$OUT/metrics_final_epd.txt"
  summary "$OUT/requests_$TAG.csv"
  stop $PROXY_PID
elif [ $E_OK = 0 ]; then
  log "prefill/decode server down: timing the encode instance alone"
  for i in 1 2 3 4 5 6 7 8; do encode_direct http://127.0.0.1:8100; done
  scrape http://127.0.0.1:8100 final-encode > "$OUT/metrics_final_epd.txt"
fi
stop ${PD_PID:-} ${E_PID:-}
finish
