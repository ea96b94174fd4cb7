"""Two training processes (torchrun, gloo, accelerate) give the run of one process: same episodes, same
memory everywhere, gradients summed over the global batch, one results folder, exact resume."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("distributed_run.py")
LR = 1e-3  # distributed_run.config's learning rate


def launch(out: Path, name: str, processes: int, *extra: str) -> None:
    runner = [sys.executable] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    done = subprocess.run([*runner, str(SCRIPT), str(out), name, *extra], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]


def rows(out: Path, name: str, file: str) -> list[dict]:
    return [json.loads(line) for line in (out / "ci" / "distributed" / name / file).read_text().splitlines()]


def untimed(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("distributed")
    launch(out, "one", 1)
    launch(out, "two", 2)
    return out


def test_two_processes_play_the_same_episodes_and_take_the_same_steps(runs):
    played = {name: rows(runs, name, "episodes.jsonl") for name in ("one", "two")}
    # The sampler's entropy is computed from logits whose rounding depends on the batch a process runs, and
    # after the first step from weights equal within the rounding Adam normalises (below): near, not equal.
    entropies = {name: [(row["iteration"], row.pop("entropy")) for row in played[name]] for name in played}
    assert played["one"] == played["two"]
    for (iteration, one), (_, two) in zip(entropies["one"], entropies["two"]):
        assert two == pytest.approx(one, abs=1e-4 if iteration == 1 else 0.02)
    one, two = rows(runs, "one", "metrics.jsonl"), rows(runs, "two", "metrics.jsonl")
    assert [r["iteration"] for r in two] == [1, 2]  # written once, by process 0
    for a, b in zip(one, two):
        assert "update/skipped" not in a and a["train/episodes/memory_on"] + a["train/episodes/off_policy"] > 0
        for key in ("update/loss", "update/tokens", "update/ratio_mean", "update/grad_norm", "memory/size"):
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-6), key
    # One optimiser step from equal weights: the summed gradient is the one-process gradient.
    first = [torch.load(runs / "ci" / "distributed" / n / "checkpoints" / "iter-00001" / "weights.pt") for n in ("one", "two")]
    for name, value in first[0].items():
        torch.testing.assert_close(first[1][name], value, atol=1e-6, rtol=0)
    # After the second step Adam has normalised rounding-level gradient entries: equal within 2 lr.
    final = [torch.load(runs / f"{n}.pt")["weights"] for n in ("one-rank0", "two-rank0")]
    for name, value in final[0].items():
        torch.testing.assert_close(final[1][name], value, atol=2 * LR, rtol=0)


def test_every_process_holds_the_same_weights_and_memory(runs):
    one, rank0, rank1 = (torch.load(runs / f"{n}.pt") for n in ("one-rank0", "two-rank0", "two-rank1"))
    assert rank0["processes"] == rank1["processes"] == 2
    assert all(torch.equal(rank0["weights"][k], rank1["weights"][k]) for k in rank0["weights"])
    assert one["memory"] and one["memory"] == rank0["memory"] == rank1["memory"]
    assert one["novelty_states"] == rank0["novelty_states"] == rank1["novelty_states"] > 0
    assert sorted(p.name for p in (runs / "ci" / "distributed").iterdir()) == ["one", "two"]


def test_two_processes_resume_exactly(runs):
    launch(runs, "resumed", 2, "--stop-after", "1")
    assert [r["iteration"] for r in rows(runs, "resumed", "metrics.jsonl")] == [1]
    launch(runs, "resumed", 2, "--resume")
    straight, resumed = (torch.load(runs / f"{n}-rank0.pt")["weights"] for n in ("two", "resumed"))
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert rows(runs, "resumed", "episodes.jsonl") == rows(runs, "two", "episodes.jsonl")
    assert ([untimed(r) for r in rows(runs, "resumed", "metrics.jsonl")]
            == [untimed(r) for r in rows(runs, "two", "metrics.jsonl")])


def test_full_fine_tuning_with_the_optimizer_sharded_takes_the_one_process_steps(tmp_path):
    launch(tmp_path, "one", 1, "--full")
    launch(tmp_path, "two", 2, "--full", "--stop-after", "1")
    launch(tmp_path, "two", 2, "--full", "--resume")  # the sharded state is gathered into the checkpoint
    one, rank0, rank1 = (torch.load(tmp_path / f"{n}.pt") for n in ("one-rank0", "two-rank0", "two-rank1"))
    # Each process holds about half of AdamW's moments, together all of them.
    assert rank0["optimizer_numbers"] + rank1["optimizer_numbers"] == one["optimizer_numbers"] > 0
    assert max(rank0["optimizer_numbers"], rank1["optimizer_numbers"]) < 0.75 * one["optimizer_numbers"]
    assert all(torch.equal(rank0["weights"][k], rank1["weights"][k]) for k in rank0["weights"])
    assert rows(tmp_path, "one", "episodes.jsonl") == rows(tmp_path, "two", "episodes.jsonl")
    first = [torch.load(tmp_path / "ci" / "distributed" / n / "checkpoints" / "iter-00001" / "weights.pt") for n in ("one", "two")]
    for name, value in first[0].items():
        torch.testing.assert_close(first[1][name], value, atol=1e-7, rtol=0)
    for name, value in one["weights"].items():
        torch.testing.assert_close(rank0["weights"][name], value, atol=2 * 1e-5, rtol=0)


def test_the_paper_profile_accelerate_config_is_one_process_per_gpu_on_eight_gpus():
    from accelerate.commands.config.config_args import load_config_from_file

    from empo2.config import EMPO2Config

    config = load_config_from_file(str(SCRIPT.parents[1] / "scripts" / "accelerate_paper.yaml"))
    assert (config.distributed_type, config.num_processes, config.use_cpu) == ("MULTI_GPU", 8, False)
    paper = EMPO2Config.from_profile("paper")
    assert paper.shard_optimizer and paper.lora_rank == 0 and paper.groups_per_iteration % config.num_processes == 0
