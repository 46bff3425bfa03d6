#!/usr/bin/env python3
"""statecache.integrations on the H200 (issue 27), against a statecached
--backend=cuda it starts, from the bundle of tests/integrations/stage_device.sh
(run by tests/integrations/device_run.sh; FLA from the carried wheels):

    python3 tests/integrations/fla_check.py --dir /tmp/sc_integrations

Per FLA model (gdn-tiny, kda-tiny; FLA's model classes, fp32 compute from the
bf16 weights):
  - golden logits (shared/models/*/golden.safetensors) of the stock FLA model;
  - held-out corpus (6 x 2048 bytes, shared/corpus/heldout.jsonl), teacher
    forced, batch of the 6 documents, bits/byte and greedy agreement:
    stock FLA one forward, stock FLA token by token (FLA cache, FP32 states),
    and through StatecacheFLACache with fp32 / damp:16 (calibrated inside the
    runtime: trajectories recorded from FLA's own forward over
    calibration.jsonl, Calibrate RPC) / int8-hadamard states, in two regimes:
    decode (every byte a decode op) and prefill+decode (the first 256 bytes
    through the prefill op, then decode). fp32 must be within 1e-5 bits/byte
    of stock FLA's token-by-token run with 100% agreement; damp:16 and
    int8-hadamard are compared with the C++ reference worker's figures for
    the same documents (docs/BENCHMARKS.md "Format sweep"; within 0.05
    points of agreement);
  - multi-turn (gdn-tiny, fp32 and damp:16): end_turn / begin_turn, also from
    a new cache object, greedy equal to the uninterrupted run;
  - bad input on the CUDA pool: a CPU model / CPU tensors / CPU states, more
    rows than slots -> InvalidArgument naming the argument, states unchanged.
A tiny Qwen3-Next through statecache.integrations.transformers on CUDA:
fp32 greedy tokens equal to stock transformers (FLA's kernels), a CPU model
for a CUDA pool refused.
Prints PASS / FAIL / INFO / RESULT lines; exit 1 on failure, 2 on set-up errors.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness as H  # noqa: E402

# The C++ reference worker on the same documents (docs/BENCHMARKS.md, format
# sweep, CPU backend): (excess bits/byte, greedy agreement %) per regime.
REFERENCE = {
    ("gdn-tiny", "damp:16", "decode"): (0.00038, 99.49),
    ("gdn-tiny", "damp:16", "prefill+decode"): (0.00003, 99.56),
    ("gdn-tiny", "int8-hadamard", "decode"): (0.00068, 99.54),
    ("gdn-tiny", "int8-hadamard", "prefill+decode"): (0.00079, 99.50),
    ("kda-tiny", "damp:16", "decode"): (0.00007, 99.75),
    ("kda-tiny", "damp:16", "prefill+decode"): (0.00012, 99.79),
    ("kda-tiny", "int8-hadamard", "decode"): (0.00094, 99.50),
    ("kda-tiny", "int8-hadamard", "prefill+decode"): (0.00087, 99.57),
}
PREFILL = 256


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", default="/tmp/sc_integrations")
    p.add_argument("--shared", default="/tmp/sc_integrations/shared",
                   help="models/ and corpus/ (the bundle's copy of ../shared)")
    p.add_argument("--models", default="gdn-tiny,kda-tiny")
    p.add_argument("--formats", default="fp32,damp:16,int8-hadamard")
    p.add_argument("--regimes", default="decode,prefill+decode")
    p.add_argument("--skip", default="", help="comma list of: golden,eval,multiturn,bad,hf")
    return p.parse_args()


def corpus(shared, name):
    docs = []
    with open(os.path.join(shared, "corpus", name)) as f:
        for line in f:
            d = json.loads(line)
            docs.append((d["domain"], list(d["text"].encode("latin-1"))))
    return docs


def load_fla(torch, shared, name):
    from safetensors.torch import load_file
    from fla.models import (GatedDeltaNetConfig, GatedDeltaNetForCausalLM, KDAConfig,
                            KDAForCausalLM)
    d = os.path.join(shared, "models", name)
    cfg = json.load(open(os.path.join(d, "config.json")))
    C, M = (KDAConfig, KDAForCausalLM) if cfg["model_type"] == "kda" else \
        (GatedDeltaNetConfig, GatedDeltaNetForCausalLM)
    m = M(C(**cfg))
    m.load_state_dict(load_file(os.path.join(d, "model.safetensors")))
    return m.float().cuda().eval(), d


def score(torch, logits, ids):
    """(total NLL bits, predicted bytes, argmax [B, T-1]) of teacher-forced logits."""
    lp = torch.log_softmax(logits[:, :-1].double(), -1)
    nll = -lp.gather(-1, ids[:, 1:, None]).squeeze(-1).sum() / math.log(2)
    return float(nll), ids[:, 1:].numel(), logits[:, :-1].argmax(-1)


def stepwise(torch, model, ids, cache, prefill=0):
    """Teacher-forced logits [B, T, V]: `prefill` tokens in one forward, then one by one."""
    outs = []
    with torch.no_grad():
        if prefill:
            outs.append(model(input_ids=ids[:, :prefill], past_key_values=cache,
                              use_cache=True).logits)
        for t in range(prefill, ids.shape[1]):
            outs.append(model(input_ids=ids[:, t:t + 1], past_key_values=cache,
                              use_cache=True).logits)
    return torch.cat(outs, 1)


def eval_model(torch, sc, scf, c, name, model, args):
    held = corpus(args.shared, "heldout.jsonl")
    ids = torch.tensor([d for _, d in held], device="cuda")
    from fla.models.utils import Cache
    with torch.no_grad():
        nll, n, _ = score(torch, model(input_ids=ids).logits, ids)
    H.info(f"{name} stock FLA one forward: {nll / n:.5f} bits/byte over {n} bytes")
    t0 = time.time()
    ref_logits = stepwise(torch, model, ids, Cache())
    ref_nll, _, ref_arg = score(torch, ref_logits, ids)
    ref_bpb = ref_nll / n
    H.info(f"{name} stock FLA token by token (FP32 states): {ref_bpb:.5f} bits/byte "
           f"({time.time() - t0:.1f} s)")
    H.report(f"[{name}] stock token by token == one forward within 1e-4 bits/byte",
             abs(ref_bpb - nll / n) < 1e-4, f"{ref_bpb:.6f} vs {nll / n:.6f}")
    cal = corpus(args.shared, "calibration.jsonl")
    for fmt in args.formats.split(","):
        mid = f"{name}-{fmt}".replace(":", "_")   # model ids: [A-Za-z0-9._-]
        if fmt.startswith("damp"):
            t0 = time.time()
            states, res = scf.calibrate(c, model, [torch.tensor(d) for _, d in cal], mid, fmt,
                                        slots=len(held) + 2, checkpoints=4,
                                        domains=[dom for dom, _ in cal])
            from statecache.integrations._slots import layout_key_perm
            perm = layout_key_perm(res.layout_file)
            ident = torch.arange(perm.shape[-1], dtype=perm.dtype).expand_as(perm)
            H.info(f"{name} {fmt}: calibrated in the runtime on {res.tokens} tokens "
                   f"({res.samples} samples, {time.time() - t0:.1f} s); "
                   f"{float((perm != ident).float().mean()) * 100:.1f}% of key rows moved")
        else:
            states = scf.register_model(c, mid, model, fmt, slots=len(held) + 2, checkpoints=4)
        info = c.describe_model(mid)
        H.info(f"{name} {fmt}: {info.slot_bytes} bytes per slot ({info.fp32_slot_bytes} in fp32)")
        for regime in args.regimes.split(","):
            t0 = time.time()
            with scf.StatecacheFLACache(model, states, batch_size=len(held)) as cache:
                logits = stepwise(torch, model, ids, cache,
                                  PREFILL if regime == "prefill+decode" else 0)
            got, _, arg = score(torch, logits, ids)
            bpb = got / n
            agree = float((arg == ref_arg).double().mean()) * 100
            print(f"RESULT fla model={name} format={fmt} regime={regime} bits_per_byte={bpb:.6f} "
                  f"excess={bpb - ref_bpb:+.6f} agreement={agree:.2f} "
                  f"seconds={time.time() - t0:.1f}", flush=True)
            if fmt == "fp32":
                H.report(f"[{name} fp32 {regime}] within 1e-5 bits/byte of stock FLA, 100% greedy",
                         abs(bpb - ref_bpb) < 1e-5 and agree == 100.0,
                         f"{bpb - ref_bpb:+.2e}, {agree:.2f}%")
            elif (name, fmt, regime) in REFERENCE:
                ex, ag = REFERENCE[(name, fmt, regime)]
                H.report(f"[{name} {fmt} {regime}] agreement within 0.05 points of the C++ "
                         f"reference worker", abs(agree - ag) <= 0.05,
                         f"{agree:.2f}% vs {ag:.2f}% (excess {bpb - ref_bpb:+.5f} vs {ex:+.5f})")
        c.drop_model(mid)


def multiturn(torch, sc, scf, c, model, args):
    held = corpus(args.shared, "heldout.jsonl")
    doc = held[0][1]
    users = [torch.tensor([doc[:100]]), torch.tensor([doc[200:230]]),
             torch.tensor([doc[400:420]])]

    def turns(cache_for, interrupt):
        cache = cache_for()
        ids, outs = users[0].cuda(), []
        for i, u in enumerate(users):
            if i:
                ids = torch.cat([outs[-1], u.cuda()], 1)
                if interrupt:
                    if interrupt == "new":
                        cache.close()
                        cache = cache_for()
                    cache.begin_turn(ids)
            with torch.no_grad():
                outs.append(model.generate(ids, past_key_values=cache, max_new_tokens=24,
                                           do_sample=False))
            if interrupt and i + 1 < len(users):
                cache.end_turn(outs[-1])
        if hasattr(cache, "close"):   # FLA's own Cache has no close()
            cache.close()
        return outs

    for fmt in ("fp32", "damp:16"):
        states = scf.register_model(c, f"mt-{fmt}".replace(":", "_"), model, fmt, slots=2, checkpoints=8)
        straight = turns(lambda: scf.StatecacheFLACache(model, states), None)
        for mode in ("same", "new"):
            got = turns(lambda: scf.StatecacheFLACache(model, states), mode)
            H.report(f"[gdn-tiny {fmt}] multi-turn restore ({mode} cache) == uninterrupted",
                     all(torch.equal(a, b) for a, b in zip(straight, got)))
        if fmt == "fp32":
            from fla.models.utils import Cache
            stock = turns(lambda: Cache(), None)
            H.report("[gdn-tiny fp32] uninterrupted multi-turn == stock FLA",
                     all(torch.equal(a, b) for a, b in zip(straight, stock)))
        c.drop_model(f"mt-{fmt}".replace(":", "_"))


def bad_input(torch, sc, scf, c, model):
    states = scf.register_model(c, "bad", model, "fp32", slots=2, checkpoints=2)
    with scf.StatecacheFLACache(model, states, batch_size=2) as cache:
        with torch.no_grad():
            model(input_ids=torch.randint(0, 256, (2, 8), device="cuda"), past_key_values=cache,
                  use_cache=True)
        before = cache.read_states().clone()
        H.expect("more rows than slots -> InvalidArgument", sc.InvalidArgument,
                 "input_ids: 3 sequences; this StatecacheFLACache holds 2",
                 lambda: model(input_ids=torch.randint(0, 256, (3, 4), device="cuda"),
                               past_key_values=cache, use_cache=True))
        geo = states.geometry
        x = torch.randn(2, 1, geo.h_qk, geo.d_k)
        v = torch.randn(2, 1, geo.h_v, geo.d_v)
        g, beta = -torch.rand(2, 1, geo.h_v), torch.rand(2, 1, geo.h_v)
        H.expect("CPU query for the CUDA pool -> InvalidArgument", sc.InvalidArgument,
                 "query: on cpu", lambda: cache._batch.op_inputs(x, x.cuda(), v.cuda(),
                                                                 g.cuda(), beta.cuda()))
        H.expect("CPU states for the CUDA pool -> InvalidArgument", sc.InvalidArgument,
                 "states: on cpu", lambda: cache.write_states(before.cpu()))
        H.expect("non-contiguous states -> InvalidArgument", sc.InvalidArgument,
                 "states: not contiguous",
                 lambda: cache.write_states(before.transpose(3, 4).contiguous().transpose(3, 4)))
        H.expect("bf16 states -> InvalidArgument", sc.InvalidArgument, "states: dtype",
                 lambda: cache.write_states(before.bfloat16()))
        H.report("bad input changed no state", torch.equal(cache.read_states(), before))
    import copy
    cpu_model = copy.deepcopy(model).cpu()
    H.expect("a CPU model for the CUDA pool -> InvalidArgument", sc.InvalidArgument,
             "model: on cpu", lambda: scf.StatecacheFLACache(cpu_model, states))
    c.drop_model("bad")


def hf_on_cuda(torch, sc, c):
    import transformers
    from statecache.integrations import transformers as sch
    cfg = transformers.Qwen3NextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=64, linear_value_head_dim=64, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, initializer_range=0.15)
    torch.manual_seed(0)
    m = transformers.Qwen3NextForCausalLM(cfg).eval()
    states = sch.register_model(c, "hf-tiny", m, "fp32", slots=2, checkpoints=2)
    H.expect("transformers: a CPU model for the CUDA pool -> InvalidArgument",
             sc.InvalidArgument, "model: on cpu",
             lambda: sch.StatecacheCache(m, states, batch_size=2))
    m = m.cuda()
    ids = torch.randint(1, 256, (2, 12), device="cuda")
    with torch.no_grad():
        want = m.generate(ids, max_new_tokens=16, do_sample=False)
        with sch.StatecacheCache(m, states, batch_size=2) as cache:
            got = m.generate(ids, past_key_values=cache, max_new_tokens=16, do_sample=False)
    H.report("transformers Qwen3-Next on CUDA: fp32 greedy == stock", torch.equal(got, want),
             f"{int((got != want).sum())} tokens differ")
    c.drop_model("hf-tiny")


def main():
    args = parse()
    skip = set(filter(None, args.skip.split(",")))
    try:
        H.setup_paths(args.dir)
        import torch
        import statecache as sc
        from statecache.integrations import fla as scf
        server = H.Server(os.path.join(args.dir, "statecached"), 24 << 30, 4 << 30)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 2
    try:
        c = sc.Client(server.target, timeout=600)
        c.wait_ready(30)
        H.info(f"torch {torch.__version__} {torch.cuda.get_device_name()}; server {server.target}")
        for name in args.models.split(","):
            model, d = load_fla(torch, args.shared, name)
            if "golden" not in skip:
                from safetensors.torch import load_file
                gold = load_file(os.path.join(d, "golden.safetensors"))
                with torch.no_grad():
                    lg = model(input_ids=gold["tokens"].long()[None].cuda()).logits[0].cpu()
                rel = float((lg - gold["logits"]).abs().max() / gold["logits"].abs().max())
                H.report(f"[{name}] stock FLA golden logits", rel < 1e-3, f"max|diff|/max|ref| "
                         f"= {rel:.2e}")
            if "eval" not in skip:
                eval_model(torch, sc, scf, c, name, model, args)
            if name == "gdn-tiny" and "multiturn" not in skip:
                multiturn(torch, sc, scf, c, model, args)
            if name == "gdn-tiny" and "bad" not in skip:
                bad_input(torch, sc, scf, c, model)
        if "hf" not in skip:
            hf_on_cuda(torch, sc, c)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        H.report("no exception", False)
    finally:
        rc = server.stop()
        H.info(f"statecached exit {rc}")
    return H.finish("fla_check")


if __name__ == "__main__":
    sys.exit(main())
