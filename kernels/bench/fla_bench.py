#!/usr/bin/env python3
"""flash-linear-attention baselines for the decode benchmark (issue 5).

Times FLA's fused recurrent kernels for one decode token (T = 1) at the same
sizes as decode_bench: B in --batches, 32 value heads, d_k = d_v = 128, bf16
q/k/v, fp32 g/beta, fp32 states in a pool of --pool_mib MiB (cold L2: each
launch uses the next disjoint set of B slots).

  gdn_gather_scatter  what a serving engine pays around FLA's non-indexed GDN
                      call: h0 = pool[idx]; o, ht = fused_recurrent_gated_delta_rule(
                      ..., initial_state=h0, output_final_state=True); pool[idx] = ht
  gdn_dense_kmajor    the kernel alone on a contiguous [B, HV, K, V] state slice
                      (initial_state + output_final_state), key-major layout
  gdn_dense_vfirst    same with state_v_first=True (value-major)
  kda_indexed         fused_recurrent_kda_fwd with ssm_state_indices, in place

Timing: the --iters launches are captured in one CUDA graph and replayed;
median of --reps replays. Bytes = 2 x fp32 state bytes (read + write), as
for our kernels. FLA comes from the fla-core wheel carried to the machine
(never committed). Prints RESULT lines parsed by the report script.
"""
import argparse
import math
import sys

import torch


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="1,8,32,64,128,256,512")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--pool_mib", type=int, default=3072)
    p.add_argument("--variants", default="gdn_gather_scatter,gdn_dense_kmajor,gdn_dense_vfirst,kda_indexed")
    return p.parse_args()


def time_graph(fn, iters, reps):
    """Median microseconds per call of fn(i), i = 0..iters-1, as a CUDA graph."""
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for i in range(2):
                fn(i)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(iters):
                fn(i)
        run = g.replay
        mode = "graph"
    except Exception as e:  # fall back to eager launches
        print(f"# graph capture failed ({e!r}); timing eager launches", file=sys.stderr)
        torch.cuda.synchronize()

        def run():
            for i in range(iters):
                fn(i)
        mode = "eager"
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / iters)
    times.sort()
    return times[len(times) // 2], mode


def main():
    args = parse()
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    dev = torch.device("cuda")
    print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
    HV, K, V = 32, 128, 128
    state_bytes_per_slot = HV * K * V * 4
    batches = [int(x) for x in args.batches.split(",")]
    variants = args.variants.split(",")
    max_b = max(batches)
    P = max(2 * max_b, args.pool_mib * (1 << 20) // state_bytes_per_slot)
    pool = torch.randn(P, HV, K, V, device=dev, dtype=torch.float32) * 0.1
    torch.manual_seed(0)
    for B in batches:
        sets = P // B
        idx_sets = [torch.arange(s * B, (s + 1) * B, device=dev, dtype=torch.int64) for s in range(sets)]
        idx32_sets = [x.to(torch.int32) for x in idx_sets]
        for variant in variants:
            kda = variant.startswith("kda")
            H = HV if kda else 16
            q = torch.nn.functional.normalize(torch.randn(B, 1, H, K, device=dev), dim=-1).to(torch.bfloat16)
            k = torch.nn.functional.normalize(torch.randn(B, 1, H, K, device=dev), dim=-1).to(torch.bfloat16)
            v = torch.randn(B, 1, HV, V, device=dev).to(torch.bfloat16)
            beta = torch.rand(B, 1, HV, device=dev) * 0.6 + 0.2
            if kda:
                g = -0.3 * torch.rand(B, 1, HV, K, device=dev)
            else:
                g = -0.3 * torch.rand(B, 1, HV, device=dev)
            vfirst_pool = None

            if variant == "gdn_gather_scatter":
                def fn(i):
                    idx = idx_sets[i % sets]
                    h0 = pool.index_select(0, idx)
                    o, ht = fused_recurrent_gated_delta_rule(
                        q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True)
                    pool.index_copy_(0, idx, ht)
            elif variant in ("gdn_dense_kmajor", "gdn_dense_vfirst"):
                vf = variant == "gdn_dense_vfirst"

                def fn(i):
                    s = i % sets
                    h0 = pool[s * B:(s + 1) * B]
                    o, ht = fused_recurrent_gated_delta_rule(
                        q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                        state_v_first=vf)
            elif variant == "kda_indexed":
                out = torch.empty_like(v)

                def fn(i):
                    fused_recurrent_kda_fwd(
                        q, k, v, g, beta, initial_state=pool, output_final_state=False,
                        inplace_final_state=True, ssm_state_indices=idx32_sets[i % sets], out=out)
            else:
                print("unknown variant", variant, file=sys.stderr)
                continue
            try:
                us, mode = time_graph(fn, args.iters, args.reps)
            except Exception as e:
                print(f"RESULT_FAIL variant={variant} B={B} error={e!r}")
                continue
            sb = 2.0 * B * state_bytes_per_slot
            print(f"RESULT arch={'kda' if kda else 'gdn'} format=fla:{variant} B={B} us={us:.2f} "
                  f"state_bytes={sb:.0f} mode={mode}", flush=True)
        del idx_sets, idx32_sets


if __name__ == "__main__":
    main()
