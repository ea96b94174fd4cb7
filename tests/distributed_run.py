"""One short corridor training, in as many processes as the launcher started (tests/test_distributed.py).

    python tests/distributed_run.py OUT NAME [--stop-after K] [--resume] [--full]
    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/distributed_run.py OUT NAME

Each process writes OUT/NAME-rank<r>.pt: its final trainable weights, its memory's entries and how many
optimizer-state numbers it holds. --full trains all weights with the optimizer state sharded (ZeRO-1).
"""

import argparse

import torch

from empo2.config import EMPO2Config
from empo2.method.trainer import Trainer


def config(results_dir: str, name: str, full: bool = False) -> EMPO2Config:
    # Two groups an iteration (one per process when there are two), memory and novelty on, float32 LoRA;
    # or full fine-tuning (float32 weights, bf16 autocast) with AdamW's state sharded over the processes.
    weights = dict(lora_rank=0, shard_optimizer=True, lr=1e-5) if full else dict(lr=1e-3)
    return EMPO2Config.from_profile(
        "ci", env="corridor", experiment="distributed", run_name=name, results_dir=results_dir, max_steps=3,
        response_tokens=8, tip_tokens=8, p=0.5, groups_per_iteration=2, group_size=2, iterations=2, eval_every=2,
        checkpoint_every=1, n_test_variations=4, eval_variations=4, intrinsic_coef=1.0, **weights)


def optimizer_numbers(optimizer) -> int:
    """How many optimizer-state numbers this process holds (a sharded optimizer: only its share)."""
    local = getattr(optimizer, "optim", optimizer)
    return sum(v.numel() for state in local.state.values() for v in state.values()
               if torch.is_tensor(v) and v.dim() > 0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("name")
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--full", action="store_true")
    args = parser.parse_args()
    with Trainer(config(args.out, args.name, args.full), resume=args.resume, show_progress=False) as trainer:
        trainer.train(stop_after=args.stop_after)
        torch.save({"weights": trainer.trainable_state(),
                    "memory": [(e.content, e.score, e.scope) for e in trainer.memory.entries()],
                    "novelty_states": len(trainer.novelty), "processes": trainer.processes.size,
                    "optimizer_numbers": optimizer_numbers(trainer.update.optimizer)},
                   f"{args.out}/{args.name}-rank{trainer.processes.rank}.pt")
