"""End to end: statecached -> a real Prometheus server -> HTTP API assertions.

Starts statecached (CPU backend, 127.0.0.1, ephemeral gRPC and metrics
ports), drives a known workload through the Python client (register, allocate,
20 updates, one rejected update, snapshot, lookups hit + miss, restore), then
starts Debian's `prometheus` on 127.0.0.1 scraping the metrics endpoint every
second with deploy/prometheus/statecache_rules.yml loaded, and polls
/api/v1/query until every expected series has its exact value (at most 90 s).
Exits 0 when all checks pass; prints each check's result.

    python3 tests/prometheus/prometheus_e2e.py <repo root> <statecached> <prometheus>
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

ROOT, STATECACHED, PROMETHEUS = sys.argv[1], sys.argv[2], sys.argv[3]
TMP = tempfile.mkdtemp(prefix="prom-e2e-", dir=os.environ.get("TEST_TMPDIR"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import statecache as sc  # noqa: E402
from statecache import _gen  # noqa: E402

_gen.generate(os.path.join(TMP, "stubs"), os.path.join(ROOT, "proto"))
sc.__path__.append(os.path.join(TMP, "stubs", "statecache"))

DEADLINE_S = 90
procs = []


def start_statecached():
    log = []
    started = threading.Event()
    ports = {}
    p = subprocess.Popen([STATECACHED, "--listen=127.0.0.1:0", "--metrics_port=0",
                          "--backend=cpu", f"--state_memory_bytes={32 << 20}",
                          f"--checkpoint_memory_bytes={8 << 20}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    procs.append(p)

    def read():
        for line in p.stderr:
            log.append(line)
            m = re.search(r"server_started .* port=(\d+) .* metrics_port=(\d+)", line)
            if m:
                ports["grpc"], ports["metrics"] = int(m.group(1)), int(m.group(2))
                started.set()
        started.set()

    threading.Thread(target=read, daemon=True).start()
    if not started.wait(30) or "grpc" not in ports:
        sys.exit("FAIL: statecached did not start:\n" + "".join(log))
    return p, ports, log


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prometheus(metrics_port):
    rules = os.path.join(ROOT, "deploy", "prometheus", "statecache_rules.yml")
    cfg = os.path.join(TMP, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["{rules}"]
scrape_configs:
  - job_name: statecached
    static_configs:
      - targets: ["127.0.0.1:{metrics_port}"]
""")
    for attempt in range(3):
        port = free_port()
        log = open(os.path.join(TMP, f"prometheus-{attempt}.log"), "w+")
        p = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}",
                              f"--storage.tsdb.path={os.path.join(TMP, f'tsdb{attempt}')}",
                              f"--web.listen-address=127.0.0.1:{port}",
                              "--log.level=warn",
                              "--storage.tsdb.retention.time=1h"],
                             stdout=log, stderr=subprocess.STDOUT)
        procs.append(p)
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            if p.poll() is not None:
                break
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return p, url
            except (urllib.error.URLError, ConnectionError, socket.timeout):
                time.sleep(0.2)
        p.kill()
        p.wait()
        log.seek(0)
        print(f"prometheus attempt {attempt} failed:\n{log.read()[-2000:]}")
    sys.exit("FAIL: prometheus did not become ready")


def query(url, expr):
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"query {expr}: {body}")
    return [(s["metric"], float(s["value"][1])) for s in body["data"]["result"]]


def workload(target):
    c = sc.Client(target, timeout=30)
    c.wait_ready(10)
    geom = sc.Geometry("gdn", layers=2, h_qk=2, h_v=4, d_k=128, d_v=128)
    info = c.register_model("e2e", geom, "damp", slots=8, checkpoints=4)
    slots = c.allocate_slots("e2e", 3)
    rng = np.random.default_rng(0)

    def unit(*shape):
        x = rng.standard_normal(shape).astype(np.float32)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    for step in range(10):
        for layer in range(2):
            c.update("e2e", layer, slots, unit(3, 2, 128), unit(3, 2, 128),
                     rng.standard_normal((3, 4, 128)).astype(np.float32),
                     np.full((3, 4), -0.1, np.float32), np.full((3, 4), 0.5, np.float32))
    try:
        c.update("e2e", 5, slots, unit(3, 2, 128), unit(3, 2, 128),
                 np.zeros((3, 4, 128), np.float32), np.zeros((3, 4), np.float32),
                 np.zeros((3, 4), np.float32))
        sys.exit("FAIL: an update of layer 5 was accepted")
    except sc.InvalidArgument:
        pass
    c.snapshot("e2e", slots[0], tokens=[1, 2, 3, 4])
    hit = c.lookup_prefix("e2e", tokens=[1, 2, 3, 4, 5, 6])
    miss = c.lookup_prefix("e2e", tokens=[9, 9])
    assert hit.hit and not miss.hit
    c.restore("e2e", slots[1], hit.key, hit.lease_id)
    return info


def main():
    server, ports, server_log = start_statecached()
    info = workload(f"127.0.0.1:{ports['grpc']}")
    prom, url = start_prometheus(ports["metrics"])
    slot, fp32 = info.slot_bytes, info.fp32_slot_bytes
    heads = 3 * 2 * 4  # allocated slots * layers * h_v
    M = 'model="e2e",format="damp:16"'
    exact = {
        'up{job="statecached"}': 1,
        f"statecache_slots_used{{{M}}}": 3,
        f"statecache_slots_capacity{{{M}}}": 8,
        f"sum(statecache_state_bytes{{{M}}})": 3 * slot,
        f'statecache_state_bytes{{{M},tier="hi_rows"}}': heads * info.head_bytes.hi_rows,
        f'statecache_state_bytes{{{M},tier="lo_codes"}}': heads * info.head_bytes.lo_codes,
        f'statecache_state_bytes{{{M},tier="metadata"}}': heads * info.head_bytes.metadata,
        f"statecache_state_capacity_bytes{{{M}}}": 8 * slot,
        f"statecache_state_fp32_equivalent_bytes{{{M}}}": 3 * fp32,
        f"statecache_checkpoints{{{M}}}": 1,
        f"statecache_checkpoint_capacity{{{M}}}": 4,
        f"sum(statecache_checkpoint_bytes{{{M}}})": slot,
        f'statecache_prefix_lookups_total{{{M},result="hit"}}': 1,
        f'statecache_prefix_lookups_total{{{M},result="miss"}}': 1,
        f'statecache_prefix_lookup_tokens_total{{{M},result="hit"}}': 4,
        f"statecache_snapshots_total{{{M}}}": 1,
        f"statecache_restores_total{{{M}}}": 1,
        f"statecache_snapshot_bytes_total{{{M}}}": slot,
        f"statecache_restore_bytes_total{{{M}}}": slot,
        f"statecache_checkpoint_evictions_total{{{M}}}": 0,
        'statecache_rpcs_total{method="Update",code="OK"}': 20,
        'statecache_rpcs_total{method="Update",code="INVALID_ARGUMENT"}': 1,
        'statecache_rpcs_total{method="RegisterModel",code="OK"}': 1,
        'statecache_rpc_duration_seconds_count{method="Update"}': 21,
        "statecache_update_batch_size_count": 20,
        "statecache_update_batch_size_sum": 60,
        # recording rules of deploy/prometheus/statecache_rules.yml on real data
        f"statecache:slot_utilization:ratio{{{M}}}": 3 / 8,
        f"statecache:state_compression_saving:ratio{{{M}}}": 1 - slot / fp32,
    }
    ranges = {
        # p50 of Update latency: a real duration, well under a second on CPU
        'histogram_quantile(0.5, sum by (le) (statecache_rpc_duration_seconds_bucket{method="Update"}))':
            (1e-6, 1.0),
        'histogram_quantile(0.5, sum by (le) (statecache_kernel_duration_seconds_bucket{op="decode_update"}))':
            (1e-7, 1.0),
    }
    pending = dict(exact)
    pending_ranges = dict(ranges)
    last = {}
    t0 = time.time()
    while (pending or pending_ranges) and time.time() - t0 < DEADLINE_S:
        for expr, want in list(pending.items()):
            r = query(url, expr)
            last[expr] = r
            if len(r) == 1 and abs(r[0][1] - want) <= 1e-9 * max(1.0, abs(want)):
                del pending[expr]
        for expr, (lo, hi) in list(pending_ranges.items()):
            r = query(url, expr)
            last[expr] = r
            if len(r) == 1 and lo <= r[0][1] <= hi:
                del pending_ranges[expr]
        if pending or pending_ranges:
            time.sleep(0.5)
    elapsed = time.time() - t0
    failed = list(pending) + list(pending_ranges)
    for expr in list(exact) + list(ranges):
        status = "FAIL" if expr in failed else "ok"
        want = exact.get(expr, ranges.get(expr))
        got = [v for _, v in last.get(expr, [])]
        print(f"{status:4} {expr} want {want} got {got}")
    # Alerts must be quiet on a healthy server.
    alerts = query(url, 'ALERTS{alertstate="firing"}')
    print(f"firing alerts: {alerts}")
    prom.send_signal(signal.SIGTERM)
    prom.wait(30)
    server.send_signal(signal.SIGTERM)
    rc = server.wait(30)
    if rc != 0:
        print("statecached exit code", rc, "".join(server_log))
        failed.append("statecached exit code")
    if alerts:
        failed.append("alerts firing")
    n = len(exact) + len(ranges)
    print(f"prometheus_e2e: series arrived in {elapsed:.1f}s")
    print(f"{n - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
