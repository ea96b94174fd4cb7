"""Data-parallel training over several processes, on Hugging Face accelerate.

    torchrun --nproc_per_node 2 -m empo2 train --profile ci ...        # two CPU processes (gloo)
    accelerate launch --num_processes 8 -m empo2 train --profile paper  # one process per GPU

What stays the same whatever the number of processes W:
- The groups of an iteration are drawn once (every process draws the same variations and modes
  from the same seed) and group g is played by process g mod W, its tokens sampled from a
  generator seeded by (seed, iteration, g): the set of episodes does not depend on W.
- Tips and novelty states of the iteration reach every process and enter the memory and the
  novelty store in group order after all groups are played, so the stores are identical everywhere.
  (Within an iteration a group sees the stores as they were at its start; with one group per
  iteration that is exactly the sequential algorithm.)
- The loss of a mini-batch is divided by the token count of the GLOBAL mini-batch and the
  gradients are summed over the processes: the step equals that of one process playing all groups.
- Process 0 alone writes results and checkpoints.
- With `shard_optimizer` each process keeps AdamW's state for its share of the parameters only
  (ZeRO stage 1), so full fine-tuning needs 4 (weights) + 4 (gradients) + 8/W bytes a parameter.

The policy is not wrapped in DistributedDataParallel: the update runs several backward passes per
optimiser step (one per forward pass, see empo2.method.update) on internals of the model, so gradients are
summed once per step here with `accelerate.utils.reduce`.
"""

from __future__ import annotations

import os

import torch


def launched_processes() -> int:
    """How many processes a launcher (torchrun, accelerate launch) started; 1 for a plain `python`."""
    return int(os.environ.get("WORLD_SIZE", "1"))


class Processes:
    """This process's place among the training processes; one process when not launched by a launcher."""

    def __init__(self, device: str = "cpu"):
        self.accelerator = None
        self.rank, self.size = 0, 1
        self.device = torch.device(device)
        if launched_processes() > 1:
            from accelerate import Accelerator

            self.accelerator = Accelerator(cpu=device == "cpu")
            self.rank, self.size = self.accelerator.process_index, self.accelerator.num_processes
            self.device = self.accelerator.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mine(self, n: int) -> list[int]:
        """The indices among n work items (groups, evaluation chunks) this process plays: i mod W == rank."""
        return [i for i in range(n) if i % self.size == self.rank]

    def gather(self, items: dict[int, object]) -> dict[int, object]:
        """Every process's {index: item}, merged on every process (items are small picklable records)."""
        if self.size == 1:
            return dict(items)
        from accelerate.utils import gather_object

        merged = {}
        for part in gather_object([items]):
            merged.update(part)
        return merged

    def sum_gradients(self, parameters: list[torch.Tensor]) -> None:
        """Sum each parameter's gradient over the processes (a missing gradient counts as zero)."""
        if self.size == 1:
            return
        from accelerate.utils import reduce

        for p in parameters:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad = reduce(p.grad, reduction="sum")

    def add_up(self, values: dict[str, torch.Tensor], maxima: set[str] = frozenset()) -> dict[str, torch.Tensor]:
        """Each scalar of `values` (one dtype) summed over the processes (the ones named in `maxima`: their maximum)."""
        if self.size == 1:
            return values
        import torch.distributed as dist

        merged = {}
        for names, op in (([n for n in values if n not in maxima], dist.ReduceOp.SUM),
                          ([n for n in values if n in maxima], dist.ReduceOp.MAX)):
            if names:
                stacked = torch.stack([values[n].detach() for n in names])  # (len(names),)
                dist.all_reduce(stacked, op=op)
                merged |= dict(zip(names, stacked))
        return {name: merged[name] for name in values}

    def optimizer(self, parameters: list[torch.Tensor], *, lr: float, shard: bool = False) -> torch.optim.Optimizer:
        """AdamW over `parameters`; with `shard` and several processes, ZeRO stage 1: each process keeps the
        moments of its share of the parameters only, steps that share and broadcasts it to the others.

        Not FSDP: FSDP gathers parameters in every forward and reduces gradients in every backward, so all
        processes must run the same passes in lockstep, while here each plays its own episodes (different
        decode steps) and runs one update pass per episode it holds. Sharding only the optimizer keeps
        forward and backward local; the gradients are summed as before (`sum_gradients`).
        """
        if not shard or self.size == 1:
            return torch.optim.AdamW(parameters, lr=lr)
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(parameters, optimizer_class=torch.optim.AdamW, lr=lr)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict | None:
        """The whole optimizer state on process 0 (None elsewhere); every process must call it."""
        if hasattr(optimizer, "consolidate_state_dict"):  # sharded: gather the shares on process 0
            optimizer.consolidate_state_dict(to=0)
        return optimizer.state_dict() if self.is_main else None

    def wait(self) -> None:
        if self.accelerator is not None:
            self.accelerator.wait_for_everyone()

    def end(self) -> None:
        """End the process group (a process that exits without it makes the launcher abort)."""
        if self.accelerator is not None:
            self.accelerator.end_training()


def group_seed(seed: int, iteration: int, index: int, phase: str = "train") -> int:
    """The sampling seed of one group (or evaluation chunk): the same whichever process plays it."""
    return (seed * 1_000_003 + iteration * 10_007 + index * 101 + (phase == "eval")) % (2**63)
