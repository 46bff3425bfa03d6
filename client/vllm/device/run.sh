#!/bin/bash
# Issue 28's GPU run, on the device machine from the repository root, after
# the staged parts came over (client/vllm/device/README.md):
#   bash client/vllm/device/run.sh PHASE     PHASE: install | tiny | prefix | bench | all
#   install  check and unpack the parts (/tmp/sc_vllm/parts) into /tmp/sc_vllm,
#            pip-install the dependency wheels there (--no-index --no-deps),
#            check that vllm 0.26.0, statecache and the plugin's entry point import
#   tiny     install, then the tiny Qwen3-Next (stock fp32 states, plugin fp32,
#            plugin damp:16, plugin fp32 with prefill "runtime" on pages):
#            greedy tokens compared
# STORAGE=pages (default) | server picks the plugin's storage, PREFILL=statecache
# (default) | runtime its prefill path.
#   prefix   install, then prefix caching (align mode) on the tiny model: stock fp32
#            and plugin fp32 on pages, each pass with cached prefixes vs the first
#   bench    install, then Qwen3.6-35B-A3B geometry: TPOT at B = 1..256 and KV
#            sizing, plugin damp:16 then stock fp32 (bench_plugin / bench_stock:
#            one of the two; the comparison uses whatever runs are there)
#   all      tiny then bench
# Every engine runs in its own process with a time limit; the whole phase
# stops starting engines once DEADLINE_S (default 560) has passed since the
# start and says which ones it skipped. Output ($OUT, or /tmp/sc_out):
# progress.log (a line per step with elapsed seconds), summary.txt, results.json
# (every engine's RESULT), engines.log (each engine's output tail).
set -o pipefail
START=$(date +%s)
OUT=${OUT:-/tmp/sc_out}
mkdir -p "$OUT"
PHASE=${1:-all}
DEADLINE_S=${DEADLINE_S:-560}
ROOT=/tmp/sc_vllm
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/progress.log"; }
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
left() { echo $(( DEADLINE_S - ($(date +%s) - START) )); }

install() {
  if [ -f "$ROOT/INSTALLED" ]; then log "install: already done ($(cat "$ROOT/INSTALLED"))"; return 0; fi
  local parts=$ROOT/parts
  [ -f "$parts/SHA256SUMS" ] || { summary "install: FAIL no $parts/SHA256SUMS (receive the parts first)"; return 1; }
  (cd "$parts" && sha256sum -c --quiet SHA256SUMS) || { summary "install: FAIL part checksums"; return 1; }
  log "install: parts ok ($(ls "$parts" | grep -c '^part\.') parts, $(du -sb "$parts" | cut -f1) bytes)"
  rm -rf "$ROOT/stage" && mkdir -p "$ROOT/stage"
  cat "$parts"/part.* | xz -d -T0 | tar -C "$ROOT/stage" -xf - || { summary "install: FAIL unpack"; return 1; }
  rm -rf "$ROOT/site" "$ROOT/sc" && mv "$ROOT/stage/site" "$ROOT/site" && mv "$ROOT/stage/sc" "$ROOT/sc"
  log "install: unpacked $(du -sb "$ROOT/site" | cut -f1) bytes of site-packages"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$ROOT/site" "$ROOT"/stage/wheels/*.whl > "$OUT/pip.log" 2>&1 \
    || { summary "install: FAIL pip (pip.log)"; tail -20 "$OUT/pip.log"; return 1; }
  cat "$ROOT/stage/STAGED" > "$OUT/staged.txt"
  date -u > "$ROOT/INSTALLED"
  log "install: wheels installed ($(ls "$ROOT"/stage/wheels/*.whl | wc -l))"
}

env_setup() {
  export PYTHONPATH=$ROOT/site${PYTHONPATH:+:$PYTHONPATH}
  export LD_LIBRARY_PATH=$ROOT/sc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export STATECACHE_DATAPLANE_LIB=$ROOT/sc/lib/libstatecache_dataplane.so
  export PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1
  export TOKENIZERS_PARALLELISM=false
  export VLLM_USE_FLASHINFER_SAMPLER=0   # FlashInfer is not in the bundle
  # The engine core in this process: apply_model redraws weights with a
  # function (no pickling across processes).
  export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_ALLOW_INSECURE_SERIALIZATION=1
}

import_check() {
  python3 - <<'EOF' 2>&1 | tee -a "$OUT/progress.log"
import importlib.metadata as md, torch, vllm, statecache, statecache.torch, statecache_vllm
eps = [e.value for e in md.entry_points(group="vllm.general_plugins")]
print("IMPORT vllm", vllm.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      "plugins", eps)
assert vllm.__version__.startswith("0.26.0") and "statecache_vllm:register" in eps
from vllm.vllm_flash_attn.flash_attn_interface import FA3_AVAILABLE, FA2_AVAILABLE
print("IMPORT fa3", FA3_AVAILABLE, "fa2", FA2_AVAILABLE, "(fa2 pruned)")
EOF
}

# one engine: name, timeout, engines.py args...
ENGINE_RC=0
engine() {
  local name=$1 limit=$2; shift 2
  local budget; budget=$(left)
  if [ "$budget" -lt 60 ]; then summary "$name: SKIPPED (${budget}s left of DEADLINE_S=$DEADLINE_S)"; ENGINE_RC=2; return 2; fi
  [ "$limit" -gt "$budget" ] && limit=$budget
  log "$name: start (limit ${limit}s): $*"
  timeout -k 10 "$limit" python3 "$HERE/engines.py" "$@" --out "$ROOT/$name.json" > "$ROOT/$name.log" 2>&1
  ENGINE_RC=$?
  { echo "===== $name (exit $ENGINE_RC)"; grep -E "Maximum concurrency|GPU KV cache size|block size|statecache:|Padding mamba|cudagraph|ERROR|Error|Traceback" "$ROOT/$name.log" | head -40; tail -30 "$ROOT/$name.log"; } >> "$OUT/engines.log"
  if [ $ENGINE_RC -eq 0 ]; then
    grep '^RESULT ' "$ROOT/$name.log" | sed "s/^RESULT /{\"engine\": \"$name\", \"result\": /; s/\$/}/" >> "$OUT/results.json"
    log "$name: ok ($(grep -m1 -o 'Maximum concurrency for [0-9]* tokens per request: [0-9.]*x' "$ROOT/$name.log"))"
  else
    summary "$name: FAIL exit $ENGINE_RC ($(grep -E 'Error|error' "$ROOT/$name.log" | tail -1 | cut -c1-300))"
  fi
  return $ENGINE_RC
}

tiny() {
  engine tiny_stock_fp32 240 tiny --mode stock
  engine tiny_plugin_fp32 200 tiny --mode plugin --format fp32 --check_every 1 \
    --storage "${STORAGE:-pages}" --prefill "${PREFILL:-statecache}"
  engine tiny_plugin_damp16 200 tiny --mode plugin --format damp:16 --check_every 1 \
    --storage "${STORAGE:-pages}" --prefill "${PREFILL:-statecache}"
  # fp32 with vLLM's own chunk kernel for prefill (pages storage only)
  [ "${STORAGE:-pages}" = pages ] && engine tiny_plugin_fp32_runtime 200 tiny --mode plugin \
    --format fp32 --check_every 1 --storage pages --prefill runtime
  python3 - "$ROOT" <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, os, sys
root = sys.argv[1]
def load(n):
    p = os.path.join(root, n + ".json")
    return json.load(open(p))["tokens"] if os.path.exists(p) else None
ref = load("tiny_stock_fp32")
for name in ("tiny_plugin_fp32", "tiny_plugin_damp16", "tiny_plugin_fp32_runtime"):
    got = load(name)
    if ref is None or got is None:
        print(f"TINY {name}: not compared (missing run)"); continue
    same = sum(a == b for a, b in zip(ref, got))
    tok = sum(x == y for a, b in zip(ref, got) for x, y in zip(a, b))
    first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(ref, got)]
    n = sum(len(a) for a in ref)
    verdict = ("PASS" if same == len(ref) else "FAIL") if "fp32" in name else "INFO"
    print(f"TINY {verdict} {name} vs stock fp32: identical sequences {same}/{len(ref)}, "
          f"tokens agreeing {tok}/{n} ({100 * tok / n:.2f}%), mean first divergence at "
          f"{sum(first) / len(first):.1f} of {len(ref[0])}")
EOF
}

prefix() {  # prefix caching (align mode): stock fp32 vs plugin fp32 on pages
  engine prefix_stock_fp32 240 prefix --mode stock
  engine prefix_plugin_fp32 200 prefix --mode plugin --format fp32 --check_every 1 --storage pages
  python3 - "$ROOT" <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, os, sys
root = sys.argv[1]
def load(n):
    p = os.path.join(root, n + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
runs = {n: load(n) for n in ("prefix_stock_fp32", "prefix_plugin_fp32")}
for n, r in runs.items():
    if r is None:
        print(f"PREFIX {n}: not run"); continue
    same = sum(a == b for a, b in zip(r["first_pass"], r["tokens"]))
    print(f"PREFIX {'PASS' if same == len(r['tokens']) else 'FAIL'} {n}: cached pass equals the "
          f"first pass on {same}/{len(r['tokens'])} prompts")
s, p = runs["prefix_stock_fp32"], runs["prefix_plugin_fp32"]
if s and p:
    tok = sum(x == y for a, b in zip(s["tokens"], p["tokens"]) for x, y in zip(a, b))
    n = sum(len(a) for a in s["tokens"])
    print(f"PREFIX INFO plugin vs stock (cached pass): tokens agreeing {tok}/{n}")
EOF
}

bench_plugin() {
  engine bench_plugin_damp16 540 bench --mode plugin --format damp:16 \
    --storage "${STORAGE:-pages}" --prefill "${PREFILL:-statecache}" \
    --cudagraph "${BENCH_CUDAGRAPH:-full-decode}" ${BENCH_ARGS:-}
}
bench_stock() {
  engine bench_stock_fp32 540 bench --mode stock --cudagraph "${BENCH_CUDAGRAPH:-full-decode}" \
    ${BENCH_ARGS:-}
}
bench_compare() {
  python3 - "$ROOT" <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, os, re, sys
root = sys.argv[1]
def load(n):
    p = os.path.join(root, n + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
def conc(n):
    p = os.path.join(root, n + ".log")
    m = re.findall(r"Maximum concurrency for \d+ tokens per request: ([0-9.]+)x", open(p).read()) if os.path.exists(p) else []
    return float(m[-1]) if m else None
s, p = load("bench_stock_fp32"), load("bench_plugin_damp16")
for b in (s or p or {"tpot_ms": {}})["tpot_ms"]:
    ts = s["tpot_ms"].get(b) if s else None
    tp = p["tpot_ms"].get(b) if p else None
    d = f"{100 * (ts - tp) / ts:+.1f}% lower" if ts and tp else "n/a"
    print(f"BENCH TPOT B={b}: stock fp32 {ts} ms, plugin damp:16 {tp} ms ({d})")
cs, cp = conc("bench_stock_fp32"), conc("bench_plugin_damp16")
print(f"BENCH concurrency (320-token requests, same kv_cache_memory_bytes): stock {cs}x, "
      f"plugin {cp}x, ratio {cp / cs:.2f}" if cs and cp else f"BENCH concurrency: stock {cs} plugin {cp}")
pool = None
lp = os.path.join(root, "bench_plugin_damp16.log")
if os.path.exists(lp):
    m = re.findall(r"statecache: model \S+, format \S+, .*?, ([0-9.]+) MiB pool", open(lp).read())
    pool = float(m[-1]) * 2**20 if m else None
if p and p.get("storage") == "pages":
    print("BENCH storage pages: the states are vLLM's own pages (no pool beside them)")
elif pool and cs and cp and p:
    kv = p["kv_cache_memory_bytes"]
    print(f"BENCH statecache pool {pool / 2**30:.2f} GiB beside vLLM's {kv / 2**30:.0f} GiB "
          f"(the duplicate stand-in, README): at equal total state memory the plugin holds "
          f"{cp / (1 + pool / kv) / cs:.2f}x the sequences")
for name, r in (("stock", s), ("plugin", p)):
    if r:
        print(f"BENCH kv {name}: blocks {r['num_gpu_blocks']} block_size {r['block_size']} "
              f"mamba_page {r['mamba_page_size_padded']} wall {r['wall_s']} s")
EOF
}

# The Python sources of statecache and the plugin come from this checkout
# (it travels with every call), so a fix to them needs no re-staged part.
# A carried .device/vllm_sc/sc.tar.xz (stage_sc.sh) replaces the staged
# statecached and libstatecache_dataplane.so.
overlay_sources() {
  local repo; repo="$(cd "$HERE/../../.." && pwd)"
  cp "$repo"/client/python/statecache/*.py "$ROOT/site/statecache/" &&
    cp "$repo"/client/vllm/statecache_vllm/*.py "$ROOT/site/statecache_vllm/" &&
    log "overlay: statecache and statecache_vllm sources of $(git -C "$repo" log -1 --format=%h 2>/dev/null || echo 'the checkout')" || return 1
  if [ -f "$repo/.device/vllm_sc/sc.tar.xz" ]; then
    tar -C "$ROOT" -xJf "$repo/.device/vllm_sc/sc.tar.xz" &&
      log "overlay: native statecache of $(cut -c1-12 "$ROOT/sc/STAGED_SC")"
  fi
}

env_setup
log "phase $PHASE, DEADLINE_S=$DEADLINE_S, OUT=$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee -a "$OUT/progress.log"
install || exit 1
overlay_sources || { summary "overlay: FAIL"; exit 1; }
import_check || { summary "import: FAIL"; exit 1; }
case "$PHASE" in
  install) ;;
  tiny) tiny ;;
  prefix) prefix ;;
  bench) bench_plugin; bench_stock; bench_compare ;;
  bench_plugin) bench_plugin; bench_compare ;;
  bench_stock) bench_stock; bench_compare ;;
  all) tiny; bench_plugin; bench_stock; bench_compare ;;
  *) echo "unknown phase $PHASE"; exit 2 ;;
esac
log "done"
cat "$OUT/summary.txt" 2>/dev/null
