"""Decode op on a packed local pool vs the same pool inside vLLM-like pages
(slot stride = page size), and the vLLM plugin's decode_prep launch, each
timed as CUDA-graph replays on one GPU (issue 28: where a decode step's time
goes with storage "pages"). Prints one line per case:
    STRIDED case=... batch=B us_per_call=...
Run on the device from the repository root with the dataplane bundle:
    PYTHONPATH=/tmp/sc_dataplane/python:client/vllm \
    STATECACHE_DATAPLANE_LIB=/tmp/sc_dataplane/lib/libstatecache_dataplane.so \
    python3 tests/dataplane/strided_pool_bench.py
"""
import argparse

import torch

import statecache as sc
import statecache.torch as sct


def timed(fn, reps, inner=10):
    """us per fn() call: a graph of `inner` calls replayed `reps` times."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * inner)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=3574)
    p.add_argument("--page", type=int, default=720896)
    p.add_argument("--offset", type=int, default=49152)
    p.add_argument("--batches", default="1,64,256")
    p.add_argument("--format", default="damp:16")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    geo = sc.Geometry("gdn", layers=1, h_qk=16, h_v=32, d_k=128, d_v=128)
    sb = sct.EnginePool.slot_bytes(geo, args.format)
    packed_mem = torch.zeros(args.blocks * sb, dtype=torch.uint8, device=dev)
    pages = torch.zeros(args.blocks, args.page, dtype=torch.uint8, device=dev)
    pools = {"packed": sct.EnginePool.local(packed_mem, geo, args.format),
             "pages": sct.EnginePool.local(pages[:, args.offset:args.offset + sb], geo,
                                           args.format),
             "pages_offset0": sct.EnginePool.local(pages[:, :sb], geo, args.format)}
    from statecache_vllm.decode_prep import decode_prep
    gen = torch.Generator(device=dev).manual_seed(0)
    for b in [int(x) for x in args.batches.split(",")]:
        slots = torch.randperm(args.blocks - 1, generator=gen, device=dev)[:b].to(torch.int32) + 1
        q = torch.nn.functional.normalize(torch.randn(b, 16, 128, device=dev, generator=gen), dim=-1)
        k = torch.nn.functional.normalize(torch.randn(b, 16, 128, device=dev, generator=gen), dim=-1)
        v = torch.randn(b, 32, 128, device=dev, generator=gen)
        g = torch.full((b, 32), -0.1, device=dev)
        beta = torch.full((b, 32), 0.5, device=dev)
        for name, pool in pools.items():
            record = pool.new_record()
            us = timed(lambda: sct.decode(pool, 0, slots, q, k, v, g, beta, record=record),
                       args.reps)
            pool.check(record)
            print(f"STRIDED case=decode_{name} batch={b} us_per_call={us:.2f}", flush=True)
        x = torch.randn(b, 2 * 16 * 128 + 32 * 128, device=dev, generator=gen).bfloat16()
        a = torch.randn(b, 32, device=dev, generator=gen).bfloat16()
        bb = torch.randn(b, 32, device=dev, generator=gen).bfloat16()
        A_log = torch.rand(32, device=dev, generator=gen)
        dt = torch.ones(32, device=dev)
        fresh = torch.zeros(b, dtype=torch.bool, device=dev)
        rows = pages[:, args.offset:args.offset + sb]
        us = timed(lambda: decode_prep(x, a, bb, A_log, dt, fresh, h_qk=16, d_k=128, h_v=32,
                                       d_v=128), args.reps)
        print(f"STRIDED case=decode_prep batch={b} us_per_call={us:.2f}", flush=True)
        us = timed(lambda: decode_prep(x, a, bb, A_log, dt, fresh, h_qk=16, d_k=128, h_v=32,
                                       d_v=128, rows=rows, slots=slots), args.reps)
        print(f"STRIDED case=decode_prep_zeroing batch={b} us_per_call={us:.2f}", flush=True)
    for pool in pools.values():
        pool.close()


if __name__ == "__main__":
    main()
