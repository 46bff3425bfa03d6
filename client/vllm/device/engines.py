"""Acceptance runs of issue 28 on the GPU, one engine configuration per
process (run.sh starts one per line):

    python3 engines.py tiny  --mode stock|plugin [--format fp32] --out tokens.json
    python3 engines.py prefix --mode stock|plugin [--format fp32] --out tokens.json
    python3 engines.py bench --mode stock|plugin [--format damp:16] --out bench.json

Models are built from a config.json written here (no download, no
tokenizer: prompts are token ids, skip_tokenizer_init):
  tiny   Qwen3-Next, vocab 256, 3 GDN + 1 full-attention layer, GDN heads 2 / 4
         of 128 x 128, MoE of 4 experts; vLLM's dummy load, then every weight
         re-drawn from a seed per parameter name (N(0, 1/fan_in), norms 1,
         A_log = log U(1, 16), dt_bias 1) so logits are far from ties and both
         modes see the same weights. 32 prompts of 16..47 tokens, greedy,
         48 new tokens; writes the token ids.
  prefix the tiny model with prefix caching on (vLLM's align mode): 8 prompts
         sharing a 1,200-token prefix, generated twice; writes both passes.
  bench  Qwen3.6-35B-A3B geometry on the Qwen3-Next architecture: hidden
         2048, 40 layers (30 GDN + 10 full attention, every 4th), GDN 16 key /
         32 value heads of 128 x 128, attention 16 q / 2 kv heads of 256, MoE
         256 experts top-8 (moe_intermediate 512, shared expert 512), vocab
         248320; vLLM dummy weights. For B in --batches: input 256 random ids,
         output 64 (ignore_eos), TPOT = (t(64 tokens) - t(1 token)) / 63 wall
         clock after a warm-up of the 64-token generation, --repeats times
         (tpot_ms: the median run; tpot_runs_ms: every run). Also the KV-cache
         sizing vLLM reports (blocks, block size, concurrency for 320 tokens).
Both: stock = vLLM's own GDN with mamba_ssm_cache_dtype=float32; plugin =
additional_config["statecache"] with --storage pages (statecache's ops over
vLLM's own pages) or server (a spawned statecached), --prefill statecache
(statecache's prefill op) or runtime (vLLM's chunk kernel between unpack and
pack). Prefix caching off,
gdn_prefill_backend triton (no FlashInfer here). Prints one JSON line
"RESULT {...}" and writes it to --out.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
import tempfile
import time

TINY = dict(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=1, head_dim=64,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128,
            linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=128,
            shared_expert_intermediate_size=128, max_position_embeddings=4096)
QWEN36 = dict(vocab_size=248320, hidden_size=2048, intermediate_size=5120, num_hidden_layers=40,
              num_attention_heads=16, num_key_value_heads=2, head_dim=256,
              linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
              linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=256,
              num_experts_per_tok=8, moe_intermediate_size=512,
              shared_expert_intermediate_size=512, max_position_embeddings=4096)


def write_model(dirname: str, geo: dict) -> str:
    layers = geo["num_hidden_layers"]
    cfg = dict(geo, architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next",
               hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False,
               torch_dtype="bfloat16", decoder_sparse_step=1, mlp_only_layers=[],
               norm_topk_prob=True, rope_theta=10000.0, partial_rotary_factor=0.25,
               layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                            for i in range(layers)],
               bos_token_id=1, eos_token_id=2)
    os.makedirs(dirname, exist_ok=True)
    with open(os.path.join(dirname, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return dirname


def redraw_weights(model, on_device: bool = False) -> int:
    """Deterministic, well-scaled weights (see the module comment); returns
    the number of parameters redrawn. on_device draws on each parameter's
    device (the bench's billions of parameters; deterministic per device)."""
    import torch
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") >> 1
            dev = p.device if on_device else torch.device("cpu")
            gen = torch.Generator(device=dev).manual_seed(seed)
            if name.endswith("A_log"):
                x = torch.log(1 + 15 * torch.rand(p.shape, generator=gen, device=dev))
            elif name.endswith("dt_bias"):
                x = torch.ones(p.shape)
            elif p.dim() == 1:
                x = torch.ones(p.shape) if "norm" in name else torch.zeros(p.shape)
            else:
                fan_in = p.shape[-1] if p.dim() >= 2 else 1
                x = torch.randn(p.shape, generator=gen, device=dev) / math.sqrt(fan_in)
                if "embed" in name:
                    x = torch.randn(p.shape, generator=gen, device=dev)
            p.data.copy_(x.to(p.dtype))
            n += 1
    return n


def engine(args, model_dir: str, *, max_len: int, kv_bytes: int, capture_sizes,
           prefix_caching: bool = False):
    from vllm import LLM
    extra = {"gdn_prefill_backend": "triton"}
    kw = {}
    if args.mode == "plugin":
        extra["statecache"] = {"format": args.format, "storage": args.storage,
                               "prefill": args.prefill, "check_every": args.check_every}
        if args.storage == "server":
            extra["statecache"]["statecached"] = args.statecached
    else:
        kw["mamba_ssm_cache_dtype"] = "float32"
    comp = {"cudagraph_capture_sizes": capture_sizes}
    if args.cudagraph == "full-decode":   # no torch.compile: FULL graphs of decode steps
        comp.update(mode=0, cudagraph_mode="FULL_DECODE_ONLY")
    elif args.cudagraph == "eager":
        kw["enforce_eager"] = True
    if prefix_caching:   # vLLM's default with prefix caching is "all"; the plugin serves "align"
        kw["mamba_cache_mode"] = "align"
    return LLM(model=model_dir, skip_tokenizer_init=True, load_format="dummy",
               dtype="bfloat16", enable_prefix_caching=prefix_caching, max_model_len=max_len,
               max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.batched_tokens,
               kv_cache_memory_bytes=kv_bytes, compilation_config=comp,
               additional_config=extra, seed=0, **kw)


def kv_sizing(llm) -> dict:
    c = llm.llm_engine.vllm_config.cache_config
    return {"num_gpu_blocks": c.num_gpu_blocks, "block_size": c.block_size,
            "mamba_page_size_padded": c.mamba_page_size_padded}


def run_tiny(args, workdir):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    model = write_model(os.path.join(workdir, "tiny"), TINY)
    llm = engine(args, model, max_len=256, kv_bytes=256 << 20, capture_sizes=[1, 2, 4, 8, 16, 32])
    redrawn = llm.apply_model(redraw_weights)
    prompts = [TokensPrompt(prompt_token_ids=[(7 * i + 13 * j + 3) % 253 + 3
                                              for j in range(16 + i)]) for i in range(32)]
    sp = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, detokenize=False)
    t0 = time.time()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    return {"kind": "tiny", "mode": args.mode, "format": args.format, "storage": args.storage,
            "prefill": args.prefill, "redrawn": redrawn,
            "tokens": tokens, "generate_s": round(time.time() - t0, 3), **kv_sizing(llm)}


def run_prefix(args, workdir):
    """Prefix caching (vLLM's align mode): 8 prompts sharing a 1,200-token
    prefix, each with its own 16-token suffix, generated twice (greedy, 16
    new tokens); the second pass finds the prefix's states cached in vLLM's
    blocks. Writes both passes' tokens."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    model = write_model(os.path.join(workdir, "tiny"), TINY)
    llm = engine(args, model, max_len=2048, kv_bytes=512 << 20, capture_sizes=[1, 2, 4, 8],
                 prefix_caching=True)
    llm.apply_model(redraw_weights)
    prefix = [(11 * j + 5) % 251 + 3 for j in range(1200)]
    prompts = [TokensPrompt(prompt_token_ids=prefix + [(3 * i + 7 * j) % 251 + 3
                                                       for j in range(16)]) for i in range(8)]
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, detokenize=False)
    passes = []
    for _ in range(2):
        outs = llm.generate(prompts, sp, use_tqdm=False)
        passes.append([list(o.outputs[0].token_ids) for o in outs])
    return {"kind": "prefix", "mode": args.mode, "format": args.format, "storage": args.storage,
            "tokens": passes[1], "first_pass": passes[0], **kv_sizing(llm)}


def run_bench(args, workdir):
    import torch
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    model = write_model(os.path.join(workdir, "qwen36"), dict(QWEN36, num_experts=args.num_experts))
    batches = [int(b) for b in args.batches.split(",")]
    llm = engine(args, model, max_len=320, kv_bytes=args.kv_gib << 30, capture_sizes=batches)
    llm.apply_model(lambda m: redraw_weights(m, on_device=True))   # dummy weights give NaN
    gen = torch.Generator().manual_seed(0)
    res = {"kind": "bench", "mode": args.mode, "format": args.format, "storage": args.storage,
           "prefill": args.prefill, "tpot_ms": {},
           "cudagraph": args.cudagraph, "kv_cache_memory_bytes": args.kv_gib << 30,
           **kv_sizing(llm)}

    def timed(b, out_tokens):
        prompts = [TokensPrompt(prompt_token_ids=torch.randint(3, 240000, (256,),
                                                               generator=gen).tolist())
                   for _ in range(b)]
        sp = SamplingParams(temperature=0.0, max_tokens=out_tokens, min_tokens=out_tokens,
                            ignore_eos=True, detokenize=False)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        dt = time.perf_counter() - t0
        assert all(len(o.outputs[0].token_ids) == out_tokens for o in outs)
        return dt

    res["tpot_runs_ms"] = {}
    for b in batches:
        # Warm-up with the timed generation itself: chunked prefill mixes token
        # counts into decode steps that a short warm-up never has, and vLLM
        # JIT-compiles Triton kernels (fused MoE, ...) on the first of each.
        timed(b, 64)
        runs = []
        for _ in range(args.repeats):
            t1 = timed(b, 1)
            t64 = timed(b, 64)
            runs.append(round((t64 - t1) / 63 * 1e3, 3))
            print(f"PROGRESS bench {args.mode} B={b} t1={t1:.3f}s t64={t64:.3f}s "
                  f"tpot={runs[-1]} ms", flush=True)
        res["tpot_runs_ms"][str(b)] = runs
        res["tpot_ms"][str(b)] = sorted(runs)[len(runs) // 2]   # the median run
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["tiny", "prefix", "bench"])
    p.add_argument("--mode", choices=["stock", "plugin"], required=True)
    p.add_argument("--format", default="fp32")
    p.add_argument("--storage", choices=["pages", "server"], default="pages")
    p.add_argument("--prefill", choices=["statecache", "runtime"], default="statecache")
    p.add_argument("--statecached", default="/tmp/sc_vllm/sc/statecached")
    p.add_argument("--check_every", type=int, default=16)
    p.add_argument("--cudagraph", choices=["default", "full-decode", "eager"], default="default")
    p.add_argument("--batches", default="1,16,64,128,256")
    p.add_argument("--kv_gib", type=int, default=24)
    p.add_argument("--num_experts", type=int, default=QWEN36["num_experts"],
                   help="bench: routed experts per MoE layer (256 = Qwen3.6-35B-A3B, 70 GB of "
                        "bf16 weights: fewer to fit an 80 GB card beside the KV budget)")
    p.add_argument("--repeats", type=int, default=3, help="bench: timed runs per batch size")
    p.add_argument("--max_num_seqs", type=int, default=256)
    p.add_argument("--batched_tokens", type=int, default=16384)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    workdir = tempfile.mkdtemp(prefix="sc-vllm-")
    t0 = time.time()
    res = {"tiny": run_tiny, "prefix": run_prefix, "bench": run_bench}[args.kind](args, workdir)
    res["wall_s"] = round(time.time() - t0, 1)
    with open(args.out, "w") as f:
        json.dump(res, f)
    short = {k: v for k, v in res.items() if k != "tokens"}
    print("RESULT " + json.dumps(short), flush=True)


if __name__ == "__main__":
    sys.exit(main())
