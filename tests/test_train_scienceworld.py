"""A `ci`-profile EMPO² training run on the real ScienceWorld with the default model."""

import json
import math
import re

import torch

from empo2.config import EMPO2Config
from empo2.method.trainer import Trainer


def test_ci_profile_run_on_real_scienceworld(tmp_path):
    # p = 1 and q = 0.5 so that every mode's path (tips shown, off-policy scoring) runs on real data.
    cfg = EMPO2Config.from_profile("ci", task="power-component", results_dir=str(tmp_path), experiment="ci",
                                   p=1.0, q=0.5, tip_decoding="constrained", iterations=2, eval_every=2, checkpoint_every=2)
    with Trainer(cfg, show_progress=False) as trainer:
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        trainer.train()
        changed = sum(not torch.equal(v, dict(trainer.model.named_parameters())[n].detach()) for n, v in before.items())
    run = cfg.run_dir
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [1, 2]
    assert all(math.isfinite(m["update/loss"]) for m in metrics)  # both iterations updated (intrinsic reward)
    assert changed > 0, "an update with non-zero advantages must change the LoRA weights"
    assert math.isfinite(metrics[-1]["eval/score"]) and -100 <= metrics[-1]["eval/score"] <= 100
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    train = [e for e in episodes if e["phase"] == "train"]
    assert len(train) == 2 * cfg.group_size and all(e["mode"] != "plain" for e in train)
    assert all(e["actions"] and e["tip"] for e in train)
    # Constrained tips: the template, slots from the episode, never cut.
    for e in train:
        match = re.fullmatch(r"Helpful: (.+)\. Avoid: (.+)\. Next, try: (.+)\.", e["tip"])
        assert match and match[1] in e["actions"] and match[2] in e["actions"] and not e["tip_cut"], e["tip"]
    assert metrics[-1]["memory/size"] > 0
    assert any(e["tips_shown"] > 0 for e in train if e["iteration"] == 2), "iteration 2 retrieves iteration 1's tips"
    assert (run / "checkpoints" / "latest").exists()
    saved = json.loads((run / "config.json").read_text())
    assert saved["packages"]["scienceworld"] and saved["config"]["task"] == "power-component"
