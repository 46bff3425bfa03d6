"""Block id -> slot and layer -> position mapping."""
import pytest

from statecache_vllm.slots import (PAD, block_table, check_same_group_positions, lookup,
                                   position_layers, slots_needed)


def test_positions_follow_shared_tensors():
    # 3 mamba groups x 2 positions: layers on the same tensor share an index.
    ptrs = [("l0", 1000), ("l1", 2000), ("l2", 1000), ("l4", 2000), ("l5", 1000), ("l6", 2000)]
    index, n = position_layers(ptrs)
    assert n == 2
    assert index == {"l0": 0, "l1": 1, "l2": 0, "l4": 1, "l5": 0, "l6": 1}
    check_same_group_positions([["l0", "l1"], ["l2", "l4"], ["l5", "l6"]], index)
    with pytest.raises(ValueError, match="layers 'l0' and 'l2' of one KV-cache group share"):
        check_same_group_positions([["l0", "l2"]], index)
    with pytest.raises(ValueError, match="listed twice"):
        position_layers([("a", 1), ("a", 2)])


def test_block_table_and_lookup():
    assert slots_needed(5) == 4
    table = block_table(5, [7, 3, 9, 0])
    assert table == [PAD, 7, 3, 9, 0]
    # null block and vLLM's PAD_SLOT_ID map to padding; others to their slot
    assert lookup(table, [0, 1, 4, -1, 3, 2]) == [PAD, 7, 0, PAD, 9, 3]


@pytest.mark.parametrize("n,idx,needle", [(5, [1, 2, 3], "3 entries for 5 blocks"),
                                          (3, [1, 1], "pool_indices[1]: 1 is negative or rep"),
                                          (3, [0, -2], "pool_indices[1]: -2 is negative")])
def test_block_table_errors(n, idx, needle):
    with pytest.raises(ValueError) as e:
        block_table(n, idx)
    assert needle in str(e.value)


def test_slots_needed_minimum():
    with pytest.raises(ValueError, match="num_blocks: 1"):
        slots_needed(1)
