"""Static checks of the packaging in deploy/ (run by packaging_test.sh).

Docker cannot run here, so the image definition is checked against the
repository instead of built:
1. deploy/docker/statecached.Dockerfile: multi-stage (build -> runtime);
   every COPY source exists in the repository and is let through by the
   .dockerignore; COPY --from names an earlier stage, and the files it takes
   are the ones the build stage copies to /out; the bazel targets built
   exist; the runtime stage installs no compiler, -dev package, bazel or
   nvcc; its packages provide every shared library the built statecached
   loads (ldd + dpkg -S on this Debian 12 machine); USER is the uid of the
   Kubernetes securityContext.
2. Kustomize: the base (deploy/kubernetes) and the example overlay render
   with `kubectl kustomize`; in the overlay's Deployment the GPU request
   equals the limit, every container arg is an ABSL_FLAG of statecached,
   TLS files lie on mounted volumes and TLS switches the probes to TCP;
   the PodMonitor selects the pods on a declared port; the generated
   tenants Secret parses.
3. LICENSE is the Apache License 2.0 that pyproject.toml declares.

    python3 deploy/check_packaging.py <repo root> [statecached]   # exit 1 + problems
"""
import fnmatch
import os
import re
import shutil
import subprocess
import sys

import yaml

problems = []


def check(cond, msg):
    if not cond:
        problems.append(msg)


def dockerfile_instructions(text):
    """(instruction, arguments) with line continuations joined."""
    out, cur = [], ""
    for line in text.splitlines():
        s = line.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        if s.startswith("#"):
            continue
        cur += " " + s[:-1] if s.endswith("\\") else " " + s
        if not s.endswith("\\"):
            word, _, rest = cur.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            cur = ""
    return out


def ignored(path, patterns):
    """Docker .dockerignore semantics (last match wins, '!' re-includes)."""
    result = False
    for p in patterns:
        neg = p.startswith("!")
        pat = p[1:] if neg else p
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatch(pre, pat) for pre in prefixes):
            result = not neg
    return result


def check_dockerfile(root, binary):
    d = os.path.join(root, "deploy", "docker")
    text = open(os.path.join(d, "statecached.Dockerfile")).read()
    patterns = [l.strip() for l in open(os.path.join(d, "statecached.Dockerfile.dockerignore"))
                if l.strip() and not l.startswith("#")]
    ins = dockerfile_instructions(text)
    stages, cur = [], None
    for word, rest in ins:
        if word == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest, re.I)
            check(m is not None, f"Dockerfile: FROM {rest!r} has no stage name")
            cur = {"name": m.group(2) if m else "?", "image": m.group(1) if m else rest,
                   "ins": []}
            stages.append(cur)
        elif cur is not None:
            cur["ins"].append((word, rest))
    names = [s["name"] for s in stages]
    check(names == ["build", "runtime"], f"Dockerfile stages {names}, want build, runtime")
    if len(stages) != 2:
        return
    build, runtime = stages
    check(build["image"].startswith("debian:"), "build stage is not Debian")
    check(runtime["image"].startswith("debian:") and runtime["image"].endswith("-slim"),
          "runtime stage is not Debian slim")
    build_run = " ".join(r for w, r in build["ins"] if w == "RUN")
    check("cuda-nvcc" in build_run and ".ci/setup.sh" in build_run,
          "build stage installs neither the CUDA toolkit nor the Debian packages (.ci/setup.sh)")
    for target in re.findall(r"(//[\w/]+:[\w-]+)", build_run):
        pkg, name = target[2:].split(":")
        b = open(os.path.join(root, pkg, "BUILD")).read()
        check(re.search(r'name = "' + re.escape(name) + '"', b) is not None,
              f"Dockerfile builds {target}, which does not exist")
    out_files = set(re.findall(r"bazel-bin/\S+/(\w+)", build_run))
    for stage_idx, stage in enumerate(stages):
        for w, rest in stage["ins"]:
            if w != "COPY":
                continue
            args = rest.split()
            frm = next((a.split("=", 1)[1] for a in args if a.startswith("--from=")), None)
            srcs = [a for a in args if not a.startswith("--")][:-1]
            if frm is None:
                for s in srcs:
                    s = s.rstrip("/")
                    check(os.path.exists(os.path.join(root, s)),
                          f"Dockerfile: COPY source {s} is not in the repository")
                    check(not ignored(s, patterns), f"Dockerfile: COPY source {s} is dockerignored")
            else:
                check(frm in names[:stage_idx], f"Dockerfile: COPY --from={frm} is no earlier stage")
                for s in srcs:
                    check(s.startswith("/out/") and os.path.basename(s) in out_files,
                          f"Dockerfile: COPY --from={frm} {s} is not copied to /out by the build")
    run_rt = " ".join(r for w, r in runtime["ins"] if w == "RUN")
    pkgs = set(re.findall(r"\b(lib[\w.+-]+|zlib1g|ca-certificates)\b", run_rt))
    for bad in ("-dev", "bazel", "nvcc", "clang", "gcc", "g++"):
        check(not any(bad in p for p in pkgs) and f" {bad}" not in run_rt.replace("-dev", "-dev "),
              f"runtime stage installs build tooling ({bad})")
    user = next((r for w, r in runtime["ins"] if w == "USER"), "")
    dep = yaml.safe_load(open(os.path.join(root, "deploy", "kubernetes", "deployment.yaml")))
    sc = dep["spec"]["template"]["spec"]["securityContext"]
    check(user == f"{sc['runAsUser']}:{sc['runAsGroup']}",
          f"Dockerfile USER {user!r} is not the Deployment's runAsUser:runAsGroup")
    entry = next((r for w, r in runtime["ins"] if w == "ENTRYPOINT"), "")
    check("/usr/local/bin/statecached" in entry, "ENTRYPOINT is not statecached")
    if binary and shutil.which("ldd") and shutil.which("dpkg"):
        libs = re.findall(r"=>\s+(\S+)", subprocess.run(["ldd", binary], capture_output=True,
                                                          text=True).stdout)
        needed = set()
        names = {os.path.basename(os.path.realpath(lib)): lib for lib in libs}
        r = subprocess.run(["dpkg", "-S", *sorted(names)], capture_output=True, text=True)
        found = set()
        for line in r.stdout.splitlines():
            pkg, _, path = line.partition(": ")
            lib = names.get(os.path.basename(path))
            if lib is not None and os.path.realpath(path) == os.path.realpath(lib):
                needed.add(pkg.split(":")[0].strip())
                found.add(os.path.basename(path))
        for name in sorted(set(names) - found):
            problems.append(f"{names[name]}: no Debian package provides it")
        missing = needed - pkgs - {"libc6", "libgcc-s1"}
        check(not missing, f"runtime stage lacks packages {sorted(missing)} that statecached loads")
        print(f"check_packaging: statecached loads libraries of {len(needed)} packages")
    else:
        print("check_packaging: no statecached / ldd / dpkg; runtime libraries not checked")


def kustomize(root, path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        problems.append("kubectl not found (kubectl kustomize renders the overlays)")
        return []
    r = subprocess.run([kubectl, "kustomize", os.path.join(root, path)], capture_output=True,
                       text=True)
    check(r.returncode == 0, f"kubectl kustomize {path}: {r.stderr[-800:]}")
    return [d for d in yaml.safe_load_all(r.stdout) if d] if r.returncode == 0 else []


def check_kustomize(root):
    flags = set(re.findall(r"ABSL_FLAG\([^,]+,\s*(\w+)",
                           open(os.path.join(root, "server", "statecached_main.cc")).read()))
    check(len(kustomize(root, "deploy/kubernetes")) >= 5, "base renders fewer than 5 objects")
    docs = kustomize(root, "deploy/overlays/example")
    kinds = {}
    for doc in docs:
        kinds.setdefault(doc["kind"], []).append(doc)
    if "Deployment" not in kinds:
        problems.append("overlay renders no Deployment")
        return
    pod = kinds["Deployment"][0]["spec"]["template"]
    c = pod["spec"]["containers"][0]
    res = c["resources"]
    check(str(res["requests"].get("nvidia.com/gpu")) == str(res["limits"].get("nvidia.com/gpu")),
          "overlay: GPU request != limit")
    for a in c["args"]:
        m = re.fullmatch(r"--(\w+)(=.*)?", a)
        check(m is not None and (m.group(1) in flags or m.group(1) == "flagfile"),
              f"overlay: container arg {a!r} is no statecached flag")
    mounts = [m["mountPath"] for m in c["volumeMounts"]]
    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    check({m["name"] for m in c["volumeMounts"]} <= volumes, "overlay: a mount has no volume")
    tls = [a.split("=", 1)[1] for a in c["args"] if a.startswith(("--tls_cert_file=",
                                                                  "--tls_key_file="))]
    for f in tls:
        check(any(f.startswith(m.rstrip("/") + "/") for m in mounts),
              f"overlay: {f} is on no mounted volume")
    grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        kind = "tcpSocket" if tls else "grpc"
        check(c.get(probe, {}).get(kind, {}).get("port") == grpc_port,
              f"overlay: {probe} is not {kind} on port {grpc_port}")
    labels = pod["metadata"]["labels"]
    port_names = {p["name"] for p in c["ports"]}
    monitors = kinds.get("PodMonitor", [])
    check(len(monitors) == 1, "overlay: no PodMonitor")
    for pm in monitors:
        sel = pm["spec"]["selector"]["matchLabels"]
        check(all(labels.get(k) == v for k, v in sel.items()), "PodMonitor does not select the pods")
        for ep in pm["spec"]["podMetricsEndpoints"]:
            check(ep["port"] in port_names, f"PodMonitor port {ep['port']} is not a container port")
        check(labels.get(pm["spec"]["jobLabel"], "").startswith("statecached"),
              "PodMonitor's job label does not match the rules' job=~\"statecached.*\"")
    secrets = {s["metadata"]["name"]: s for s in kinds.get("Secret", [])}
    check("statecached-tenants" in secrets, "overlay: no statecached-tenants Secret")
    if "statecached-tenants" in secrets:
        import base64
        data = base64.b64decode(secrets["statecached-tenants"]["data"]["tenants"]).decode()
        for line in data.splitlines():
            s = line.strip()
            if s and not s.startswith("#"):
                check(re.fullmatch(r"tenant \S+.*|token \S+ sha256:[0-9a-f]{64}", s) is not None,
                      f"overlay tenants: bad line {s!r}")
    print(f"check_packaging: overlay renders {len(docs)} objects")


def check_license(root):
    text = open(os.path.join(root, "LICENSE")).read()
    check(text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text and
          "END OF TERMS AND CONDITIONS" in text, "LICENSE is not the Apache License 2.0 text")
    py = open(os.path.join(root, "client", "python", "pyproject.toml")).read()
    check('license = { text = "Apache-2.0" }' in py, "pyproject.toml does not declare Apache-2.0")


def main(root, binary=None):
    check_dockerfile(root, binary)
    check_kustomize(root)
    check_license(root)
    for p in problems:
        print("check_packaging: " + p)
    print(f"check_packaging: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
