"""Model classes whose GDN state shape classmethods declare the pool's packed
bytes (vLLM sizes its hybrid pages from them, platforms/interface.py
_align_hybrid_block_size). Identical to vLLM's classes when the plugin is not
configured."""
from __future__ import annotations

import torch
from vllm.model_executor.models.qwen3_5 import (Qwen3_5ForConditionalGeneration,
                                                Qwen3_5MoeForConditionalGeneration)
from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM

from statecache_vllm import edge
from statecache_vllm.layout import placeholder_shape, rank_geometry


class _PackedStateMixin:
    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        shapes = super().get_mamba_state_shape_from_config(vllm_config)
        cfg = edge.plugin_config(vllm_config)
        if cfg is None:
            return shapes
        hf = vllm_config.model_config.hf_text_config
        geo = rank_geometry(hf.linear_num_key_heads, hf.linear_num_value_heads,
                            hf.linear_key_head_dim, hf.linear_value_head_dim,
                            vllm_config.parallel_config.tensor_parallel_size)
        return shapes[0], placeholder_shape(cfg.format, geo)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config):
        dtypes = super().get_mamba_state_dtype_from_config(vllm_config)
        if edge.plugin_config(vllm_config) is None:
            return dtypes
        return dtypes[0], torch.uint8


class StatecacheQwen3NextForCausalLM(_PackedStateMixin, Qwen3NextForCausalLM):
    pass


class StatecacheQwen3_5ForConditionalGeneration(_PackedStateMixin,
                                                Qwen3_5ForConditionalGeneration):
    pass


class StatecacheQwen3_5MoeForConditionalGeneration(_PackedStateMixin,
                                                   Qwen3_5MoeForConditionalGeneration):
    pass
