"""statecache_vllm: vLLM (0.26.0) plugin that keeps the Gated DeltaNet
recurrent states of Qwen3-Next / Qwen3.5 / Qwen3.6 in a statecache pool.

Entry point (pyproject.toml): vllm.general_plugins -> statecache_vllm:register.
register() runs in every vLLM process; it replaces QwenGatedDeltaNetAttention
(PluggableLayer.register_oot) and the three model classes' state-shape
classmethods (ModelRegistry). Nothing changes unless the plugin is
configured (README.md: additional_config["statecache"] or $STATECACHE_VLLM).
"""
from __future__ import annotations

VLLM_VERSION = "0.26.0"

# Architectures whose GDN state shape the plugin re-declares (the model
# classes' classmethods size vLLM's pages before any layer exists).
ARCHITECTURES = {
    "Qwen3NextForCausalLM": "statecache_vllm.vllm_models:StatecacheQwen3NextForCausalLM",
    "Qwen3_5ForConditionalGeneration":
        "statecache_vllm.vllm_models:StatecacheQwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration":
        "statecache_vllm.vllm_models:StatecacheQwen3_5MoeForConditionalGeneration",
}

_registered = False


def register() -> None:
    """vLLM general-plugin hook (idempotent). RuntimeError on another vLLM
    version: the plugin overrides internals pinned to 0.26.0."""
    global _registered
    if _registered:
        return
    import vllm
    if vllm.__version__.split("+")[0] != VLLM_VERSION:
        raise RuntimeError(f"statecache_vllm is pinned to vllm=={VLLM_VERSION}; found "
                           f"{vllm.__version__}")
    from vllm import ModelRegistry
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
        QwenGatedDeltaNetAttention)

    from statecache_vllm.vllm_gdn import StatecacheGDNAttention

    if op_registry_oot.get("QwenGatedDeltaNetAttention") is not StatecacheGDNAttention:
        QwenGatedDeltaNetAttention.register_oot(StatecacheGDNAttention)
    for arch, path in ARCHITECTURES.items():
        ModelRegistry.register_model(arch, path)
    _registered = True
