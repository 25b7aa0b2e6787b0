"""How one training worker talks to the others (torch.distributed only; no Ray): a
``Collective`` is a world of one in-process, or a process group's member (gloo, NCCL) that
all-gathers codes, agrees on batch counts, sums validation shares and hears rank 0 stop."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


class Collective:
    """A world of one: the in-process case. Subclasses talk to a process group."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_chief(self) -> bool:
        """Rank 0 decides early stopping and writes checkpoints."""
        return self.rank == 0

    @property
    def gather(self) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None:
        """Codes (n, bits) -> (global batch's codes, own rows' indices); None alone."""
        return None

    def agree_min(self, value: int) -> int:
        """The smallest ``value`` over all workers (the batch count every rank runs)."""
        return value

    def broadcast_flag(self, flag: bool) -> bool:
        """Rank 0's ``flag`` on every rank."""
        return flag

    def my_rows(self, n: int) -> tuple[int, int]:
        """This rank's contiguous share [a, b) of n rows (sizes differ by at most one)."""
        return n * self.rank // self.world_size, n * (self.rank + 1) // self.world_size

    def sum(self, values: Sequence[float]) -> list[float]:
        """``values`` summed elementwise over all workers (float64), on every rank."""
        return [float(v) for v in values]

    def gather_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Every rank's ``rows`` (its ``my_rows`` share), concatenated in rank order, on every rank."""
        return rows


class _AllGather(torch.autograd.Function):
    """all_gather with gradients: backward all_reduces and keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        ctx.rank, ctx.n = dist.get_rank(), x.shape[0]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)  # (world * n, bits)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad[ctx.rank * ctx.n : (ctx.rank + 1) * ctx.n]


def gather_global_codes(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, bits) on each rank -> ((world * n, bits) for the whole global batch, own rows' indices)."""
    import torch.distributed as dist

    all_codes = _AllGather.apply(codes)
    own = dist.get_rank() * codes.shape[0] + torch.arange(codes.shape[0], device=codes.device)
    return all_codes, own


class ProcessGroup(Collective):
    """A worker of an initialised torch.distributed process group (Ray Train sets it up)."""

    def __init__(self, device: torch.device):
        import torch.distributed as dist

        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = device

    @property
    def gather(self):
        return gather_global_codes if self.world_size > 1 else None

    def agree_min(self, value: int) -> int:
        import torch.distributed as dist

        t = torch.tensor([value], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def broadcast_flag(self, flag: bool) -> bool:
        import torch.distributed as dist

        t = torch.tensor([float(flag)], device=self.device)
        dist.broadcast(t, src=0)
        return bool(t.item())

    def sum(self, values: Sequence[float]) -> list[float]:
        import torch.distributed as dist

        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def gather_rows(self, rows: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        rows = rows.to(self.device).contiguous()
        sizes = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([len(rows)], device=self.device))
        sizes = [int(s.item()) for s in sizes]
        padded = torch.zeros((max(sizes), *rows.shape[1:]), dtype=rows.dtype, device=self.device)
        padded[: len(rows)] = rows
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded)
        return torch.cat([part[:size] for part, size in zip(parts, sizes)])
