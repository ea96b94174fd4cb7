"""Command line: `python -m empo2 {demo,train,eval,config}`.

    python -m empo2 demo                                   # one real ScienceWorld episode, step by step
    python -m empo2 train --method empo2 --task power-component --profile laptop --seed 1
    python -m empo2 train --profile ci --set p=0.5 --set iterations=3
    python -m empo2 train ... --resume                     # continue from the run's last checkpoint
    python -m empo2 train ... --overwrite                  # replace the run in that folder
    python -m empo2 train --method naive --task find-animal --profile laptop   # evaluation only
    python -m empo2 train --env textworld_express --task coin --profile laptop   # CoinCollector, about an hour
    python -m empo2 eval --method grpo --task power-component --profile laptop # evaluate a trained run again
    python -m empo2 config --profile paper                 # print a profile with every field's help
    python -m empo2 replay results/laptop/coin/empo2-coin-seed0 --iterations 2   # does this code still produce it?

A run lives in results/<profile>/<experiment>/<run>/ (experiment: the task's name unless --experiment),
where the notebooks look for it. `train` refuses a folder that already holds a run unless told to
--resume it (a finished one is reused) or --overwrite it; `eval` writes its records into the run's
evaluations/eval-NNN/ and never touches the run's own.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from dataclasses import fields

from empo2.config import METHODS, PROFILES, EMPO2Config


def _parse_value(text: str):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # plain strings need no quotes: --set task=find-animal


def config_from_args(args) -> EMPO2Config:
    overrides = {}
    for name in ("method", "task", "env", "seed", "experiment", "model"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    for item in args.set or []:
        if "=" not in item:
            raise SystemExit(f"--set expects field=value, got {item!r}")
        key, value = item.split("=", 1)
        overrides[key.strip()] = _parse_value(value.strip())
    try:
        return EMPO2Config.from_profile(args.profile, **overrides)
    except (ValueError, TypeError) as error:
        raise SystemExit(f"error: {error}") from None


def demo(args) -> None:
    """One real ScienceWorld episode with the default model, printed turn by turn, then its tip."""
    import torch

    from empo2.envs import env_from_config
    from empo2.episode import PLAIN
    from empo2.llm.models import load_policy
    from empo2.method.rollout import Roller

    try:
        cfg = EMPO2Config.from_profile("laptop", task=args.task or "power-component", max_steps=args.steps,
                                       seed=args.seed, action_decoding=args.decoding, response_tokens=24,
                                       tip_tokens=60, **({"model": args.model} if args.model else {}))
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    model, tokenizer = load_policy(cfg.model)
    print(f"policy loaded in {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    env = env_from_config(cfg)
    try:
        roller = Roller.from_config(cfg, model, tokenizer, sampling_rng=torch.Generator().manual_seed(args.seed))
        variation = env.train_variations[0]
        [episode] = roller.run([env], [variation], [PLAIN], temperature=1.0, write_tips=True)
    finally:
        env.close()
    print(f"\ntask {episode.task}, variation {variation}, {len(episode.turns)} steps\n")
    for number, turn in enumerate(episode.turns, 1):
        print(f"step {number:2d}  model wrote: {turn.raw_action.strip()[:70]!r}")
        print(f"         executed:    {turn.executed_action}")
        print(f"         observation: {turn.observation.strip()[:110]!r}")
        print(f"         score {turn.score:.0f} (reward {turn.reward:+.0f})")
    print(f"\nfinal score {episode.score:.0f}; done={episode.done} truncated={episode.truncated}")
    print(f"tip written by the policy: {episode.tip!r}")
    print(f"episode + tip took {time.perf_counter() - started:.1f} s "
          f"(generation {roller.timer.generation:.1f} s, environment {roller.timer.environment:.1f} s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m empo2", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    demo_parser = commands.add_parser("demo", help="one real ScienceWorld episode with the default model")
    demo_parser.add_argument("--task", default=None)
    demo_parser.add_argument("--model", default=None)
    demo_parser.add_argument("--steps", type=int, default=10)
    demo_parser.add_argument("--seed", type=int, default=0)
    demo_parser.add_argument("--decoding", default="constrained", choices=("constrained", "free"),
                             help="constrained: choose among the admissible actions; free: text snapped to one")

    for name, text in (("train", "train a method (empo2, grpo, memory_only) and evaluate it"),
                       ("eval", "evaluate a run's trained policy again (its last checkpoint, else final_weights.pt) "
                                "into the run's evaluations/ folder")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--profile", default="laptop", choices=PROFILES)
        sub.add_argument("--method", default=None, choices=METHODS)
        sub.add_argument("--task", default=None)
        sub.add_argument("--env", default=None, help="scienceworld (default), webshop, textworld_express, corridor")
        sub.add_argument("--model", default=None)
        sub.add_argument("--seed", type=int, default=None)
        sub.add_argument("--experiment", default=None)
        sub.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override any config field")
        if name == "train":
            how = sub.add_mutually_exclusive_group()
            how.add_argument("--resume", action="store_true",
                             help="continue the run in its folder from the last checkpoint (a finished run is reused)")
            how.add_argument("--overwrite", action="store_true", help="delete the run in its folder and train afresh")
        sub.add_argument("--quiet", action="store_true", help="no progress bars")

    replay_parser = commands.add_parser("replay", help="retrain a saved run's first iterations in a scratch folder "
                                                       "and compare its episodes with the saved ones")
    replay_parser.add_argument("run_dir")
    replay_parser.add_argument("--iterations", type=int, default=1)

    config_parser = commands.add_parser("config", help="print a profile's config with every field's help")
    config_parser.add_argument("--profile", default="laptop", choices=PROFILES)

    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        demo(args)
        return
    if args.command == "replay":
        from empo2.method.replay import replay

        try:
            found = replay(args.run_dir, args.iterations)
        except (FileNotFoundError, ValueError) as error:
            raise SystemExit(f"error: {error}") from None
        print(found)
        raise SystemExit(0 if found.difference is None else 1)
    if args.command == "config":
        cfg = EMPO2Config.from_profile(args.profile)
        helps = EMPO2Config.help()
        for field in fields(cfg):
            print(f"{field.name:22s} = {getattr(cfg, field.name)!r:32s}  # {helps[field.name]}")
        return

    from empo2.envs import GameError
    from empo2.analysis.experiments import is_finished
    from empo2.llm.models import default_dtype, resolve_policy_path
    from empo2.runs import DONE_FILE, RunError
    from empo2.method.trainer import Trainer, evaluate_run

    cfg = config_from_args(args)
    try:  # before anything slow starts (model load, JVMs)
        resolve_policy_path(cfg.model)
    except FileNotFoundError as error:
        raise SystemExit(f"error: model: {error}") from None
    try:
        default_dtype(cfg.device)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    try:
        if args.command == "eval":
            metrics, folder = evaluate_run(cfg, show_progress=not args.quiet)
        elif args.resume and is_finished(cfg):
            folder = cfg.run_dir
            metrics = json.loads((folder / DONE_FILE).read_text())
            print(f"{folder} holds this run, finished: nothing to resume (--overwrite retrains it)")
        else:
            with Trainer(cfg, resume=args.resume, overwrite=args.overwrite, show_progress=not args.quiet) as trainer:
                metrics, folder = trainer.train(), trainer.run_dir
    except (RunError, GameError) as error:
        raise SystemExit(f"error: {error}") from None
    if _is_main_process():
        print(json.dumps(metrics, indent=2))
        print(f"results in {folder}")


def _is_main_process() -> bool:
    """Only the first of several launched processes prints (torchrun and accelerate set RANK)."""
    import os

    return os.environ.get("RANK", "0") == "0"


if __name__ == "__main__":
    main(sys.argv[1:])
