"""The ordering step of a classifying kernel (block_kernel.py, block_pairs.py): after the block lists, the row
blocks ranked by their work, so that the kernel reading the lists runs the longest first. _order_row_blocks
reads the work back from the lists (the last program to finish, after every entry's lists); _rank_row_blocks
takes it in registers (one program that classified every row block of the only entry)."""

ORDER_SOURCE = '''@triton.jit
def _order_row_blocks(out_ptr, n_entries, n_rb, n_kb, ORDER_CHUNK: tl.constexpr):
    """After the lists: the row blocks in order of decreasing work (key blocks visited, summed over the
    entries; ties in row order), then 1 where the work is skewed (the most above 4 times the mean); the work of
    each row block is kept after that."""
    order = out_ptr + (n_entries * n_rb).to(tl.int64) * (2 * n_kb + 2)
    work_at = order + n_rb + 1
    total = tl.full([], 0, tl.int32)
    most = tl.full([], 0, tl.int32)
    for rc in range(0, n_rb, ORDER_CHUNK):
        rows = rc + tl.arange(0, ORDER_CHUNK)
        live = rows < n_rb
        work = tl.zeros([ORDER_CHUNK], tl.int32)
        for e in range(0, n_entries):
            lists = out_ptr + (e * n_rb + rows).to(tl.int64) * (2 * n_kb + 2)
            work += tl.load(lists, mask=live, other=0) + tl.load(lists + n_kb + 1, mask=live, other=0)
        tl.store(work_at + rows, work, mask=live)
        total += tl.sum(work, axis=0)
        most = tl.maximum(most, tl.max(work, axis=0))
    tl.debug_barrier()
    for rc in range(0, n_rb, ORDER_CHUNK):
        rows = rc + tl.arange(0, ORDER_CHUNK)
        live = rows < n_rb
        mine = tl.load(work_at + rows, mask=live, other=0)
        rank = tl.zeros([ORDER_CHUNK], tl.int32)
        for sc in range(0, n_rb, ORDER_CHUNK):
            others = sc + tl.arange(0, ORDER_CHUNK)
            theirs = tl.load(work_at + others, mask=others < n_rb, other=-1)
            rank += _ahead(mine, rows, theirs, others)
        tl.store(order + rank, rows, mask=live)
    tl.store(order + n_rb, _skewed(most, total, n_rb))


@triton.jit
def _rank_row_blocks(order, work, rows, n_rb):
    """The order and skew flag of _order_row_blocks from the work of each row block in registers (rows: every
    index of the padded block count, those past n_rb ignored)."""
    live = rows < n_rb
    mine = tl.where(live, work, -1)
    tl.store(order + _ahead(mine, rows, mine, rows), rows, mask=live)
    tl.store(order + n_rb, _skewed(tl.max(mine, axis=0), tl.sum(tl.where(live, work, 0), axis=0), n_rb))
    tl.store(order + n_rb + 1 + rows, work, mask=live)


@triton.jit
def _ahead(mine, rows, theirs, others):
    """For each row block of `rows` with work `mine`: how many of `others` (work `theirs`) come before it, by
    more work, ties in row order."""
    later = (theirs[None, :] == mine[:, None]) & (others[None, :] < rows[:, None])
    ahead = (theirs[None, :] > mine[:, None]) | later
    return tl.sum(ahead.to(tl.int32), axis=1)


@triton.jit
def _skewed(most, total, n_rb):
    """1 where the most work of a row block is above 4 times the mean."""
    return (most.to(tl.float32) > 4.0 * total.to(tl.float32) / n_rb).to(tl.int32)
'''
