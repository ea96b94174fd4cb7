"""One short corridor training, in as many processes as the launcher started (tests/test_distributed.py).

    python tests/distributed_run.py OUT NAME [--stop-after K] [--resume]
    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/distributed_run.py OUT NAME

Each process writes OUT/NAME-rank<r>.pt: its final trainable weights and its memory's entries.
"""

import argparse

import torch

from empo2.config import EMPO2Config
from empo2.trainer import Trainer


def config(results_dir: str, name: str) -> EMPO2Config:
    # Two groups an iteration (one per process when there are two), memory and novelty on, float32 LoRA.
    return EMPO2Config.from_profile(
        "ci", env="corridor", experiment="distributed", run_name=name, results_dir=results_dir, max_steps=3,
        response_tokens=8, tip_tokens=8, p=0.5, groups_per_iteration=2, group_size=2, iterations=2, eval_every=2,
        checkpoint_every=1, n_test_variations=4, eval_variations=4, lr=1e-3, intrinsic_coef=1.0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("name")
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    with Trainer(config(args.out, args.name), resume=args.resume, show_progress=False) as trainer:
        trainer.train(stop_after=args.stop_after)
        torch.save({"weights": trainer.trainable_state(),
                    "memory": [(e.content, e.score, e.scope) for e in trainer.memory.entries()],
                    "novelty_states": len(trainer.novelty), "processes": trainer.processes.size},
                   f"{args.out}/{args.name}-rank{trainer.processes.rank}.pt")
