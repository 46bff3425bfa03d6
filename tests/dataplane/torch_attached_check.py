#!/usr/bin/env python3
"""Attached mode from a real PyTorch worker (issue 10), end to end: the Python
binding (client/python/statecache/attached.py over libstatecache_dataplane.so)
against a statecached it starts, compared bit for bit with the server's own
path. Run by tests/dataplane/device_run.sh on the H200 (plain python3 +
torch; no grpcio needed) from the folder stage_device.sh prepared:

    python3 tests/dataplane/torch_attached_check.py --dir /tmp/sc_dataplane

Per format (default damp:16 and fp32; GDN, 2 layers, 2 key / 4 value heads,
128 x 128, B = 3):
  - statecached (--backend=cuda, data plane on, unix socket) registers the
    model; the server-side half (register, allocate, unary Update with inline
    bytes, Export) runs through tests/dataplane/torch_check_ops (C++ client);
  - the worker attaches B slots and runs --steps decode steps of every layer
    with CUDA tensors (bf16 q / k / v, fp32 g / beta / o, tensor.data_ptr()),
    all produced on a non-default torch stream that first sleeps on the GPU
    (torch.cuda._sleep), never synchronized before an update: the binding's
    default stream= (torch.cuda.current_stream()) must order the kernel
    after the sleep, the input copies and an o.fill_(nan), else o / the
    states come out wrong;
  - the same inputs go through unary Update RPCs on B other slots: o of
    every (step, layer) must be byte-identical; after detach the Export of
    each attached slot must equal its served twin byte for byte;
  - between steps: bad inputs (shape, dtype, device, a positive g caught by
    the backend's validation, a layer out of range) raise
    statecache.InvalidArgument naming the field and write nothing (the final
    states still match); a slot the session does not hold is
    FailedPrecondition naming slots[0]; the server refuses its own Update on
    attached slots (FAILED_PRECONDITION slots[0]); after detach() every
    decode_update is FailedPrecondition.
  - an ordering control (CUDA, INFO only): layer 0 of step 0 on B fresh
    slots ordered after an idle stream instead of the producing one, to
    show that a missing order is visible (expected: o differs).
Prints one PASS / FAIL line per check and a final
"RESULT torch_attached_check: PASS|FAIL (<n> checks, <f> failed)";
exits 1 on any failure (2: setup, e.g. a missing file).

Without a GPU (the logic, tested by //tests/dataplane:torch_attached_check_cpu_test):
    --backend=cpu (statecached --shared_pools; numpy arrays, or torch CPU
    tensors with --tensors=torch; bf16 only with ml_dtypes or torch, else fp32)
When grpcio is not importable (or crashes next to the library), a minimal
`grpc` stand-in carrying grpc.StatusCode is installed before importing
statecache (its exceptions only need the enum); the line "INFO grpc: ..."
says which one ran.
"""
from __future__ import annotations

import argparse
import enum
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

_results = []


def report(name: str, ok: bool, detail: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True)
    _results.append((name, ok))
    return ok


def info(text: str) -> None:
    print(f"INFO {text}", flush=True)


class SetupError(Exception):
    pass


# --------------------------------------------------------------------------
# Files, probes, the grpc stand-in.

def locate(args):
    """Paths of statecached, torch_check_ops, the library and the package root."""
    d = args.dir
    paths = {
        "statecached": args.statecached or (d and os.path.join(d, "statecached")),
        "ops": args.ops or (d and os.path.join(d, "torch_check_ops")),
        "library": args.library or (d and os.path.join(d, "lib", "libstatecache_dataplane.so")),
        "python_root": args.python_root or (d and os.path.join(d, "python")),
    }
    if not paths["python_root"] or not os.path.isdir(os.path.join(paths["python_root"],
                                                                  "statecache")):
        paths["python_root"] = os.path.join(REPO, "client", "python")
    for name, p in paths.items():
        if not p or not os.path.exists(p):
            raise SetupError(f"{name}: {p!r} not found (give --dir or --{name})")
    return paths


def probe(code: str, env=None, timeout=120):
    """Runs `code` in a child python; (ok, one-line outcome)."""
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout} s"
    out = (r.stdout + r.stderr).strip().splitlines()
    tail = out[-1] if out else ""
    if r.returncode < 0:
        return False, f"killed by signal {-r.returncode} ({tail})"
    return r.returncode == 0, tail


def install_grpc_standin():
    """A `grpc` module with StatusCode only (what statecache.errors needs)."""
    names = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
             "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
             "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
             "UNAUTHENTICATED"]
    m = types.ModuleType("grpc")
    m.StatusCode = enum.Enum("StatusCode", {n: (i, n.lower()) for i, n in enumerate(names)})

    class RpcError(Exception):
        pass

    m.RpcError = RpcError
    m.__statecache_standin__ = True
    sys.modules["grpc"] = m


# --------------------------------------------------------------------------
# Tensors: torch (CUDA or CPU) or numpy (CPU).

class TorchTensors:
    def __init__(self, torch, device: str, dtype: str):
        self.t = torch
        self.device = device
        self.cuda = device == "cuda"
        self.dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        self.stream = torch.cuda.Stream() if self.cuda else None
        self.idle = torch.cuda.Stream() if self.cuda else None
        self.gen = torch.Generator(device=device)

    def on_stream(self):
        import contextlib
        return self.t.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()

    def inputs(self, seed: int, b: int, geo):
        t, dev = self.t, self.device
        self.gen.manual_seed(seed)

        def unit(*shape):
            x = t.randn(*shape, device=dev, generator=self.gen)
            return (x / x.norm(dim=-1, keepdim=True)).to(self.dt)

        q = unit(b, geo.h_qk, geo.d_k)
        k = unit(b, geo.h_qk, geo.d_k)
        v = t.randn(b, geo.h_v, geo.d_v, device=dev, generator=self.gen).to(self.dt)
        gshape = (b, geo.h_v, geo.d_k) if geo.arch == "kda" else (b, geo.h_v)
        g = -(t.rand(*gshape, device=dev, generator=self.gen) * 0.49 + 0.01)
        beta = t.rand(b, geo.h_v, device=dev, generator=self.gen) * 0.8 + 0.1
        return [q, k, v, g, beta]

    def zeros_like(self, x):
        return self.t.zeros_like(x)

    def empty_o(self, b, geo):
        return self.t.empty(b, geo.h_v, geo.d_v, device=self.device, dtype=self.t.float32)

    def copy(self, dst, src):
        dst.copy_(src)

    def fill_nan(self, o):
        o.fill_(float("nan"))

    def delay(self, cycles: int):
        if self.cuda:
            if hasattr(self.t.cuda, "_sleep"):
                self.t.cuda._sleep(cycles)
            else:  # a few big products instead
                a = self.t.randn(4096, 4096, device="cuda")
                for _ in range(8):
                    a = a @ a / 64.0

    def snapshot(self, o):
        return o.clone()

    def finish(self):
        if self.cuda:
            self.t.cuda.synchronize()

    def to_bytes(self, x) -> bytes:
        x = x.detach().contiguous()
        if x.dtype in (self.t.bfloat16, self.t.float16):
            x = x.view(self.t.int16)
        return x.cpu().numpy().tobytes()

    def shrink(self, x, n):
        return x[:n].contiguous()

    def as_float64(self, x):
        return x.double()

    def other_device(self, x):
        # A fresh host tensor (x.cpu() would synchronize the stream).
        return self.t.zeros(tuple(x.shape), dtype=x.dtype) if self.cuda else None

    def with_positive(self, g):
        g = g.clone()
        g.view(-1)[min(5, g.numel() - 1)] = 0.5
        return g

    def transposed_o(self, b, geo):
        return self.t.empty(b, geo.d_v, geo.h_v, device=self.device).transpose(1, 2)

    def narrow_v(self, v):
        return v[:, :2]


class NumpyTensors:
    cuda = False
    stream = idle = None

    def __init__(self, np, dtype: str):
        self.np = np
        if dtype == "bf16":
            import ml_dtypes  # raises ImportError: caller falls back
            self.dt = ml_dtypes.bfloat16
        else:
            self.dt = {"fp16": np.float16, "fp32": np.float32}[dtype]

    def on_stream(self):
        import contextlib
        return contextlib.nullcontext()

    def inputs(self, seed, b, geo):
        np = self.np
        rng = np.random.default_rng(seed)

        def unit(*shape):
            x = rng.standard_normal(shape).astype(np.float32)
            return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(self.dt)

        q = unit(b, geo.h_qk, geo.d_k)
        k = unit(b, geo.h_qk, geo.d_k)
        v = rng.standard_normal((b, geo.h_v, geo.d_v)).astype(np.float32).astype(self.dt)
        gshape = (b, geo.h_v, geo.d_k) if geo.arch == "kda" else (b, geo.h_v)
        g = -rng.uniform(0.01, 0.5, gshape).astype(np.float32)
        beta = rng.uniform(0.1, 0.9, (b, geo.h_v)).astype(np.float32)
        return [q, k, v, g, beta]

    def zeros_like(self, x):
        return self.np.zeros_like(x)

    def empty_o(self, b, geo):
        return self.np.empty((b, geo.h_v, geo.d_v), self.np.float32)

    def copy(self, dst, src):
        dst[...] = src

    def fill_nan(self, o):
        o.fill(self.np.nan)

    def delay(self, cycles):
        pass

    def snapshot(self, o):
        return o.copy()

    def finish(self):
        pass

    def to_bytes(self, x) -> bytes:
        return self.np.ascontiguousarray(x).tobytes()

    def shrink(self, x, n):
        return self.np.ascontiguousarray(x[:n])

    def as_float64(self, x):
        return x.astype(self.np.float64)

    def other_device(self, x):
        return None

    def with_positive(self, g):
        g = g.copy()
        g.reshape(-1)[min(5, g.size - 1)] = 0.5
        return g

    def transposed_o(self, b, geo):
        return self.np.empty((b, geo.d_v, geo.h_v), self.np.float32).transpose(0, 2, 1)

    def narrow_v(self, v):
        return v[:, :2]


# --------------------------------------------------------------------------
# statecached and the C++ helper.

class Server:
    def __init__(self, binary, backend, workdir, state_bytes=64 << 20, checkpoint_bytes=1 << 20):
        self.sock = os.path.join(workdir, "sc.sock")
        self.target = "unix:" + self.sock
        self.log_path = os.path.join(workdir, "statecached.log")
        args = [binary, "--listen=" + self.target, "--backend=" + backend, "--dataplane",
                "--metrics_port=-1", f"--state_memory_bytes={state_bytes}",
                f"--checkpoint_memory_bytes={checkpoint_bytes}", "--slot_idle_timeout_ms=0",
                "--report_geometry=gdn:1:1:1:32:32"]
        if backend == "cpu":
            args.append("--shared_pools")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.time() > deadline:
                raise SetupError("statecached did not start:\n" + self.tail())
            time.sleep(0.05)

    def tail(self, n=20):
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        """SIGTERM; the exit code (the seconds it took: self.stop_s)."""
        start = time.time()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.stop_s = time.time() - start
        return self.proc.returncode


class Ops:
    """tests/dataplane/torch_check_ops: (returncode, stdout)."""

    def __init__(self, binary, target):
        self.binary, self.target = binary, target

    def __call__(self, cmd, **flags):
        args = [self.binary, "--target=" + self.target, cmd]
        args += [f"--{k}={v}" for k, v in flags.items()]
        r = subprocess.run(args, capture_output=True, text=True, timeout=120)
        return r.returncode, r.stdout + r.stderr

    def ok(self, cmd, **flags):
        rc, out = self(cmd, **flags)
        if rc != 0:
            raise SetupError(f"torch_check_ops {cmd} failed (exit {rc}): {out.strip()}")
        return out


def slot_arg(slots):
    return ",".join(f"{s.id}:{s.generation}" for s in slots)


# --------------------------------------------------------------------------
# The check of one format.

def _expect_raise(name, exc_type, matches, fn):
    """fn() must raise exc_type whose message satisfies matches(msg)."""
    try:
        fn()
    except exc_type as e:
        msg = getattr(e, "message", str(e))
        return report(name, matches(msg), f"{type(e).__name__}: {msg}")
    except Exception as e:  # noqa: BLE001
        return report(name, False, f"raised {type(e).__name__}: {e}")
    return report(name, False, "no exception")


def expect_error(name, exc_type, prefix, fn):
    """fn() must raise exc_type whose message starts with `prefix`."""
    return _expect_raise(name, exc_type, lambda msg: msg.startswith(prefix), fn)


def expect(name, exc_type, needle, fn):
    """fn() must raise exc_type with `needle` in its message."""
    return _expect_raise(name, exc_type, lambda msg: needle in msg, fn)


def check_format(fmt, idx, args, paths, server, ops, tensors, sc, attached_mod):
    geo_text = args.geometry
    arch, layers, h_qk, h_v, d_k, d_v = geo_text.split(":")
    geo = sc.Geometry(arch, int(layers), int(h_qk), int(h_v), int(d_k), int(d_v))
    b, steps, tag = args.batch, args.steps, f"[{fmt}]"
    model = f"tchk{idx}"
    ops.ok("register", model=model, geometry=geo_text, format=fmt, slots_capacity=4 * b + 4)

    def allocate(n):
        out = ops.ok("allocate", model=model, count=n)
        return [sc.SlotHandle(int(p[1]), int(p[2])) for p in
                (line.split() for line in out.splitlines()) if p and p[0] == "slot"]

    served, mine, other, ctrl = allocate(b), allocate(b), allocate(1), allocate(b)
    a = attached_mod.AttachedSession(server.target, model, mine, library=paths["library"])
    ctrl_session = attached_mod.AttachedSession(server.target, model, ctrl,
                                                library=paths["library"])
    g = a.geometry
    report(f"{tag} attach", a.backend == args.backend and
           (g.arch, g.layers, g.h_qk, g.h_v, g.d_k, g.d_v) == (geo.arch, geo.layers, geo.h_qk,
                                                               geo.h_v, geo.d_k, geo.d_v),
           f"backend={a.backend} geometry={g.arch}:{g.layers}:{g.h_qk}:{g.h_v}:{g.d_k}:{g.d_v}")

    # Sources of every (step, layer), produced on the worker's stream.
    with tensors.on_stream():
        src = [tensors.inputs(1000 * idx + s * geo.layers + l, b, geo)
               for s in range(steps) for l in range(geo.layers)]
        work = [tensors.zeros_like(x) for x in src[0]]
        o = tensors.empty_o(b, geo)
        outs = []
        for s in range(steps):
            if s == 1:
                bad_inputs(tag, a, tensors, work, o, b, geo, sc, other)
            for l in range(geo.layers):
                tensors.delay(args.delay_cycles)       # the stream is busy for a while ...
                for w, x in zip(work, src[s * geo.layers + l]):
                    tensors.copy(w, x)                 # ... then writes the inputs
                tensors.fill_nan(o)                    # and poisons o
                a.decode_update(l, *work, o)           # stream=None: current_stream()
                outs.append(tensors.snapshot(o))
        control = ordering_control(ctrl_session, tensors, work, o, src, args)
    tensors.finish()
    ctrl_session.close()

    # The server's path: the same inputs as unary Update RPCs (inline bytes).
    workdir = os.path.dirname(server.sock)
    in_path = os.path.join(workdir, f"in{idx}.bin")
    with open(in_path, "wb") as f:
        for x in src:
            for t in x:
                f.write(tensors.to_bytes(t))
    o_path = os.path.join(workdir, f"o{idx}.bin")
    ops.ok("update", model=model, slots=slot_arg(served), dtype=args.dtype, steps=steps,
           inputs=in_path, out=o_path)
    with open(o_path, "rb") as f:
        want = f.read()
    per = b * geo.h_v * geo.d_v * 4
    got = [tensors.to_bytes(x) for x in outs]
    bad = [i for i, x in enumerate(got) if x != want[i * per:(i + 1) * per]]
    finite = all(x == x for x in memoryview(b"".join(got)).cast("f"))
    report(f"{tag} o bit-identical to server Update", not bad and finite,
           f"{len(got)} (step, layer) outputs of B={b}, {per} bytes each" +
           (f"; differing: {[(i // geo.layers, i % geo.layers) for i in bad][:6]}" if bad else "")
           + ("" if finite else "; o holds NaN"))
    if isinstance(control, str):
        info(f"{tag} ordering control: the unordered call raised {control}")
    elif control is not None:
        nan = any(x != x for x in memoryview(control).cast("f"))
        verdict = ("holds NaN" if nan else "differs from the served o" if control != want[:per]
                   else "equals the served o (the race was not seen)")
        info(f"{tag} ordering control (stream= an idle stream while the inputs were still "
             f"being written): o {verdict}; expected: differs (informational)")

    # While attached, the server refuses its own Update on those slots.
    one = os.path.join(workdir, f"one{idx}.bin")
    with open(one, "wb") as f:
        for x in src[:geo.layers]:
            for t in x:
                f.write(tensors.to_bytes(t))
    rc, out = ops("update", model=model, slots=slot_arg(mine), dtype=args.dtype, steps=1,
                  inputs=one, out=one + ".o")
    report(f"{tag} server Update on attached slots refused",
           rc == 3 and "FAILED_PRECONDITION" in out and "slots[0]" in out, out.strip())

    a.detach()
    expect_error(f"{tag} decode_update after detach", sc.FailedPrecondition, "",
                 lambda: a.decode_update(0, *work, o))
    a.close()

    # States: every attached slot equals its served twin.
    ops.ok("export", model=model, slots=slot_arg(served), out=os.path.join(workdir, f"s{idx}"))
    ops.ok("export", model=model, slots=slot_arg(mine), out=os.path.join(workdir, f"m{idx}"))
    same, nonzero = [], True
    for i in range(b):
        with open(os.path.join(workdir, f"s{idx}.{i}"), "rb") as f:
            s_bytes = f.read()
        with open(os.path.join(workdir, f"m{idx}.{i}"), "rb") as f:
            m_bytes = f.read()
        same.append(s_bytes == m_bytes)
        nonzero &= any(s_bytes)
    report(f"{tag} states after detach bit-identical (Export)", all(same) and nonzero,
           f"{b} slots of {len(s_bytes)} packed bytes; identical={same}" +
           ("" if nonzero else "; a served state is all zero"))


def bad_inputs(tag, a, tensors, work, o, b, geo, sc, other):
    q, k, v, g, beta = work
    expect_error(f"{tag} bad shape v", sc.InvalidArgument, "v: shape",
                 lambda: a.decode_update(0, q, k, tensors.narrow_v(v), g, beta, o))
    expect_error(f"{tag} bad dtype g", sc.InvalidArgument, "g: dtype float64",
                 lambda: a.decode_update(0, q, k, v, tensors.as_float64(g), beta, o))
    expect_error(f"{tag} non-contiguous o", sc.InvalidArgument, "o: not contiguous",
                 lambda: a.decode_update(0, q, k, v, g, beta, tensors.transposed_o(b, geo)))
    host_q = tensors.other_device(q)
    if host_q is not None:
        expect_error(f"{tag} CPU tensor q on CUDA", sc.InvalidArgument, "q: a CPU tensor",
                     lambda: a.decode_update(0, host_q, k, v, g, beta, o))
    expect_error(f"{tag} positive g (backend validation)", sc.InvalidArgument, "g[",
                 lambda: a.decode_update(0, q, k, v, tensors.with_positive(g), beta, o))
    expect_error(f"{tag} layer out of range", sc.InvalidArgument, "layer",
                 lambda: a.decode_update(geo.layers, q, k, v, g, beta, o))
    expect_error(f"{tag} slot not attached", sc.FailedPrecondition, "slots[0]: not attached",
                 lambda: a.decode_update(0, tensors.shrink(q, 1), tensors.shrink(k, 1),
                                         tensors.shrink(v, 1), tensors.shrink(g, 1),
                                         tensors.shrink(beta, 1), tensors.shrink(o, 1),
                                         slots=other))


def ordering_control(ctrl, tensors, work, o, src, args):
    """One update of layer 0 on B fresh control slots, ordered after an IDLE
    stream while the producing stream still sleeps before writing src[0]
    into the work buffers: the kernel reads what the buffers held before
    (the last step's inputs), so its o should differ from the served
    step-0 layer-0 o. Returns o's bytes as the kernel left them (read on the
    idle stream right after the call), or an error text."""
    if not tensors.cuda:
        return None
    tensors.delay(args.delay_cycles)
    for w, x in zip(work, src[0]):
        tensors.copy(w, x)
    tensors.fill_nan(o)
    try:
        ctrl.decode_update(0, *work, o, stream=tensors.idle)
    except Exception as e:  # noqa: BLE001 - informational
        return f"{type(e).__name__}: {e}"
    with tensors.t.cuda.stream(tensors.idle):
        got = tensors.snapshot(o)
    tensors.idle.synchronize()
    return tensors.to_bytes(got)


# --------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="", help="staged folder (statecached, torch_check_ops, "
                   "lib/libstatecache_dataplane.so, python/statecache)")
    p.add_argument("--statecached", default="")
    p.add_argument("--ops", default="")
    p.add_argument("--library", default="")
    p.add_argument("--python_root", default="")
    p.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tensors", default="auto", choices=["auto", "torch", "numpy"])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--formats", default="damp:16,fp32")
    p.add_argument("--geometry", default="gdn:2:2:4:128:128")
    p.add_argument("--batch", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--delay_cycles", type=int, default=50_000_000,
                   help="torch.cuda._sleep before each update's input copies (~25 ms)")
    p.add_argument("--grpc", default="auto", choices=["auto", "real", "standin"])
    args = p.parse_args()
    if args.steps < 2:
        p.error("--steps must be >= 2 (the bad-input checks run before step 1)")

    try:
        paths = locate(args)
    except SetupError as e:
        print(f"FAIL setup: {e}", flush=True)
        print("RESULT torch_attached_check: FAIL (setup)", flush=True)
        return 2
    info("files: " + " ".join(f"{k}={v}" for k, v in paths.items()))
    lib = paths["library"]
    sys.path.insert(0, paths["python_root"])

    # Probes in child processes: a crash at load time must not kill this one.
    ok, out = probe(f"import ctypes; ctypes.CDLL({lib!r}); print('ok')")
    if not report("library loads (ctypes)", ok, out):
        print("RESULT torch_attached_check: FAIL (library)", flush=True)
        return 1
    use_torch = args.tensors == "torch" or (args.tensors == "auto" and args.backend == "cuda")
    if args.tensors == "auto" and args.backend == "cpu":
        use_torch = probe("import torch")[0]
    if use_torch:
        ok, out = probe("import torch, ctypes; "
                        f"ctypes.CDLL({lib!r}); "
                        "print('torch', torch.__version__, 'cuda', torch.version.cuda, "
                        "'available', torch.cuda.is_available(), "
                        "torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')")
        if not report("torch + library in one process", ok, out):
            print("RESULT torch_attached_check: FAIL (torch)", flush=True)
            return 1
    grpc_real = False
    if args.grpc != "standin":
        ok, out = probe(f"import grpc, ctypes; ctypes.CDLL({lib!r}); print('grpcio', grpc.__version__)")
        grpc_real = ok
        if args.grpc == "real" and not ok:
            report("grpcio + library in one process", False, out)
        info(f"grpc: {'real ' + out if ok else 'stand-in (' + out + ')'}")
    if not grpc_real:
        install_grpc_standin()

    if use_torch:
        import torch
        if args.backend == "cuda" and not torch.cuda.is_available():
            report("torch sees a GPU", False, "torch.cuda.is_available() is False")
            print("RESULT torch_attached_check: FAIL (no GPU)", flush=True)
            return 1
        tensors = TorchTensors(torch, "cuda" if args.backend == "cuda" else "cpu", args.dtype)
    else:
        import numpy as np
        try:
            tensors = NumpyTensors(np, args.dtype)
        except ImportError:
            info("numpy without ml_dtypes has no bfloat16: q / k / v in fp32")
            args.dtype = "fp32"
            tensors = NumpyTensors(np, "fp32")
    import statecache as sc
    import statecache.attached as attached_mod
    info(f"backend={args.backend} tensors={'torch' if use_torch else 'numpy'} dtype={args.dtype} "
         f"B={args.batch} steps={args.steps} geometry={args.geometry} formats={args.formats}")

    # Short: the unix socket's path must fit in sun_path (108 bytes).
    workdir = tempfile.mkdtemp(prefix="sc-torchchk-", dir="/tmp" if os.path.isdir("/tmp") else None)
    server = None
    code = 0
    try:
        server = Server(paths["statecached"], args.backend, workdir)
        ops = Ops(paths["ops"], server.target)
        for i, fmt in enumerate(args.formats.split(",")):
            try:
                check_format(fmt, i, args, paths, server, ops, tensors, sc, attached_mod)
            except Exception as e:  # noqa: BLE001 - one format's failure, keep going
                report(f"[{fmt}] ran to the end", False, f"{type(e).__name__}: {e}")
                traceback.print_exc()
    except SetupError as e:
        report("setup", False, str(e))
        code = 2
    finally:
        if server is not None:
            rc = server.stop()
            if not report("statecached exits cleanly", rc == 0,
                          f"exit {rc} after SIGTERM, {server.stop_s:.1f} s"):
                print(server.tail(), flush=True)
        shutil.rmtree(workdir, ignore_errors=True)
    failed = sum(1 for _, ok in _results if not ok)
    print(f"RESULT torch_attached_check: {'PASS' if failed == 0 and code == 0 else 'FAIL'} "
          f"({len(_results)} checks, {failed} failed)", flush=True)
    return code or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
