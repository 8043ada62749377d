"""The last wave of the Gluon gradient kernel shared by every multiprocessor (codegen/gluon_split_tail.py): the
pieces the launcher cuts (runtime/launch.py `_split_pieces`), which kernels take them, and, on a Hopper GPU
(NEPTUNE_TEST_DEVICE=cuda), gradients that match float64 where tiles are shared."""
import heapq

import pytest
import torch
from hypothesis import given, settings, strategies as st

from neptune_eqsat.frontend.spec import load_spec
from neptune_eqsat.runtime.launch import _split_pieces
from neptune_eqsat.runtime.loader import load_module

from conftest import DEVICE, SPECS
from hopper_checks import check_on_hopper
from test_gluon_gradients import gradient_kernel


def decoded(tiles, loop_blocks, slots):
    """(SPLIT_FIRST, pieces as (tile, lo, hi, writes), the launch order, each tile's first piece)."""
    first, n, table = _split_pieces(tiles, loop_blocks, slots)
    order, tile, lo, hi, writes = (table[k * n:(k + 1) * n] for k in range(5))
    return first, list(zip(tile, lo, hi, writes)), order, table[5 * n:]


def makespan(pieces, order, slots):
    """When the last piece ends, with the multiprocessors free at 0 taking the pieces in launch order, each the
    next one as it frees (as the hardware hands out a grid's programs)."""
    free = [0] * slots
    end = 0
    for j in order:
        t = heapq.heappop(free) + pieces[j][2] - pieces[j][1]
        end = max(end, t)
        heapq.heappush(free, t)
    return end


@settings(max_examples=300, deadline=None)
@given(tiles=st.integers(1, 5000), loop_blocks=st.integers(1, 600), slots=st.integers(8, 200))
def test_the_tail_pieces_cover_every_block_once_and_balance_the_multiprocessors(tiles, loop_blocks, slots):
    first, pieces, order, starts = decoded(tiles, loop_blocks, slots)
    rest = tiles - first
    if not pieces:   # whole waves, a nearly full last wave, or runs that would hold whole tiles
        assert first == tiles
        return
    assert 0 < rest == tiles % slots and 10 * rest <= 9 * slots
    assert sorted(order) == list(range(len(pieces))) and len(pieces) <= 2 * slots
    seen = {}
    for t, lo, hi, _ in pieces:
        assert 0 <= lo < hi <= loop_blocks
        for block in range(lo, hi):
            seen[(t, block)] = seen.get((t, block), 0) + 1
    assert seen == {(t, block): 1 for t in range(rest) for block in range(loop_blocks)}
    launched = {j: n for n, j in enumerate(order)}
    assert len(starts) == rest + 1 and starts[0] == 0 and starts[-1] == len(pieces)
    for t in range(rest):   # a tile's pieces are a range; its writer launches after the others
        mine = range(starts[t], starts[t + 1])
        assert all(pieces[j][0] == t for j in mine) and len(mine) >= 1
        writers = [j for j in mine if pieces[j][3]]
        assert len(writers) == 1 and all(launched[j] < launched[writers[0]] for j in mine if j != writers[0])
    runs = min(slots, rest * loop_blocks // 16)
    end = makespan(pieces, order, slots)
    assert end <= -(-rest * loop_blocks // runs) + 1 and end < loop_blocks


def test_global_attention_at_4096_shares_its_last_100_tiles():
    """1024 tiles on 132 multiprocessors: 924 whole, the last 100 in 132 runs of 48-49 of their 64 blocks."""
    first, pieces, order, _ = decoded(1024, 64, 132)
    assert first == 924 and makespan(pieces, order, 132) == 49
    assert decoded(4096, 256, 132)[0] == 4092   # S = 16384: the 4 tiles past 31 whole waves
    assert decoded(1056, 66, 132)[1] == [] and decoded(256, 16, 132)[1] == []   # whole waves; 94% full


def test_only_a_kernel_whose_tiles_are_equal_work_takes_the_split():
    """Global attention's gradient kernel reads its piece from the launcher's table; a causal one, whose tiles
    differ (and run longest first), keeps one program a tile and no split tunable."""
    split = gradient_kernel(load_spec(str(SPECS / "global_pf.py")))
    causal = gradient_kernel(load_spec(str(SPECS / "causal_pf.py")))
    assert "piece_lo = gl.load(split_ptr" in split.source and "_split_table(rec" in split.source
    assert "_arrivals_awaited(" in split.source
    assert load_module(split.source, split.spec.name).CONFIG["WS_SPLIT"] == 1
    assert "split_ptr" not in causal.source and "WS_SPLIT" not in load_module(causal.source, causal.spec.name).CONFIG


@pytest.mark.skipif(DEVICE != "cuda" or not torch.cuda.is_available()
                    or torch.cuda.get_device_capability()[0] != 9, reason="the Gluon kernel runs on Hopper GPUs")
def test_shared_tiles_match_float64_on_hopper(monkeypatch):
    """Global attention (32 heads) at S = 2000: 512 tiles, whose last wave (116 on 132 multiprocessors) is
    shared; 2000 is off the blocks. (bench/experiments/2026-11-28-split-tail/hopper_check.py runs this check
    and those of test_gluon_gradients.py on a GPU machine without the compiler, from a filled kernel cache.)"""
    monkeypatch.setenv("NEPTUNE_EQSAT_COMPILE_AHEAD", "0")
    slots = torch.cuda.get_device_properties(0).multi_processor_count
    assert decoded(512, 32, slots)[1], "no split at this shape on this GPU"
    check_on_hopper(load_spec(str(SPECS / "global_pf.py")), {"B": 1, "S": 2000}, seed=5, tol=2e-2)
