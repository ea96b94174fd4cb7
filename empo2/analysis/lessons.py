"""What two or more lesson notebooks, or a notebook and its takeaways (the report), share.

The lesson notebooks (00-03) play a few episodes with the *untrained* policy of a profile through the roller
(`untrained_roller` gives the policy, the environments, an embedder and an empty memory; `Lesson.play` is
`Roller.run` with a progress bar); each notebook's own playing and tables are written in it. Their results are
saved next to the config that produced them (`cached`), so a notebook replays the saved result when its settings
are unchanged and plays again when they changed or with `force=True`:

    cfg = EMPO2Config.from_profile("ci", task="power-component")
    trajectories = cached("results/ci/exploration/power-component-seed0.json", cfg,
                          lambda: plain_then_with_memory(cfg, episodes=2), settings={"episodes": 2})

The remaining functions turn saved runs into tables that a notebook and its takeaways both read.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from empo2.analysis.experiments import episodes as read_episodes
from empo2.analysis.experiments import progress_enabled, tip_free_rows, training_episodes
from empo2.config import EMPO2Config
from empo2.episode import OFF_POLICY, PLAIN, failed, succeeded


# ----------------------------------------------------------------------------- saved results
def cached(path: str | Path, cfg: EMPO2Config, compute, force: bool = False, settings: dict | None = None):
    """The value saved at `path` if `cfg` and `settings` produced it (and not `force`); else `compute()`,
    saved with them.

    The file holds {"config": cfg.to_dict(), "settings": settings, "git_commit": ..., "git_dirty": ...,
    "packages": ..., "policy_dtype": ..., "value": value}; `settings` are the notebook's own knobs that
    are not config fields (e.g. how many episodes). A config that differs in any field but `results_dir`,
    or other settings, recompute and replace the file (a cache of a lesson's numbers, not a run's records).
    """
    from empo2.llm.models import default_dtype
    from empo2.runs import provenance, write_json_atomic

    path, settings = Path(path), json.loads(json.dumps(settings or {}))
    if path.exists() and not force:
        saved = saved_record(path, cfg, settings)
        if saved is not None:
            made_by = f"commit {saved.get('git_commit', '?')[:10]}" + (
                ", uncommitted changes" if saved.get("git_dirty") else "")
            print(f"reusing {path} (computed with these settings by {made_by}; force=True recomputes)")
            return saved["value"]
        print(f"{path} was computed with other settings: computing it again", flush=True)
    value = compute()
    made = provenance()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"config": cfg.to_dict(), "settings": settings, "git_commit": made["git_commit"],
                             "git_dirty": made["git_dirty"], "packages": made["packages"],
                             "policy_dtype": str(default_dtype(cfg.device)), "value": value}, indent=1)
    return value


def saved_record(path: str | Path, cfg: EMPO2Config, settings: dict | None = None) -> dict | None:
    """What `cached` saved at `path` if `cfg` and `settings` produced it, else None (never computes)."""
    from empo2.runs import config_differences

    path, settings = Path(path), json.loads(json.dumps(settings or {}))
    if not path.exists():
        return None
    saved = json.loads(path.read_text())
    if (isinstance(saved, dict) and "config" in saved and not config_differences(saved["config"], cfg)
            and saved.get("settings", {}) == settings):
        return saved
    return None


# ----------------------------------------------------------------------------- playing episodes
class StepProgress:
    """A progress bar that moves once per step of a lock-step rollout.

    `Roller.run(progress=...)` calls `update(finished)` once per step with the number of
    episodes that ended in that step; this bar counts the steps and shows the finished
    episodes beside them. Off when `experiments.progress_enabled()` is False (papermill runs).
    """

    def __init__(self, max_steps: int, episodes: int, desc: str = "playing"):
        from tqdm.auto import tqdm

        self.episodes = episodes
        self.finished = 0
        self.steps = 0
        self.bar = tqdm(total=max_steps, desc=desc, unit="step", leave=False, disable=not progress_enabled())

    def update(self, finished: int = 0) -> None:
        self.steps += 1
        self.finished += finished
        self.bar.update(1)
        self.bar.set_postfix_str(f"{self.finished}/{self.episodes} episodes over")

    def close(self) -> None:
        self.bar.close()


@dataclass
class Lesson:
    """The untrained policy and what plays with it (see `untrained_roller`)."""

    cfg: EMPO2Config
    roller: object
    envs: list
    tokenizer: object
    embedder: object | None
    memory: object | None

    def play(self, variations: list[int], modes: list[int], *, temperature: float, write_tips: bool = False,
             use_novelty: bool = False, desc: str = "playing") -> list:
        """`Roller.run`: one episode per variation, in lock-step, with a per-step progress bar."""
        progress = StepProgress(self.envs[0].max_steps, len(variations), desc)
        try:
            return self.roller.run(self.envs[: len(variations)], variations, modes, temperature=temperature,
                                   write_tips=write_tips, use_novelty=use_novelty, progress=progress)
        finally:
            progress.close()


@contextlib.contextmanager
def untrained_roller(cfg: EMPO2Config, episodes: int, *, memory: bool = True, memory_scope: str | None = None):
    """The untrained policy of `cfg` with `episodes` environments and, with `memory`, an embedder and an
    empty tip memory; the environments are closed on exit. Sampling is seeded with `cfg.seed`."""
    import torch

    from empo2.envs import env_from_config
    from empo2.method.memory import TipMemory
    from empo2.llm.models import Embedder, load_policy
    from empo2.method.rollout import Roller

    model, tokenizer = load_policy(cfg.model, device=cfg.device)
    embedder = tips = None
    if memory:
        embedder = Embedder(cfg.embedder)
        tips = TipMemory.from_config(cfg, embedder.dim)
    envs = []
    try:
        envs = [env_from_config(cfg) for _ in range(episodes)]
        roller = Roller.from_config(cfg, model, tokenizer, embedder=embedder, memory=tips,
                                    sampling_rng=torch.Generator().manual_seed(cfg.seed), memory_scope=memory_scope)
        yield Lesson(cfg, roller, envs, tokenizer, embedder, tips)
    finally:
        for env in envs:
            env.close()


# ----------------------------------------------------------------------------- tables
def trajectory_summary(trajectories: list[dict]) -> pd.DataFrame:
    """Notebook 01: per condition, the mean final score, episode length, share of distinct actions and
    share of episodes that left the first room (a score of 7 or more at some step)."""
    rows = []
    for t in trajectories:
        actions = [turn["action"] for turn in t["turns"]]
        rows.append({"condition": t["condition"], "final score": t["score"], "steps": len(actions),
                     "distinct actions": len(set(actions)) / max(1, len(actions)),
                     "left first room": float(any(turn["score"] >= 7 for turn in t["turns"]))})
    return pd.DataFrame(rows).groupby("condition").mean()


def last_evaluation(folder: Path) -> pd.DataFrame:
    """The test episodes of a run's last evaluation (one row each, with its executed actions)."""
    frame = read_episodes(folder)
    tested = frame[frame["phase"] == "eval"]
    return tested[tested["iteration"] == tested["iteration"].max()]


def bought(actions: list[str | None]) -> bool:
    """Whether a WebShop episode's executed actions (None where one was invalid) include buying."""
    return "click[buy now]" in actions


def skipped_updates(frame: pd.DataFrame) -> pd.Series:
    """Per iteration of a run's metrics, 1.0 where its update was skipped (a group of equal returns), else 0.0."""
    return frame["update/skipped"].fillna(0.0) if "update/skipped" in frame else pd.Series(0.0, frame.index)


def coin_in_first_room(cfg: EMPO2Config, fold: str = "test") -> pd.Series:
    """Notebook 11: per test (or `fold="train"`: training) game of a CoinCollector config (variation -> bool),
    whether `take coin` is admissible at the first step, i.e. the coin lies in the room the agent starts in; the
    other games must be explored."""
    from empo2.envs import env_from_config

    with env_from_config(cfg) as env:
        games = {"test": env.test_variations, "train": env.train_variations}[fold]
        return pd.Series({v: "take coin" in env.reset(v)[1]["valid_actions"] for v in games})


def searching_on_seen_and_unseen_games(configs: list[EMPO2Config], folders: list[Path], labels: dict[str, str],
                                       last_iterations: int = 20) -> pd.DataFrame:
    """Whether CoinCollector runs learned to search or learned their training games: per method of `labels`
    (method -> label) and number of training games, over its runs (one per seed; `configs` and `folders` in
    step), the share of episodes that took the coin on games whose coin lies outside the first room, among the
    tip-free training episodes of the last `last_iterations` iterations (games it trains on) and in the last
    evaluation (held-out games), each with its 95% interval (over the seeds' means), and the difference.
    Indexed by (label, training games), in the order of `labels`, then fewer games first."""
    from empo2.stats import seed_interval

    settings: dict[tuple[str, int], tuple[EMPO2Config, list[Path]]] = {}
    for method in labels:
        for cfg, folder in sorted(((c, f) for c, f in zip(configs, folders) if c.method == method),
                                  key=lambda pair: pair[0].n_train_variations):
            settings.setdefault((labels[method], cfg.n_train_variations), (cfg, []))[1].append(folder)
    rows, games = [], {}  # games: one simulator start per set of games, however many settings share it
    for (label, n_games), (cfg, run_folders) in settings.items():
        key = (cfg.task, cfg.game_params, cfg.n_train_variations, cfg.n_test_variations)
        if key not in games:
            games[key] = {fold: ~coin_in_first_room(cfg, fold) for fold in ("train", "test")}
        elsewhere = games[key]
        trained = [t[(t["iteration"] > cfg.iterations - last_iterations) & t["variation"].map(elsewhere["train"])]
                   for t in (tip_free_rows(training_episodes(f)) for f in run_folders)]
        scores = {"training": [t["score"].to_numpy(dtype=float) for t in trained],
                  "test": test_scores_on(run_folders, elsewhere["test"])}
        row = {"label": label, "training games": n_games, "seeds": len(run_folders)}
        for name, per_run in scores.items():
            per_seed = [100 * succeeded(s).astype(float) for s in per_run]
            mean, low, high = seed_interval(per_seed)  # NaN where no game needs exploring (the ci game)
            row |= {f"{name} success %": mean, f"{name} 95% low": low, f"{name} 95% high": high,
                    f"{name} episodes": sum(map(len, per_seed))}
        rows.append(row | {"training − test": row["training success %"] - row["test success %"]})
    return pd.DataFrame(rows).set_index(["label", "training games"])


def test_scores_on(folders: list[Path], games: pd.Series) -> list[np.ndarray]:
    """Per run, the scores of its last evaluation's test episodes on the test games `games` marks True
    (variation -> bool, e.g. `coin_in_first_room`): (episodes,) each."""
    return [t[t["variation"].map(games)]["score"].to_numpy(dtype=float) for t in map(last_evaluation, folders)]


def scores_by_coin_room(folders_by_label: dict[str, list[Path]], in_first_room: pd.Series) -> pd.DataFrame:
    """Notebook 11: per label, the final test score on the games whose coin lies in the first room and on the
    others (`coin_in_first_room`): mean over seeds with its 95% interval (over the seeds' means)."""
    from empo2.stats import seed_interval

    rows = []
    for label, folders in folders_by_label.items():
        for games, chosen in (("coin in the first room", in_first_room), ("coin elsewhere", ~in_first_room)):
            per_seed = test_scores_on(folders, chosen)
            if len(per_seed[0]):
                mean, low, high = seed_interval(per_seed)
                rows.append({"games": games, "method": label, "score": mean,
                             "95% low": low, "95% high": high, "test games": len(per_seed[0]), "seeds": len(folders)})
    return pd.DataFrame(rows).set_index(["games", "method"])


def test_outcomes(folders_by_label: dict[str, list[Path]]) -> pd.DataFrame:
    """Notebook 01: per label, the share of last-evaluation test episodes (all runs pooled) that ended
    at -100, left the first room (>= 7) and reached the workshop (>= 13); the share of steps that
    repeat an action already taken in that episode; the mean score and the number of episodes."""
    rows = []
    for label, folders in folders_by_label.items():
        tested = pd.concat([last_evaluation(f) for f in folders])
        repeated = [1 - len(set(a)) / max(1, len(a)) for a in tested["actions"]]
        rows.append({"method": label, "test episodes": len(tested),
                     "ended at −100": float(failed(tested["score"]).mean()),
                     "left first room (≥ 7)": float((tested["score"] >= 7).mean()),
                     "reached workshop (≥ 13)": float((tested["score"] >= 13).mean()),
                     "repeated actions": float(np.mean(repeated)), "mean score": float(tested["score"].mean())})
    return pd.DataFrame(rows).set_index("method")


def ratio_table(tokens: pd.DataFrame, delta: float) -> pd.DataFrame:
    """Notebook 03: per mode, the action tokens, how many of them were decisions (not forced), the
    importance ratios ρ = π_θ(new context) / π_θold(old context) of the decisions before and after
    the update, and the share of decisions the δ mask drops (off-policy tokens whose tip-free
    probability under the current policy is below `delta`)."""
    tokens = with_ratios(tokens, delta)
    decisions = tokens[~tokens["forced"]]
    table = decisions.groupby("mode").agg(
        decisions=("old", "size"), ratio_before_mean=("ratio_before", "mean"), ratio_before_max=("ratio_before", "max"),
        ratio_after_mean=("ratio_after", "mean"), ratio_after_max=("ratio_after", "max"),
        dropped_by_delta=("dropped_by_delta", "mean"))
    table.insert(0, "tokens", tokens.groupby("mode").size())
    return table


def with_ratios(tokens: pd.DataFrame, delta: float) -> pd.DataFrame:
    """`tokens` (rows of `importance_ratios`) with ratio_before, ratio_after and dropped_by_delta columns."""
    tokens = tokens.copy()
    tokens["ratio_before"] = np.exp(tokens["new_before_update"] - tokens["old"])
    tokens["ratio_after"] = np.exp(tokens["new_after_update"] - tokens["old"])
    tokens["dropped_by_delta"] = ((tokens["mode"] == OFF_POLICY.label) & ~tokens["forced"]
                                  & (np.exp(tokens["new_before_update"]) < delta))
    return tokens


# ----------------------------------------------------------------------------- what tips carry
TIP_STUDY_TASKS = {"power-component": "training variations", "test-conductivity": "out of distribution"}
"""Where memory-only adaptation is measured: the main task's training variations and notebook 05's new task."""
TIP_STUDY_CONDITIONS = {"free": dict(tip_decoding="free"),
                        "constrained": dict(tip_decoding="constrained"),
                        "by_score": dict(tip_decoding="constrained", tip_template="by_score")}
"""The tips compared by `tip_trials`, by name: the config fields each sets (the rest are the profile's)."""
TIP_STUDY_BUDGET = {"ci": dict(seeds=(0,), trials=3, episodes_per_trial=2),
                    # Every variation of the profile's split (seeds 0-4), and on power-component, the main
                    # measurement, every training variation twice (seeds 5-9 replay variations 0-4 with other
                    # draws). A study (one task, tips and seed) takes 6-14 minutes on one core, so the 45 take
                    # about seven hours of one lane.
                    "laptop": dict(seeds={"power-component": tuple(range(10)), "test-conductivity": tuple(range(5))},
                                   trials=10, episodes_per_trial=4),
                    "paper": dict(seeds=(0, 1, 2), trials=10, episodes_per_trial=8)}
"""`tip_trials`' budget per profile: the paper's 10 trials where a laptop affords them."""


def tip_trials(profile: str, results_dir: str = "results", *, force: bool = False,
               seeds: tuple[int, ...] | dict[str, tuple[int, ...]] = (0, 1, 2), trials: int = 10,
               episodes_per_trial: int = 4, saved_only: bool = False) -> pd.DataFrame | None:
    """Memory-only adaptation with each of `TIP_STUDY_CONDITIONS`' tips: the untrained policy (frozen), `trials`
    trials of `episodes_per_trial` episodes on one variation, its tips stored after each trial. One row per
    episode, with task, tips (the condition's name) and seed (seed k plays the task's k-th training variation
    of power-component, or the k-th test variation of the new task, counting round the split). `seeds`: the
    same for every task, or per task. Each (task, tips, seed) is cached; `saved_only` reads the caches and
    returns None when one is missing instead of computing it."""
    from empo2.method.adaptation import adapt

    frames = []
    for task, where in TIP_STUDY_TASKS.items():
        for tips, fields in TIP_STUDY_CONDITIONS.items():
            for seed in seeds[task] if isinstance(seeds, dict) else seeds:
                cfg = EMPO2Config.from_profile(profile, task=task, seed=seed, results_dir=results_dir,
                                               experiment="tips", **fields)
                split = "train" if where == "training variations" else "test"
                settings = {"trials": trials, "episodes_per_trial": episodes_per_trial, "split": split, "index": seed}

                def compute(cfg=cfg, task=task, split=split, seed=seed):
                    return adapt(cfg, None, task, trials=trials, episodes_per_trial=episodes_per_trial, seed=seed,
                                 split=split, index=seed).to_dict("records")

                path = Path(results_dir) / profile / "tips" / f"trials-{task}-{tips}-seed{seed}.json"
                rows = _cached_or_saved(path, cfg, compute, force, settings, saved_only)
                if rows is None:
                    return None
                frames.append(pd.DataFrame(rows).assign(task=task, tips=tips, seed=seed))
    return pd.concat(frames, ignore_index=True)


def ood_trials(profile: str, results_dir: str = "results", *, force: bool = False,
               target_task: str = "test-conductivity", trials: int = 0, episodes_per_trial: int = 4,
               saved_only: bool = False) -> dict[str, pd.DataFrame] | None:
    """Notebook 05: the main comparison's seed-0 EMPO² and GRPO policies (trained first where they are not)
    adapting to `target_task` with memory, weights frozen: `trials` trials (0: 10, 3 at ci) of
    `episodes_per_trial` episodes, tips stored after each trial. One frame per method, a row per episode; each
    cached beside its run's config; `saved_only` reads the caches and returns None when one is missing."""
    from empo2.analysis import experiments, suite
    from empo2.method.adaptation import adapt

    settings = {"target_task": target_task, "trials": trials or (3 if profile == "ci" else 10),
                "episodes_per_trial": episodes_per_trial}
    curves = {}
    for method in ("empo2", "grpo"):
        cfg = suite.main_run(profile, method, results_dir)

        def compute(cfg=cfg):
            weights = experiments.run(cfg) / "final_weights.pt"
            return adapt(cfg, weights if weights.exists() else None, target_task, trials=settings["trials"],
                         episodes_per_trial=episodes_per_trial).to_dict("records")

        path = Path(results_dir) / profile / "ood" / f"{method}-to-{target_task}.json"
        rows = _cached_or_saved(path, cfg, compute, force, settings, saved_only)
        if rows is None:
            return None
        curves[method] = pd.DataFrame(rows)
    return curves


def _cached_or_saved(path: Path, cfg: EMPO2Config, compute, force: bool, settings: dict, saved_only: bool):
    """`cached(...)`, or with `saved_only` the saved value (None if there is none for these settings)."""
    if not saved_only:
        return cached(path, cfg, compute, force, settings)
    saved = saved_record(path, cfg, settings)
    return None if saved is None else saved["value"]


def trial_label(first: int, last: int) -> str:
    """"trials 1-3", or "trial 1" for one."""
    return f"trial {first}" if first == last else f"trials {first}-{last}"


def trial_gain(rows: pd.DataFrame) -> pd.DataFrame:
    """Per task and tips: mean score of the last three trials minus the first three (the last and the first
    of fewer than six), with its 95% interval and permutation p (paired over seeds: each seed's late and
    early trials; over the episodes for one seed), the share of episodes with a fatal ending (-100) early and
    late, the share of tips that name their episode's actions or objects, and the share of tips cut by the
    budget."""
    from empo2.method.adaptation import names_its_episode
    from empo2.stats import permutation_p, seed_difference

    n, span = int(rows["trial"].max()), 3 if rows["trial"].max() >= 6 else 1
    early, late = (1, span), (n - span + 1, n)
    table = []
    for (task, tips), chosen in rows.groupby(["task", "tips"], sort=False):
        per_seed = [g for _, g in chosen.groupby("seed")]
        pick = lambda g, span: g[g["trial"].between(*span)]["score"].to_numpy(float)  # noqa: E731
        fatal = lambda span: float(failed(pick(chosen, span)).mean())  # noqa: E731
        late_scores, early_scores = [pick(g, late) for g in per_seed], [pick(g, early) for g in per_seed]
        difference, low, high = seed_difference(late_scores, early_scores, paired=True)
        named = [names_its_episode(t, a) for t, a in zip(chosen["tip"], chosen["actions"])]
        table.append({"task": task, "tips": tips, "seeds": len(per_seed), "episodes": len(chosen),
                      trial_label(*early): float(np.mean([pick(g, early).mean() for g in per_seed])),
                      trial_label(*late): float(np.mean([pick(g, late).mean() for g in per_seed])),
                      "late - early": difference, "95% low": low, "95% high": high,
                      "p": permutation_p(late_scores, early_scores, paired=True),
                      f"fatal, {trial_label(*early)}": fatal(early), f"fatal, {trial_label(*late)}": fatal(late),
                      "tips naming their episode": float(np.mean(named)),
                      "tips cut": float(chosen["tip_cut"].mean()) if "tip_cut" in chosen else float("nan")})
    return pd.DataFrame(table).set_index(["task", "tips"])


def memory_vs_plain(folders: list[Path]) -> dict:
    """Inside training runs: rollouts sampled with tips (memory on-policy and off-policy) minus plain rollouts
    of the same iteration (and so the same variation), paired per iteration; the mean over runs of each run's
    mean difference, with its 95% interval (over the runs' means; over the iterations for one run) and the p
    of a sign-flip permutation test of the runs' means."""
    from empo2.stats import permutation_p, seed_interval

    per_seed = []
    for folder in folders:
        train = read_episodes(folder)
        train = train[train["phase"] == "train"]
        differences = []
        for _, group in train.groupby(["iteration", "variation"]):
            with_tips = group[group["mode"] != PLAIN.label]["score"]
            plain = group[group["mode"] == PLAIN.label]["score"]
            if len(with_tips) and len(plain):
                differences.append(with_tips.mean() - plain.mean())
        per_seed.append(np.asarray(differences))
    mean, low, high = seed_interval(per_seed)  # NaN where no iteration had both kinds (a tiny ci run)
    p = permutation_p(per_seed, [np.zeros_like(d) for d in per_seed], paired=True)  # each run's sign flipped
    return {"memory - plain": mean, "95% low": low, "95% high": high, "p": p,
            "paired iterations": int(sum(len(d) for d in per_seed)), "runs": len(folders)}
