#!/usr/bin/env python3
"""One decode step of a transformers Qwen3-Next at Qwen3.6-35B-A3B's
linear-attention geometry (30 GDN layers, 16 key / 32 value heads of 128 x
128, hidden 2048), random bf16 weights, on the H200 (issue 27). Fewer of the
other layers than the real model: 2 full-attention layers (the real one has
10) and a dense 512-wide MLP instead of the MoE, so the step time is mostly
the token mixers. Per batch B (default 1, 64, 256): an 8-token prompt, then
--steps decode steps timed with CUDA events (median), with

  stock        transformers' DynamicCache (FP32 states [B, 32, 128, 128] per
               layer; FLA's kernels when installed, else the torch reference)
  statecache   StatecacheCache with the states in statecached slots of each
               --formats entry (damp:16: identity layout; its speed does not
               depend on the maps), decode through statecache.torch.decode

and the recurrent-state memory per sequence each holds (conv windows, the
same in both, listed separately). Bundle and server as fla_check.py.

    python3 tests/integrations/decode_step_bench.py --dir /tmp/sc_integrations

Prints "RESULT decode_step ..." lines.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness as H  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", default="/tmp/sc_integrations")
    p.add_argument("--batches", default="1,64,256")
    p.add_argument("--formats", default="damp:16,fp32")
    p.add_argument("--steps", type=int, default=20)
    return p.parse_args()


def model_at_qwen36(torch, transformers):
    types = (["linear_attention"] * 15 + ["full_attention"]) * 2
    cfg = transformers.Qwen3NextConfig(
        vocab_size=4096, hidden_size=2048, intermediate_size=512, num_hidden_layers=len(types),
        layer_types=types, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=0,
        mlp_only_layers=list(range(len(types))), max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = transformers.Qwen3NextForCausalLM(cfg)
    return m.to(torch.bfloat16).eval()


def time_steps(torch, model, cache, b, steps):
    """Median ms of one decode step (model forward of one token per row)."""
    ids = torch.randint(0, 4096, (b, 8), device="cuda")
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(steps + 3):
            a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            e.record()
            tok = out.logits[:, -1:].argmax(-1)
            e.synchronize()
            times.append(a.elapsed_time(e))
    times = sorted(times[3:])
    return times[len(times) // 2]


def main():
    args = parse()
    try:
        H.setup_paths(args.dir)
        import torch
        import transformers
        import statecache as sc
        from statecache.integrations import transformers as sch
        server = H.Server(os.path.join(args.dir, "statecached"), 24 << 30, 1 << 30)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 2
    try:
        c = sc.Client(server.target, timeout=600)
        c.wait_ready(30)
        model = model_at_qwen36(torch, transformers)
        gdn = [i for i, t in enumerate(model.config.layer_types) if t == "linear_attention"]
        from transformers.models.qwen3_next import modeling_qwen3_next as mq
        kernel = getattr(mq.torch_recurrent_gated_delta_rule, "_statecache_original",
                         mq.torch_recurrent_gated_delta_rule)
        H.info(f"model: {len(model.config.layer_types)} layers ({len(gdn)} GDN), "
               f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B params, bf16; "
               f"stock recurrence: {kernel.__module__}.{kernel.__name__}")
        batches = [int(b) for b in args.batches.split(",")]
        for b in batches:
            cache = transformers.DynamicCache(config=model.config)
            ms = time_steps(torch, model, cache, b, args.steps)
            state = sum(cache.layers[i].recurrent_states[0].nbytes for i in gdn) / b
            conv = sum(cache.layers[i].conv_states[0].nbytes for i in gdn) / b
            print(f"RESULT decode_step runtime=stock B={b} ms_per_step={ms:.3f} "
                  f"state_bytes_per_seq={int(state)} conv_bytes_per_seq={int(conv)}", flush=True)
            del cache
            torch.cuda.empty_cache()
        for fmt in args.formats.split(","):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # damp without a layout: identity maps
                states = sch.register_model(c, f"q36-{fmt.replace(':', '-')}", model, fmt, slots=max(batches),
                                            checkpoints=1)
            slot = c.describe_model(states.model_id).slot_bytes
            for b in batches:
                with sch.StatecacheCache(model, states, batch_size=b, check=False) as cache:
                    ms = time_steps(torch, model, cache, b, args.steps)
                    cache._batch.check()
                    conv = sum(cache.layers[i].conv_states[0].nbytes for i in gdn) / b
                print(f"RESULT decode_step runtime=statecache format={fmt} B={b} "
                      f"ms_per_step={ms:.3f} state_bytes_per_seq={slot} "
                      f"conv_bytes_per_seq={int(conv)}", flush=True)
            c.drop_model(states.model_id)
        H.report("decode_step_bench ran", True)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        H.report("no exception", False)
    finally:
        H.info(f"statecached exit {server.stop()}")
    return H.finish("decode_step_bench")


if __name__ == "__main__":
    sys.exit(main())
