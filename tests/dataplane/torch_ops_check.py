"""statecache.torch's engine ops from a real PyTorch worker (issue 25), end to
end against a statecached it starts (same harness as torch_attached_check.py):

    python3 tests/dataplane/torch_ops_check.py --dir /tmp/sc_dataplane

Per format (default damp:16, fp32, int8-hadamard, bf16; GDN and KDA, 2
layers, 128 x 128, B = 4) on one EnginePool holding two twin slot sets A and
B (same initial zero states):
  - eager ops on A vs the same decode steps captured once in a CUDA graph
    (torch.cuda.CUDAGraph) on B and replayed with new contents in the same
    input and index tensors (the batch permuted every step, one -1 padding
    entry at step 1): o byte-identical every (step, layer), padding rows
    zero, unpacked states of A and B byte-identical at the end;
  - a NaN written into the captured q before a replay: check() raises
    InvalidArgument "decode layer 0: q[...]" and B's states are unchanged;
  - torch.compile of a function calling the op: o equal to the eager op;
  - out_dtype=torch.bfloat16 equals the fp32 o rounded;
  - argument mistakes (dtype, device, shape, contiguity) raise
    InvalidArgument naming the argument;
  - after detach the captured graph replays write nothing and check() says
    FailedPrecondition "pool: fenced".
Prints PASS / FAIL lines and "RESULT torch_ops_check: PASS|FAIL (n checks, f
failed)"; exit 1 on failure, 2 on setup errors. --backend=cpu runs the eager
parts on the CPU backend (no graph, no compile).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_attached_check as tac  # noqa: E402  (the shared harness)

report, info, expect = tac.report, tac.info, tac.expect


def inputs(torch, geo, n, dev, gen):
    def unit(shape):
        x = torch.randn(shape, generator=gen, device="cpu")
        return (x / x.norm(dim=-1, keepdim=True)).to(torch.bfloat16).to(dev)
    q = unit((n, geo.h_qk, geo.d_k))
    k = unit((n, geo.h_qk, geo.d_k))
    v = torch.randn((n, geo.h_v, geo.d_v), generator=gen).to(torch.bfloat16).to(dev)
    gw = (n, geo.h_v, geo.d_k) if geo.arch == "kda" else (n, geo.h_v)
    g = (-0.3 * torch.rand(gw, generator=gen)).to(dev)
    beta = (0.2 + 0.6 * torch.rand((n, geo.h_v), generator=gen)).to(dev)
    return [q, k, v, g, beta]


def check_format(fmt, arch, idx, args, paths, server, ops, torch, sc, sct):
    tag = f"[{arch} {fmt}]"
    h_qk = 4 if arch == "kda" else 2
    geo_text = f"{arch}:2:{h_qk}:4:128:128"
    model = f"ops{idx}"
    b = args.batch
    ops.ok("register", model=model, geometry=geo_text, format=fmt, slots_capacity=2 * b + 4)
    out = ops.ok("allocate", model=model, count=2 * b)
    handles = [sc.SlotHandle(int(p[1]), int(p[2])) for p in
               (line.split() for line in out.splitlines()) if p and p[0] == "slot"]
    pool = sct.EnginePool(server.target, model, handles, library=paths["library"])
    geo, dev, cuda = pool.geometry, pool.device, pool.cuda
    ia = pool.slot_indices(handles[:b])
    ib = pool.slot_indices(handles[b:])
    rec = pool.new_record()
    gen = torch.Generator().manual_seed(7 + idx)
    static = inputs(torch, geo, b, dev, gen)
    static_idx = ib.clone()
    static_o = [torch.zeros((b, geo.h_v, geo.d_v), device=dev) for _ in range(geo.layers)]

    def step_on(slot_idx, xs, outs):
        for layer in range(geo.layers):
            sct.decode(pool, layer, slot_idx, *xs, record=rec, out=outs[layer])

    graph = None
    if cuda:
        step_on(static_idx, static, static_o)  # warm up (B's states advance once...)
        step_on(ia.clone(), static, [torch.empty_like(o) for o in static_o])  # ...and A's too
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step_on(static_idx, static, static_o)
    same_o = same_pad = True
    for step in range(args.steps):
        perm = torch.randperm(b, generator=gen)
        xs = [x[perm.to(x.device)] if x.dim() > 0 else x for x in inputs(torch, geo, b, dev, gen)]
        a_idx, b_idx = ia[perm.to(dev)].clone(), ib[perm.to(dev)].clone()
        if step == 1:
            a_idx[0] = -1
            b_idx[0] = -1
        o_a = [torch.empty((b, geo.h_v, geo.d_v), device=dev) for _ in range(geo.layers)]
        step_on(a_idx, xs, o_a)
        for s, x in zip(static, xs):
            s.copy_(x)
        static_idx.copy_(b_idx)
        for o in static_o:
            o.fill_(float("nan"))
        if graph is not None:
            graph.replay()
        else:
            step_on(static_idx, static, static_o)
        for layer in range(geo.layers):
            same_o &= torch.equal(o_a[layer].view(torch.int32), static_o[layer].view(torch.int32))
            if step == 1:
                same_pad &= bool((static_o[layer][0] == 0).all())
    pool.check(rec)
    report(f"{tag} {'graph replays' if cuda else 'eager'} == eager ops, o bytes", same_o)
    report(f"{tag} padding row of o is zero", same_pad)
    sa = sct.unpack(pool, ia, record=rec)
    sb = sct.unpack(pool, ib, record=rec)
    pool.check(rec)
    report(f"{tag} states of A and B byte-identical", torch.equal(sa.view(torch.int32),
                                                                   sb.view(torch.int32)))

    # A bad value in a replay: nothing written, the record names the field.
    static[0][1, 0, 3] = float("nan")
    static_idx.copy_(ib)
    if graph is not None:
        graph.replay()
    else:
        step_on(static_idx, static, static_o)
    expect(f"{tag} NaN q in a replay -> InvalidArgument", sc.InvalidArgument,
           f"decode layer 0: q[{geo.h_qk * geo.d_k + 3}]", lambda: pool.check(rec))
    sb2 = sct.unpack(pool, ib, record=rec)
    pool.check(rec)
    report(f"{tag} failed replay wrote nothing", torch.equal(sb.view(torch.int32),
                                                             sb2.view(torch.int32)))

    # pack, copy_slots and prefill, twin against twin.
    states = torch.randn(sa.shape, generator=gen).mul_(0.3).to(dev)
    sct.pack(pool, ia, states, record=rec)
    sct.copy_slots(pool, ia, ib, record=rec)
    pool.check(rec)
    ua, ub = sct.unpack(pool, ia, record=rec), sct.unpack(pool, ib, record=rec)
    report(f"{tag} pack then copy_slots: B equals A", torch.equal(ua.view(torch.int32),
                                                                 ub.view(torch.int32)))
    t = 3
    xs = [x.unsqueeze(1).repeat_interleave(t, 1).contiguous() for x in inputs(torch, geo, b, dev,
                                                                              gen)]
    pa = sct.prefill(pool, 1, ia, *xs, record=rec)
    pb = sct.prefill(pool, 1, ib, *xs, record=rec)
    pool.check(rec)
    ua, ub = sct.unpack(pool, ia, record=rec), sct.unpack(pool, ib, record=rec)
    report(f"{tag} prefill of {t} tokens: o and states equal on twins",
           pa.shape == (b, t, geo.h_v, geo.d_v) and torch.equal(pa, pb) and
           torch.equal(ua.view(torch.int32), ub.view(torch.int32)))
    dup = ib.clone()
    dup[1] = dup[0]
    sct.copy_slots(pool, ia, dup, record=rec)
    expect(f"{tag} copy to a repeated destination -> InvalidArgument", sc.InvalidArgument,
           "copy_slots: dst_slots[1]", lambda: pool.check(rec))

    # bf16 output and argument errors.
    xs = inputs(torch, geo, b, dev, gen)
    o32 = sct.decode(pool, 0, ia, *xs, record=rec)
    o16 = sct.decode(pool, 0, ib, *xs, record=rec, out_dtype=torch.bfloat16)
    pool.check(rec)
    report(f"{tag} out_dtype=bfloat16 is o rounded", o16.dtype == torch.bfloat16 and
           torch.equal(o16, o32.to(torch.bfloat16)))
    expect(f"{tag} g float64 -> InvalidArgument g", sc.InvalidArgument, "g: dtype",
           lambda: sct.decode(pool, 0, ia, xs[0], xs[1], xs[2], xs[3].double(), xs[4],
                              record=rec))
    expect(f"{tag} short q -> InvalidArgument q", sc.InvalidArgument, "q: shape",
           lambda: sct.decode(pool, 0, ia, xs[0][:1], *xs[1:], record=rec))
    expect(f"{tag} int64 slots -> InvalidArgument slots", sc.InvalidArgument, "slots:",
           lambda: sct.decode(pool, 0, ia.long(), *xs, record=rec))
    nc = xs[2].transpose(1, 2).contiguous().transpose(1, 2)
    expect(f"{tag} non-contiguous v -> InvalidArgument v", sc.InvalidArgument, "v: not contig",
           lambda: sct.decode(pool, 0, ia, xs[0], xs[1], nc, xs[3], xs[4], record=rec))
    if cuda:
        expect(f"{tag} CPU q on a CUDA pool -> InvalidArgument q", sc.InvalidArgument, "q: on cpu",
               lambda: sct.decode(pool, 0, ia, xs[0].cpu(), *xs[1:], record=rec))

    if cuda and args.compile:
        # torch.compile of a function calling the op, against the eager op on the twin.
        def f(idx_t, q, k, v, g, beta):
            return sct.decode(pool, 1, idx_t, q * 1.0, k, v, g, beta, record=rec) * 2.0
        cf = torch.compile(f, fullgraph=True)
        xs = inputs(torch, geo, b, dev, gen)
        oc = cf(ia, *xs)
        oe = f(ib, *xs)
        pool.check(rec)
        report(f"{tag} torch.compile'd op == eager op", torch.equal(oc, oe))

    # Detach: replays of the captured graph are fenced.
    pool.session.detach()
    if graph is not None:
        graph.replay()
        expect(f"{tag} replay after detach -> FailedPrecondition fenced",
               sc.FailedPrecondition, "pool: fenced", lambda: pool.check(rec))
        del graph
    expect(f"{tag} op after detach -> FailedPrecondition", sc.FailedPrecondition, "detached",
           lambda: sct.decode(pool, 0, ia, *xs, record=rec))
    torch.cuda.synchronize() if cuda else None
    pool.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="")
    p.add_argument("--statecached", default="")
    p.add_argument("--ops", default="")
    p.add_argument("--library", default="")
    p.add_argument("--python_root", default="")
    p.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--formats", default="damp:16,fp32,int8-hadamard,bf16")
    p.add_argument("--arches", default="gdn,kda")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--compile", type=int, default=1)
    args = p.parse_args()
    try:
        paths = tac.locate(args)
    except tac.SetupError as e:
        print(f"FAIL setup: {e}\nRESULT torch_ops_check: FAIL (setup)", flush=True)
        return 2
    sys.path.insert(0, paths["python_root"])
    ok, out = tac.probe(f"import grpc, ctypes; ctypes.CDLL({paths['library']!r}); print('ok')")
    if not ok:
        tac.install_grpc_standin()
    info(f"grpc: {'real' if ok else 'stand-in'}")
    import torch
    import statecache as sc
    import statecache.torch as sct
    info(f"torch {torch.__version__} backend={args.backend}")
    workdir = tempfile.mkdtemp(prefix="sc-opschk-", dir="/tmp")
    server, code = None, 0
    try:
        server = tac.Server(paths["statecached"], args.backend, workdir, state_bytes=256 << 20,
                            checkpoint_bytes=16 << 20)
        ops = tac.Ops(paths["ops"], server.target)
        i = 0
        for arch in args.arches.split(","):
            for fmt in args.formats.split(","):
                try:
                    check_format(fmt, arch, i, args, paths, server, ops, torch, sc, sct)
                except Exception as e:  # noqa: BLE001
                    report(f"[{arch} {fmt}] ran to the end", False, f"{type(e).__name__}: {e}")
                    traceback.print_exc()
                i += 1
    except tac.SetupError as e:
        report("setup", False, str(e))
        code = 2
    finally:
        if server is not None:
            rc = server.stop()
            report("statecached exits cleanly", rc == 0, f"exit {rc}")
        shutil.rmtree(workdir, ignore_errors=True)
    failed = sum(1 for _, ok in tac._results if not ok)
    print(f"RESULT torch_ops_check: {'PASS' if failed == 0 and code == 0 else 'FAIL'} "
          f"({len(tac._results)} checks, {failed} failed)", flush=True)
    return code or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
