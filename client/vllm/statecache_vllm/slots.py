"""How vLLM's mamba block ids and GDN layers map onto the statecache pool.

vLLM (0.26, hybrid KV cache manager) keeps one BlockPool for every KV-cache
group: attention groups and the G mamba groups draw block ids from the same
range [0, num_blocks), and an id is held by at most one group at a time.
Layers at the same position j of different groups share one KV tensor (raw
tensor j); block 0 is the null block (padding rows of a CUDA graph batch
point at it).

So one statecache model per rank with
  layers = the number of distinct GDN positions (tensors), and
  num_blocks - 1 slots, slot of block b = handle b - 1 (b >= 1),
mirrors vLLM's memory exactly: block b held by mamba group g stores the states
of g's layers in slot b, layer j = the GDN layer's position. Both maps are
fixed for the engine's life, so the index tensor is built once and a CUDA
graph reads it by address.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

NULL_BLOCK_ID = 0
PAD = -1


def position_layers(layer_ptrs: Sequence[Tuple[str, int]]) -> Tuple[Dict[str, int], int]:
    """statecache layer index of each GDN layer from (layer name, data_ptr of
    its state tensor) in model order: layers on one tensor (same pointer) share
    an index, a new pointer takes the next one. Returns ({name: index},
    number of indices)."""
    index_of_ptr: Dict[int, int] = {}
    out: Dict[str, int] = {}
    for name, ptr in layer_ptrs:
        if name in out:
            raise ValueError(f"layer {name!r} listed twice")
        out[name] = index_of_ptr.setdefault(int(ptr), len(index_of_ptr))
    return out, len(index_of_ptr)


def check_same_group_positions(groups: Sequence[Sequence[str]], index: Dict[str, int]) -> None:
    """Layers of one KV-cache group must have distinct indices (they hold
    states of one request at the same time); ValueError naming the pair."""
    for g in groups:
        seen: Dict[int, str] = {}
        for name in g:
            j = index[name]
            if j in seen:
                raise ValueError(f"layers {seen[j]!r} and {name!r} of one KV-cache group share "
                                 f"state tensor {j}: cannot map them to one slot")
            seen[j] = name


def slots_needed(num_blocks: int) -> int:
    """Slots the pool allocates for vLLM's num_blocks (all but the null block)."""
    if num_blocks < 2:
        raise ValueError(f"num_blocks: {num_blocks}; vLLM has at least the null block and one")
    return num_blocks - 1


def block_table(num_blocks: int, pool_indices: Sequence[int]) -> List[int]:
    """Pool index of every block id: [PAD] for the null block, then
    pool_indices[b - 1] for b >= 1. ValueError on a count mismatch, a
    negative or repeated index (each block owns its slot)."""
    if len(pool_indices) != slots_needed(num_blocks):
        raise ValueError(f"pool_indices: {len(pool_indices)} entries for {num_blocks} blocks "
                         f"(want {num_blocks - 1})")
    seen = set()
    for i, p in enumerate(pool_indices):
        p = int(p)
        if p < 0 or p in seen:
            raise ValueError(f"pool_indices[{i}]: {p} is negative or repeated")
        seen.add(p)
    return [PAD] + [int(p) for p in pool_indices]


def lookup(table: Sequence[int], block_ids: Sequence[int]) -> List[int]:
    """Reference of the device gather the layers run: pool index of each
    block id; negative ids (PAD_SLOT_ID) and the null block give PAD."""
    return [PAD if b <= NULL_BLOCK_ID else table[b] for b in block_ids]
