"""Static checks of deploy/ against the server's code (run by deploy_config_test.sh).

1. Every statecache_* metric queried by the Grafana dashboard and the alert
   rules is exported by server/metrics.cc (histograms: with _bucket / _sum /
   _count), and the dashboard JSON is what make_dashboard.py writes.
2. Every flag in the Kubernetes ConfigMap and the systemd flag file is an
   ABSL_FLAG of server/statecached_main.cc.
3. Kubernetes manifests: the Deployment requests and limits nvidia.com/gpu,
   has CPU/memory limits and gRPC health probes on the gRPC port; every file
   or directory flag of the ConfigMap lies on a mounted volume; a plaintext
   non-loopback listener carries --allow_insecure_remote (as the server
   demands); the headless Service has clusterIP None; Services and the
   NetworkPolicy select the Deployment's pods; tenants.example parses.
4. With a statecached binary: the server really starts from each flag file
   (ports, backend and paths overridden for the test) and stops cleanly.

    python3 deploy/check_deploy.py <repo root> [statecached]   # exit 1 + problems
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import yaml

problems = []


def check(cond, msg):
    if not cond:
        problems.append(msg)


def flag_lines(text):
    return [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]


def starts(binary, flagfile_text, overrides):
    """True when statecached starts from these flags (plus overrides) and
    exits 0 on SIGTERM; otherwise records the log as a problem."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        ff = os.path.join(tmp, "flags")
        with open(ff, "w") as f:
            f.write(flagfile_text)
        args = [binary, f"--flagfile={ff}", "--listen=127.0.0.1:0", "--metrics_port=0",
                "--metrics_host=127.0.0.1", "--backend=cpu", f"--data_dir={tmp}",
                f"--state_memory_bytes={8 << 20}", f"--checkpoint_memory_bytes={4 << 20}",
                *[o.replace("$TMP", tmp) for o in overrides]]
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        log = []
        deadline = time.time() + 30
        for line in p.stderr:
            log.append(line)
            if "server_started" in line or time.time() > deadline:
                break
        ok = any("server_started" in l for l in log)
        p.send_signal(signal.SIGTERM)
        try:
            rest, _ = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            rest, _ = p.communicate()
        log.append(rest or "")
        check(ok and p.returncode == 0,
              f"statecached did not start/stop cleanly from {args}:\n{''.join(log)[-1500:]}")
        return ok


def main(root, binary=None):
    metrics_cc = open(os.path.join(root, "server", "metrics.cc")).read()
    main_cc = open(os.path.join(root, "server", "statecached_main.cc")).read()
    exported = set(re.findall(r'"(statecache_[a-z0-9_]+)"', metrics_cc))
    histograms = {n for n in exported if re.search(r'H\(\*registry_,\s*"' + n + '"', metrics_cc)}
    check(len(exported) >= 20, f"found only {len(exported)} metric names in metrics.cc")
    check("statecache_rpc_duration_seconds" in histograms, "histograms not recognised")

    def known(name):
        if name in exported:
            return name not in histograms  # a histogram is only queried by its series
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name[: -len(suffix)] in histograms:
                return True
        return False

    d = os.path.join(root, "deploy")
    dash_text = open(os.path.join(d, "grafana", "statecache_dashboard.json")).read()
    dash = json.loads(dash_text)
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    check(len(dash["panels"]) >= 10, "dashboard has fewer than 10 panels")
    regenerated = subprocess.run([sys.executable, os.path.join(d, "grafana", "make_dashboard.py")],
                                 capture_output=True, text=True, check=True).stdout
    check(json.loads(regenerated) == dash,
          "grafana/statecache_dashboard.json differs from make_dashboard.py's output")
    rules = yaml.safe_load(open(os.path.join(d, "prometheus", "statecache_rules.yml")))
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used = set()
    for e in exprs:
        used.update(re.findall(r"\b(statecache_[a-z0-9_]+)", e))
    check(len(used) >= 15, f"only {len(used)} metric names used")
    for name in sorted(used):
        check(known(name), f"metric {name} is not exported by server/metrics.cc")
    for want in ("statecache_state_bytes", "statecache_state_fp32_equivalent_bytes",
                 "statecache_slots_used", "statecache_slots_capacity",
                 "statecache_prefix_lookups_total", "statecache_checkpoint_evictions_total",
                 "statecache_rpc_duration_seconds_bucket"):
        check(want in used, f"dashboard/rules do not use {want}")

    flags = set(re.findall(r"ABSL_FLAG\(\s*[\w:]+\s*,\s*(\w+)\s*,", main_cc))
    check("listen" in flags and "metrics_port" in flags, "ABSL_FLAG names not recognised")
    docs = list(yaml.safe_load_all(open(os.path.join(d, "kubernetes", "configmap.yaml"))))
    flagfiles = {"kubernetes/configmap.yaml": docs[0]["data"]["statecached.flags"],
                 "systemd/statecached.flags": open(os.path.join(d, "systemd",
                                                                "statecached.flags")).read()}
    for where, text in flagfiles.items():
        lines = flag_lines(text)
        check(lines, f"{where}: no flags")
        for line in lines:
            m = re.fullmatch(r"--(\w+)=(.*)", line)
            check(m is not None and m.group(1) in flags, f"{where}: unknown flag line {line!r}")

    kinds = {}
    for f in ("deployment.yaml", "service.yaml", "configmap.yaml", "namespace.yaml",
              "networkpolicy.yaml"):
        for doc in yaml.safe_load_all(open(os.path.join(d, "kubernetes", f))):
            kinds.setdefault(doc["kind"], []).append(doc)
    dep = kinds["Deployment"][0]
    pod = dep["spec"]["template"]
    c = pod["spec"]["containers"][0]
    res = c["resources"]
    for part in ("requests", "limits"):
        check(str(res[part].get("nvidia.com/gpu")) == "1", f"Deployment {part} nvidia.com/gpu != 1")
    check("cpu" in res["limits"] and "memory" in res["limits"], "Deployment lacks cpu/memory limits")
    grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        check(c.get(probe, {}).get("grpc", {}).get("port") == grpc_port,
              f"{probe} is not a gRPC probe on port {grpc_port}")
    check(any(a.startswith("--flagfile=") for a in c["args"]), "container does not use --flagfile")
    cm_flags = dict(re.fullmatch(r"--(\w+)=(.*)", l).groups()
                    for l in flag_lines(flagfiles["kubernetes/configmap.yaml"]))
    mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
    for f in ("tenants_file", "data_dir", "tls_cert_file", "tls_key_file", "tls_client_ca_file"):
        if f in cm_flags:
            check(any(cm_flags[f].startswith(m.rstrip("/") + "/") or cm_flags[f] == m
                      for m in mounts), f"--{f}={cm_flags[f]} is on no mounted volume")
    listen = cm_flags.get("listen", "")
    loopback = listen.startswith(("127.", "localhost", "[::1]", "unix:"))
    if not loopback and "tls_cert_file" not in cm_flags:
        check(cm_flags.get("allow_insecure_remote") == "true",
              "plaintext non-loopback --listen without --allow_insecure_remote=true")
    check(any(a.startswith("--flagfile=/etc/statecache/") for a in c["args"]),
          "--flagfile is not under the ConfigMap mount")
    labels = pod["metadata"]["labels"]
    for np_ in kinds.get("NetworkPolicy", []):
        sel = np_["spec"]["podSelector"]["matchLabels"]
        check(all(labels.get(k) == v for k, v in sel.items()),
              "NetworkPolicy does not select the Deployment's pods")
        ports = {p["port"] for rule in np_["spec"]["ingress"] for p in rule["ports"]}
        check({grpc_port, 9464} <= ports, f"NetworkPolicy does not open {grpc_port} and 9464")
    check(len(kinds.get("NetworkPolicy", [])) == 1, "no NetworkPolicy")
    tenants_example = open(os.path.join(d, "kubernetes", "tenants.example")).read()
    declared = set()
    for line in flag_lines(tenants_example):
        parts = line.split()
        if parts[0] == "tenant":
            declared.add(parts[1])
        else:
            check(parts[0] == "token" and len(parts) == 3 and parts[1] in declared and
                  re.fullmatch(r"sha256:[0-9a-f]{64}", parts[2]) is not None,
                  f"tenants.example: bad line {line!r}")
    services = {s["metadata"]["name"]: s for s in kinds["Service"]}
    check(services.get("statecached-headless", {}).get("spec", {}).get("clusterIP") == "None",
          "headless Service missing or has a cluster IP")
    for name, s in services.items():
        sel = s["spec"]["selector"]
        check(all(labels.get(k) == v for k, v in sel.items()),
              f"Service {name} does not select the Deployment's pods")
    prom = yaml.safe_load(open(os.path.join(d, "prometheus", "prometheus.yml")))
    dns = [n for job in prom["scrape_configs"] for sd in job.get("dns_sd_configs", [])
           for n in sd["names"]]
    ns = dep["metadata"]["namespace"]
    check(f"statecached-headless.{ns}.svc.cluster.local" in dns,
          "prometheus.yml does not discover pods through the headless Service")

    if binary:
        starts(binary, flagfiles["systemd/statecached.flags"], [])
        with tempfile.NamedTemporaryFile("w", suffix=".tenants", delete=False,
                                         dir=os.environ.get("TEST_TMPDIR")) as t:
            t.write(tenants_example)
        starts(binary, flagfiles["kubernetes/configmap.yaml"], [f"--tenants_file={t.name}"])
        os.unlink(t.name)
    else:
        print("check_deploy: no statecached given; flag files not started")

    for p in problems:
        print("check_deploy: " + p)
    print(f"check_deploy: {len(used)} metric names, {len(flags)} flags, "
          f"{sum(len(v) for v in kinds.values())} manifests checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else
                  os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                  sys.argv[2] if len(sys.argv) > 2 else None))
