"""The last wave of a Gluon gradient kernel spread over every multiprocessor (stream-K over the tail).

Where every program of the kernel loops over the whole loop axis (no mask bounds, no listed blocks), every tile
(a row block of a grid index) is the same work, and a grid whose tiles are not a multiple of the multiprocessors
leaves some of them idle in its last wave: 1024 tiles on 132 take 8 tiles' time for 7.76 tiles of work each,
3% (global attention's backward at S = 4096 took 1.239 / 1.278 / 1.325 ms at S = 3968 / 4096 / 4224 on an
H200, the steps of whole waves, not of the work's 6.5%).

The launcher keeps the whole waves' tiles one a program (programs 0 .. SPLIT_FIRST - 1) and cuts the loop blocks
of the tiles left over into runs of equal length, one a multiprocessor (`_split_pieces`, runtime/launch.py). A
run that crosses a tile's end is two pieces, and every piece is a program of its own: the runs' first pieces
start together, and their second pieces follow longest first, so the multiprocessor whose first piece ends first
takes the longest second piece, its own run's other half. (A program walking its whole run, one piece after
another, spilled 380 bytes of registers against 72 and ran 13% slower on an H200.) Every piece of a tile but the
one launched last stores its states over the loop axis (sums: they split at any block) in its slot of a workspace
and adds itself to the tile's ticket; the last (the GPU starts a grid's programs in index order, so the others
have started, and they never wait) waits for them, adds their slots to its own states in piece order (the same
sums every call), writes the tile's outputs and sets the ticket back to zero for the next call. The accumulated
output needs nothing more: each block adds its own product, whichever program runs it.

The launcher's table (int32), for TAIL pieces and the tail's R tiles: [0, TAIL) the piece of each tail program,
then each piece's tile (from SPLIT_FIRST), first block, end block and whether it writes its tile's outputs,
then the first piece of each tile and the end (R + 1 entries): pieces sorted by tile, so a tile's pieces are a
range.
"""
from __future__ import annotations

SPLIT_PARAMS = ["split_ptr", "parts_ptr", "tickets_ptr", "SPLIT_FIRST", "TAIL"]
THREADS = 128   # a consumer's warpgroup: one ticket arrival per thread (each releases its own slot stores)


# The generated names below start with piece_ or share_: no spec axis or input is named so.
def piece_lines(loop_blocks: str) -> list[str]:
    """This program's tile and its loop blocks piece_lo .. piece_hi (of piece_blocks): a whole tile in the first
    waves, a piece of the table's after."""
    return [f"piece_blocks = {loop_blocks}",
            "piece_tile = gl.program_id(0)",
            "piece_lo = 0 * piece_tile",
            "piece_hi = piece_lo + piece_blocks",
            "if gl.program_id(0) >= SPLIT_FIRST:   # a piece of a tile the tail programs share",
            "    piece = gl.load(split_ptr + gl.program_id(0) - SPLIT_FIRST)",
            "    piece_tile = SPLIT_FIRST + gl.load(split_ptr + TAIL + piece)",
            "    piece_lo = gl.load(split_ptr + 2 * TAIL + piece)",
            "    piece_hi = gl.load(split_ptr + 3 * TAIL + piece)"]


def of_piece(head: list[str]) -> list[str]:
    """The head's grid indices and row block from the piece's tile instead of the program index."""
    return [x.replace("gl.program_id(0)", "piece_tile") for x in head]


def share_lines(states: list[str], rows: int, cols: str) -> list[str]:
    """After the loop, where the piece is part of its tile: its states into its slot and an arrival at the tile's
    ticket; or, for the tile's writer (its piece launched last, so the others started before it), a wait for
    their arrivals (each thread on its own: a decision shared across the warpgroup, through shared memory,
    spilled 270 more bytes of registers) and their slots added to its own states in piece order. Leaves
    piece_writes: whether this program writes the tile's outputs."""
    n = len(states)
    at = (lambda slot, k: f"parts_ptr + ((({slot}) * 2 + ME) * {n} + {k}) * {rows * int(cols)} + share_offs")
    return ["piece_writes = gl.program_id(0) < SPLIT_FIRST",
            "if gl.program_id(0) >= SPLIT_FIRST:   # a piece of a tile the tail programs share",
            "    share_own = gl.load(split_ptr + gl.program_id(0) - SPLIT_FIRST)   # read again: none of it stays live",
            "    share_tile = gl.load(split_ptr + TAIL + share_own)   # (from SPLIT_FIRST)",
            f"    share_offs = gl.arange(0, {rows}, layout=O_ROWS)[:, None] * {cols} + "
            f"gl.arange(0, {cols}, layout=O_COLS)[None, :]",
            f"    share_lanes = gl.arange(0, {THREADS}, layout=gl.BlockedLayout([1], [32], [4], [0]))",
            "    share_ticket = tickets_ptr + share_tile * 2 + ME + share_lanes * 0",
            "    piece_writes = gl.load(split_ptr + 4 * TAIL + share_own) != 0",
            "    if piece_writes:",
            "        share_first = gl.load(split_ptr + 5 * TAIL + share_tile)   # the tile's pieces",
            "        share_end = gl.load(split_ptr + 5 * TAIL + share_tile + 1)",
            f"        share_zero = _arrivals_awaited(share_ticket, share_lanes * 0 + (share_end - share_first - 1) * "
            f"{THREADS})",
            "        gl.thread_barrier()   # (every thread has seen the count)",
            "        gl.store(share_ticket, share_zero, mask=share_lanes == 0)   # zero again for the next call",
            "        for share_piece in range(share_first, share_end):",
            "            if share_piece != share_own:",
            *[f"                {s} += gl.load({at('share_piece', k)}, cache_modifier='.cg')"
              for k, s in enumerate(states)],
            "    else:",
            *[f"        gl.store({at('share_own', k)}, {s})" for k, s in enumerate(states)],
            "        gl.atomic_add(share_ticket, share_lanes * 0 + 1, sem='release', scope='gpu')"]


# Each thread waits until the count at its pointer reaches its target (an acquire load in a loop), then yields 0.
# As an instruction with side effects it stays before the reads that follow, which the acquire orders after it.
ARRIVALS_AWAITED = '''

@gluon.jit
def _arrivals_awaited(counter, target):
    return gl.inline_asm_elementwise(
        "{ .reg .pred waiting; .reg .s32 seen; awaited${:uid}: ld.acquire.gpu.global.s32 seen, [$1]; "
        "setp.lt.s32 waiting, seen, $2; @waiting bra awaited${:uid}; mov.s32 $0, 0; }",
        "=r,l,r", [counter, target], dtype=gl.int32, is_pure=False, pack=1)
'''


def launch_lines(tiles: str, loop_blocks: str, states: int, rows: int, cols: str) -> list[str]:
    """Launcher lines: the split (SPLIT_FIRST, TAIL and the table), the slots' workspace and the tickets."""
    return [f"        SPLIT_FIRST, TAIL, split = _split_table(rec, {tiles}, {loop_blocks}, device, "
            "cfg.get('WS_SPLIT', 1))",
            f"        parts = _empty(rec, (max(TAIL, 1), 2, {states}, {rows}, {cols}), torch.float32, device)",
            f"        tickets = _tickets(rec, device, max(2 * ({tiles} - SPLIT_FIRST), 1))"]
