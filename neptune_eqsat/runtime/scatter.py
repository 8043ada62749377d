"""A gradient added into an input's buffer at computed indices (a label per row, a table read at clamp(i - j)):
the one form training.py runs and the standalone backward module embeds (codegen/backward_module.py copies this
function's source, as the module imports only torch and triton)."""
import torch


def scatter_add(acc, index, values):
    """acc[index] += values (broadcast together), repeated indices adding up. An index outside acc carries a
    gradient of 0: a read that a where guards (a label of -100 the loss ignores) has no place in acc, so it adds
    0 at the nearest place rather than failing, or wrapping around to another element."""
    index = torch.broadcast_tensors(*index)
    shape = torch.broadcast_shapes(values.shape, index[0].shape)
    inside = torch.ones(shape, dtype=torch.bool, device=acc.device)
    for i, n in zip(index, acc.shape):
        inside = inside & (i >= 0) & (i < n)
    index = tuple(i.clamp(0, n - 1).expand(shape) for i, n in zip(index, acc.shape))
    acc.index_put_(index, torch.where(inside, values.to(acc.dtype).expand(shape), 0), accumulate=True)
