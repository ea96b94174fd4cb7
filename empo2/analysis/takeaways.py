"""What each notebook's runs show, as Markdown computed from the saved runs, so that no figure in the prose can
disagree with them.

Notebooks display these bullets under "Takeaways" (`Markdown(takeaways.main_comparison(profile, results_dir))`),
and `python -m empo2.analysis.report` writes them, for the laptop profile, into docs/results.md. Every function reads
finished runs only (it never trains) and says what is not yet run; what the figures mean is said, without
figures, in the notebook's text beside them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from empo2 import paper
from empo2.analysis import experiments, study, suite
from empo2.episode import MODE_NAMES, failed
from empo2.stats import bootstrap_interval, p_text, permutation_p, seed_difference, seed_interval, verdict

METHODS = {"naive": "Naive", "memory_only": "memory-only", "grpo": "GRPO", "empo2": "EMPO²"}


def interval(value: float, low: float, high: float, *, signed: bool = False, digits: int = 1) -> str:
    """"1.4 [0.7, 2.1]", or with `signed` "+1.4 [-0.7, +2.1]"; a bound that rounds to zero reads 0.0, not -0.0."""
    shown = lambda x: f"{{:{'+' if signed else ''}.{digits}f}}".format(round(x, digits) + 0.0)  # noqa: E731
    return f"{shown(value)} [{shown(low)}, {shown(high)}]"


def difference(folders_a: list[Path], folders_b: list[Path], label: str) -> str:
    """"label +1.7 [-0.9, +7.0] (3 vs 3 seeds, p = 0.40, within the noise)": the mean final test score of runs
    A minus B, its permutation p (none for one seed each) and its verdict (`stats.verdict`, neutrally worded)."""
    c = experiments.compare_methods(folders_a, folders_b)
    seeds = f"{len(folders_a)} vs {len(folders_b)} seed{'s' if max(len(folders_a), len(folders_b)) > 1 else ''}"
    return (f"{label} {interval(c['difference'], c['95% low'], c['95% high'], signed=True)} "
            f"({', '.join(part for part in (seeds, p_text(c['p']), c['verdict']) if part)})")


def _finished(configs) -> list[Path] | None:
    configs = list(configs)
    return [c.run_dir for c in configs] if configs and all(experiments.is_finished(c) for c in configs) else None


def _finished_variants(configs: dict[str, list]) -> dict[str, list[Path]] | None:
    """Each variant's run folders, or None while any run of any variant is unfinished."""
    folders = {label: _finished(runs) for label, runs in configs.items()}
    return None if any(runs is None for runs in folders.values()) else folders


def _n(count: int, word: str) -> str:
    """"1 seed", "3 seeds"."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def _not_yet_run(what: str) -> str:
    return f"- {what}: not yet run at this profile."


def fatal_share_by_half(folders: list[Path]) -> dict:
    """The share of training episodes ending at −100 in the first and the second half of the iterations (means
    over runs), and second minus first with its 95% interval (a paired t-interval over the runs; over the
    episodes of a single run)."""
    first, second = zip(*(experiments.fatal_endings_by_half(folder) for folder in folders))
    change, low, high = seed_difference(list(second), list(first), paired=True)
    return {"first": 100 * np.mean([f.mean() for f in first]), "second": 100 * np.mean([s.mean() for s in second]),
            "change": 100 * change, "low": 100 * low, "high": 100 * high}


def score_counts(scores: np.ndarray) -> str:
    """"48 × 0, 11 × 7, 1 × 13": how many episodes scored each value, lowest first."""
    values, counts = np.unique(np.round(scores, 1), return_counts=True)
    return ", ".join(f"{n} × {v:g}" for v, n in zip(values, counts))


# ------------------------------------------------------------------------------------------ notebook 04
def learning_speed(empo2: list[Path], grpo: list[Path], iterations: int) -> str:
    """Notebooks 04 and 11: EMPO² − GRPO in the mean score of tip-free training episodes (the area under the
    learning curve of the policy that is tested), over the whole run and each half, with 95% intervals."""
    spans = {"the whole run": range(1, iterations + 1), "first half": range(1, iterations // 2 + 1),
             "second half": range(iterations // 2 + 1, iterations + 1)}

    def faster(span: range) -> str:
        a, b = ([experiments.tip_free_training_scores(f, span) for f in runs] for runs in (empo2, grpo))
        return interval(*seed_difference(a, b), signed=True)

    return ("- **Learning speed**, EMPO² − GRPO in the mean score of tip-free training episodes (the area under "
            "the learning curve): " + "; ".join(f"{name} {faster(span)}" for name, span in spans.items()) + ".")


def main_comparison(profile: str, results_dir: str = "results") -> str:
    """Notebook 04: the final test scores, their differences, the fatal ending in training, the test at the
    training temperature, the untrained model on the 18 tasks, and what a run cost."""
    configs = suite.main_comparison(profile, results_dir) + suite.baselines(profile, results_dir)
    folders = _finished(configs)
    if folders is None:
        return _not_yet_run("The main comparison")
    runs = {m: [f for f, c in zip(folders, configs) if c.method == m] for m in METHODS}
    runs = {m: chosen for m, chosen in runs.items() if chosen}
    cfg = configs[0]
    table = experiments.score_table(folders)
    per_run = int(table.loc["grpo", "test episodes"] / table.loc["grpo", "seeds"])
    scores = "; ".join(f"{METHODS[m]} {interval(*table.loc[m, ['score', '95% low', '95% high']])} "
                       f"({_n(table.loc[m, 'seeds'], 'seed')})" for m in runs)
    reference = paper.table1().loc[suite.MAIN_TASK]
    lines = [
        f"- **Final test scores** ({cfg.iterations} iterations × {cfg.group_size} episodes a run; {per_run} test "
        f"episodes a run at temperature {cfg.eval_temperature}, tip-free, memory-only with its memory): {scores}. "
        f"The paper's {suite.MAIN_TASK} row (Qwen2.5-7B): Naive {reference['paper Naive']}, Reflexion "
        f"{reference['paper Reflexion']}, GRPO {reference['paper GRPO']}, EMPO² {reference['paper EMPO2']}.",
        "- **Differences**: " + "; ".join(difference(runs[a], runs[b], f"{METHODS[a]} − {METHODS[b]}")
                                         for a, b in (("grpo", "naive"), ("empo2", "naive"), ("empo2", "grpo"),
                                                      ("empo2", "memory_only")) if a in runs and b in runs) + ".",
        "- **Test episodes by score** (all seeds): " + "; ".join(
            f"{METHODS[m]} {score_counts(np.concatenate([experiments.final_test_scores(f) for f in chosen]))}"
            for m, chosen in runs.items()) + ".",
    ]
    shares = {m: fatal_share_by_half(runs[m]) for m in ("grpo", "empo2", "memory_only") if m in runs}
    lines.append("- **Training episodes ending at −100** (temperature 1), first half of the iterations → second half: "
                 + "; ".join(f"{METHODS[m]} {s['first']:.0f} % → {s['second']:.0f} % "
                             f"({interval(s['change'], s['low'], s['high'], signed=True)} points, "
                             f"{_n(len(runs[m]), 'run')})" for m, s in shares.items()) + ".")
    if "empo2" in runs and "grpo" in runs:
        lines.append(learning_speed(runs["empo2"], runs["grpo"], cfg.iterations))
    lines.append(training_temperature(profile, results_dir))
    lines.append(naive_all_tasks(profile, results_dir))
    lines.append("- **Minutes a run** (training and evaluation, as the runs recorded them): " + "; ".join(
        f"{METHODS[m]} " + ", ".join(f"{experiments.run_minutes(f):.1f}" for f in chosen)
        for m, chosen in runs.items()) + ".")
    return "\n".join(lines)


def training_temperature(profile: str, results_dir: str = "results") -> str:
    """Notebook 04: the final policies and the untrained one tested again at the training temperature."""
    configs = suite.training_temperature(profile, results_dir)
    folders = _finished(configs)
    if folders is None:
        return _not_yet_run("The test at the training temperature")
    by_policy: dict[str, list[Path]] = {}
    for c, folder in zip(configs, folders):
        by_policy.setdefault(suite.policy_tested(c), []).append(folder)
    table = experiments.policy_comparison(by_policy, baseline="untrained")
    name = lambda policy: "untrained" if policy == "untrained" else METHODS[policy]  # noqa: E731
    column = lambda row, name, scale=1: [scale * row[f"{name}{end}"] for end in ("", " 95% low", " 95% high")]  # noqa: E731
    parts = []
    for policy, row in table.iterrows():
        text = f"{name(policy)} {interval(*column(row, 'score'))}, {100 * row['ended at −100']:.1f} % at −100"
        if policy != "untrained":
            score = column(row, "score vs untrained")
            text += (f" (against untrained: score {interval(*score, signed=True)}, "
                     f"{verdict(*score[1:], row['score vs untrained p'], claim=False)}; at −100 "
                     f"{interval(*column(row, 'ended at −100 vs untrained', 100), signed=True)} points)")
        parts.append(text)
    extra = ""
    if {"empo2", "grpo"} <= set(by_policy):
        extra = "; " + difference(by_policy["empo2"], by_policy["grpo"], "EMPO² − GRPO")
    seeds = len(next(iter(by_policy.values())))
    return (f"- **At the training temperature** ({configs[0].eval_temperature}; the same test variations and sampling "
            f"seeds for every policy, {seeds} seeds): " + "; ".join(parts) + extra + ".")


def naive_all_tasks(profile: str, results_dir: str = "results") -> str:
    """Notebook 04: the untrained model on the paper's ScienceWorld tasks."""
    configs = suite.naive_all_tasks(profile, results_dir)
    folders = _finished(configs)
    if folders is None:
        return _not_yet_run("The untrained model on the paper's tasks")
    per_task = {c.task: experiments.final_test_scores(f) for c, f in zip(configs, folders)}
    average, low, high = seed_interval(list(per_task.values()))  # a t-interval over the tasks' means
    zero = [t for t, s in per_task.items() if (s == 0).all()]
    fatal = sum(int(failed(s).sum()) for s in per_task.values())
    best = max(per_task, key=lambda t: per_task[t].mean())
    paper_average = paper.table1()["paper Naive"].mean()
    return (f"- **The untrained model on the paper's {len(per_task)} tasks** ({len(next(iter(per_task.values())))} "
            f"test episodes a task): average {interval(average, low, high)} (the paper's untrained Qwen2.5-7B: "
            f"{paper_average:.1f}); {fatal} episodes ended at −100; {len(zero)} tasks score 0 in every episode; "
            f"the best, {best}, {per_task[best].mean():.1f}.")


# ------------------------------------------------------------------------------------------ notebook 05
def ood_adaptation(profile: str, results_dir: str = "results", target_task: str = "test-conductivity") -> str:
    """Notebook 05: the trained policies adapting to a new task with memory, weights frozen."""
    from empo2.method.adaptation import names_its_episode
    from empo2.analysis.lessons import ood_trials, trial_label

    trials = ood_trials(profile, results_dir, target_task=target_task, saved_only=True)
    if trials is None:
        return _not_yet_run("Adaptation to a new task")
    lines = []
    for method, rows in trials.items():
        means = rows.groupby("trial")["score"].mean()
        n = len(means)
        span = 3 if n >= 6 else 1
        early = rows[rows["trial"] <= span]["score"].to_numpy(float)
        late = rows[rows["trial"] > n - span]["score"].to_numpy(float)
        change, low, high = seed_difference([late], [early])  # one run: an interval over episodes
        named = np.mean([names_its_episode(t, a) for t, a in zip(rows["tip"], rows["actions"])])
        lines.append(f"- **{METHODS[method]}'s policy**, mean score of trials 1–{n}: "
                     + ", ".join(f"{v:.1f}" for v in means) + f" (mean {rows['score'].mean():.1f}); "
                     f"{trial_label(n - span + 1, n)} − {trial_label(1, span)}: "
                     f"{interval(change, low, high, signed=True)}; {int(failed(rows['score']).sum())} of "
                     f"{len(rows)} episodes ended at −100; {100 * named:.0f} % of its tips name an action or object of "
                     f"their episode.")
    empo2, grpo = (trials[m]["score"].to_numpy(float) for m in ("empo2", "grpo"))
    change, low, high = seed_difference([empo2], [grpo])
    said = verdict(low, high, permutation_p([empo2], [grpo]), claim=False)
    lines.append(f"- **EMPO² − GRPO over all trials** {interval(change, low, high, signed=True)} ({len(empo2)} vs "
                 f"{len(grpo)} episodes, {said}). The paper (Qwen2.5-7B, other task pairs): EMPO²'s "
                 f"policy gains 136 % on average within 10 trials, GRPO's barely moves.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- notebooks 06, 07, 08
def variants(configs: dict[str, list], compared: list[tuple[str, str]]) -> str:
    """Notebooks 06-08: each labelled variant's final test score (its runs, one per seed), its fall of fatal
    training episodes, its training episodes' modes and how those with tips fared, and the differences
    `compared` ((A, B) label pairs)."""
    from empo2.analysis.lessons import memory_vs_plain

    by_label = _finished_variants(configs)
    if by_label is None:
        return _not_yet_run("These variants")
    table = experiments.variant_table(by_label)
    seeds = sorted(set(table["seeds"].astype(int)))
    lines = [f"- **Final test scores** ({_n(int(table['test episodes'].iloc[0]), 'test episode')} a variant, "
             f"{' or '.join(map(str, seeds))} seed{'s' if seeds != [1] else ''}): " + "; ".join(
        f"{label} {interval(*row[['final test score', '95% low', '95% high']])} "
        f"({score_counts(np.concatenate([experiments.final_test_scores(f) for f in by_label[label]]))})"
        for label, row in table.iterrows()) + "."]
    lines.append("- **Differences**: " + "; ".join(difference(by_label[a], by_label[b], f"({a}) − ({b})")
                                                   for a, b in compared) + ".")
    lines.append("- **Training episodes ending at −100**, first half of the iterations → second half: " + "; ".join(
        f"{label} {row['ended at −100, first half (%)']:.1f} % → {row['second half (%)']:.1f} %"
        for label, row in table.iterrows()) + "; mean training score " + ", ".join(
        f"{row['mean training score']:.1f}" for _, row in table.iterrows()) + " in the same order.")
    modes = table[[f"{m} episodes" for m in MODE_NAMES.values()]]
    lines.append("- **Modes of the training episodes** (plain / memory on-policy / off-policy): " + "; ".join(
        f"{label} {' / '.join(str(int(n)) for n in counts)}" for label, counts in modes.iterrows()) + ".")
    guided = {label: memory_vs_plain(by_label[label]) for label, counts in modes.iterrows() if counts.iloc[1:].sum()}
    if guided:
        lines.append("- **Training rollouts with tips − plain ones of the same iteration**: " + "; ".join(
            f"{label} {interval(d['memory - plain'], d['95% low'], d['95% high'], signed=True)}"
            for label, d in guided.items() if d["paired iterations"]) + ".")
    lines.append("- **Minutes a run**: " + ", ".join(
        f"{label} " + " / ".join(f"{experiments.run_minutes(f):.1f}" for f in runs) for label, runs in by_label.items())
        + ".")
    return "\n".join(lines)


SCIENCEWORLD_EXAMPLE = ("- **ScienceWorld power-component, 10 iterations, one seed a variant** (the lines below): kept as "
                        "an example of a budget too small to tell variants apart; the study above is where they can.")


def study_lines(notebook: str, profile: str, results_dir: str = "results") -> str:
    """The CoinCollector study's planned contrasts that a notebook leads with (`study.IN_NOTEBOOK`), one line
    each: its estimate, interval, p and verdict, or the seeds it waits for."""
    arms, names = study.IN_NOTEBOOK[notebook]
    table = study.contrasts(study.measures(profile, results_dir), list(names))
    lines = []
    for name, r in table.iterrows():
        of = study.planned_seeds(name, profile)
        if np.isnan(r["estimate"]):
            lines.append(f"- **CoinCollector study, {name}** (planned; {study.unit(name)}): waiting for runs, "
                         f"seeds an arm {r['seeds']} of {of}.")
        else:
            digits = 3 if r["measure"] == "entropy" else 1
            lines.append(f"- **CoinCollector study, {name}** (planned; {study.unit(name)}, seeds an arm "
                         f"{r['seeds']} of {of}): "
                         f"{interval(r['estimate'], r['95% low'], r['95% high'], signed=True, digits=digits)}, "
                         f"{p_text(r['p'])}, {r['verdict']} (the paper: {r['paper']}).")
    return "\n".join(lines)


def mode_ablation(profile: str, results_dir: str = "results") -> str:
    """Notebook 06: the study's update-mode contrasts, then the 10-iteration ScienceWorld runs (full EMPO²
    against either update mode left out)."""
    full = "EMPO2 (full)"
    return "\n".join([study_lines("06", profile, results_dir), SCIENCEWORLD_EXAMPLE,
                      variants(suite.mode_ablation(profile, results_dir),
                               [(full, "without off-policy"), (full, "without on-policy with memory")])])


def pq_sweep(profile: str, results_dir: str = "results") -> str:
    """Notebook 07: the study's p and q contrasts, then the 10-iteration ScienceWorld sweeps, with the paper's
    claim p = 0.25 above p = 0.1."""
    return "\n".join([study_lines("07", profile, results_dir), SCIENCEWORLD_EXAMPLE,
                      variants(suite.pq_sweep(profile, results_dir), [("p=0.25", "p=0.1")])])


def intrinsic_sweep(profile: str, results_dir: str = "results") -> str:
    """Notebook 08: the study's memory × novelty contrasts, then the 10-iteration ScienceWorld sweep of the
    novelty reward's weight, with the claim 1x above none, and the intrinsic return it paid."""
    configs = suite.intrinsic_sweep(profile, results_dir)
    text = "\n".join([study_lines("08", profile, results_dir), SCIENCEWORLD_EXAMPLE,
                      variants(configs, [("1.0x", "none")])])
    by_label = _finished_variants(configs)
    if by_label is None:
        return text
    paid = {label: pd.concat([experiments.training_episodes(f) for f in runs])["intrinsic"].mean()
            for label, runs in by_label.items()}
    text += "\n- **Mean intrinsic return of a training episode**: " + ", ".join(
        f"{label} {value:.2f}" for label, value in paid.items()) + "."
    main = _finished(c for c in suite.main_comparison(profile, results_dir) if c.method == "empo2")
    if main:
        train = pd.concat([experiments.training_episodes(f) for f in main])
        groups = train.groupby(["run", "iteration"]).agg(scores=("score", "std"), intrinsic=("intrinsic", "std"),
                                                         fatal=("score", lambda s: bool(failed(s).any())))
        text += (f"\n- **Part 2, notebook 04's EMPO² runs** ({len(groups)} groups): intrinsic returns "
                 f"{train['intrinsic'].mean():.2f} on average (at most {train['intrinsic'].max():.1f}); within a group "
                 f"the scores' standard deviation is {groups['scores'].mean():.1f} on average, the intrinsic "
                 f"returns' {groups['intrinsic'].mean():.2f}; {int(groups['fatal'].sum())} groups hold a −100, "
                 f"{int((groups['scores'] == 0).sum())} have every score equal (there the novelty term sets every "
                 "advantage).")
    return text


# ------------------------------------------------------------------------------------------ notebook 09
def cost(profile: str, results_dir: str = "results") -> str:
    """Notebook 09: what an EMPO² iteration costs against a GRPO one, and where the time goes."""
    configs = suite.main_comparison(profile, results_dir)
    folders = _finished(configs)
    if folders is None:
        return _not_yet_run("The main comparison")
    frames = pd.concat([experiments.metrics(f) for f in folders], ignore_index=True)
    median = frames.groupby("method")["time/iteration"].median()
    mean = frames.groupby("method")["time/iteration"].mean()
    parts = ["generation", "update", "environment", "memory", "novelty"]
    split = frames.groupby("method")[[f"time/{p}" for p in parts]].median()
    shares = (frames["time/memory"] / frames["time/rollout"])[frames["method"] == "empo2"].to_numpy(float)
    low, high = bootstrap_interval(shares)
    runs = frames.groupby("method")["run"].nunique()
    return "\n".join([
        f"- **An iteration** ({runs['empo2']} EMPO² and {runs['grpo']} GRPO runs): median EMPO² "
        f"{median['empo2']:.0f} s, GRPO {median['grpo']:.0f} s, {median['empo2'] / median['grpo']:.2f} times as long "
        f"(means {mean['empo2']:.0f} s and {mean['grpo']:.0f} s, {mean['empo2'] / mean['grpo']:.2f} times).",
        "- **Where it goes** (median seconds an iteration, EMPO² / GRPO): " + "; ".join(
            f"{p} {split.loc['empo2', f'time/{p}']:.1f} / {split.loc['grpo', f'time/{p}']:.1f}" for p in parts) + ".",
        f"- **Memory operations** (embedding, retrieval, storage, tip writing) take "
        f"{interval(100 * shares.mean(), 100 * low, 100 * high)} % of EMPO²'s rollout time ({len(shares)} iterations); "
        f"the paper: {paper.MEMORY_COST_SHARE_OF_ROLLOUT:.0%}, {paper.MEMORY_COST_SECONDS} s an iteration on 8 A100s.",
    ])


# ---------------------------------------------------------------------------------- notebooks 00 to 03
def _lesson_value(path: Path, settings: dict | None, profile: str, **overrides):
    """The lesson cache at `path` if the profile's config (with `overrides`) and `settings` made it, else None."""
    from empo2.config import EMPO2Config
    from empo2.analysis.lessons import saved_record

    saved = saved_record(path, EMPO2Config.from_profile(profile, **overrides), settings)
    return None if saved is None else saved["value"]


def _actions(actions: list[str], limit: int = 8) -> str:
    """"`a`, `b` × 14": the actions in order, a repeated action once with its count."""
    runs: list[list] = []
    for action in actions:
        if runs and runs[-1][0] == action:
            runs[-1][1] += 1
        else:
            runs.append([action, 1])
    shown = ", ".join(f"`{a}`" + (f" × {n}" if n > 1 else "") for a, n in runs[:limit])
    return shown + (f", … ({len(actions)} actions in all)" if len(runs) > limit else "")


def quickstart(profile: str, results_dir: str = "results", task: str = suite.MAIN_TASK, seed: int = 0) -> str:
    """Notebook 00: the untrained policy's one saved episode and its tip."""
    episode = _lesson_value(Path(results_dir) / profile / "quickstart" / f"episode-{task}-seed{seed}.json", None,
                            profile, task=task, seed=seed)
    if episode is None:
        return _not_yet_run("The quickstart episode")
    steps = episode["steps"]
    return "\n".join([
        f"- **The episode** ({task}, variation {episode['variation']}, {len(steps)} steps): "
        f"{_actions([s['executed'] for s in steps])}; final score {episode['score']:g}"
        + (" (a fatal ending)" if failed(episode["score"]) else "") + ".",
        f"- **Its tip**: \"{episode['tip']}\".",
    ])


def exploration(profile: str, results_dir: str = "results", task: str = suite.MAIN_TASK, seed: int = 0,
                episodes: int = 2) -> str:
    """Notebook 01: plain episodes, then with their tips, and what training changed at test."""
    from empo2.analysis.lessons import test_outcomes, trajectory_summary

    trajectories = _lesson_value(Path(results_dir) / profile / "exploration" / f"{task}-seed{seed}.json",
                                 {"episodes": episodes}, profile, task=task, seed=seed)
    lines = []
    if trajectories is None:
        lines.append(_not_yet_run("Plain, then with memory"))
    else:
        summary = trajectory_summary(trajectories)
        for t in trajectories:
            shown = sum(turn["tips_shown"] for turn in t["turns"])
            lines.append(f"- **{t['condition'].capitalize()}** episode: {_actions([turn['action'] for turn in t['turns']])}; "
                         f"score {t['score']:g}" + (f", {shown} tips shown" if t["condition"] != "plain" else
                                                    f"; its tip \"{t['tip']}\"") + ".")
        lines.append("- **Per condition** (mean final score, share of distinct actions): " + "; ".join(
            f"{c} {row['final score']:.1f}, {100 * row['distinct actions']:.0f} %" for c, row in summary.iterrows()) + ".")
    configs = suite.main_comparison(profile, results_dir) + suite.baselines(profile, results_dir)
    folders = _finished(configs)
    if folders is None:
        lines.append(_not_yet_run("The main comparison's test episodes"))
        return "\n".join(lines)
    by_method = {METHODS[m]: [f for f, c in zip(folders, configs) if c.method == m] for m in ("naive", "grpo", "empo2")}
    table = test_outcomes(by_method)
    lines.append("- **Test episodes** (last evaluation, all seeds; ended at −100 / left the first room / reached the "
                 "workshop / repeated actions): " + "; ".join(
                     f"{m} {100 * r['ended at −100']:.0f} / {100 * r['left first room (≥ 7)']:.0f} / "
                     f"{100 * r['reached workshop (≥ 13)']:.0f} / {100 * r['repeated actions']:.0f} % of "
                     f"{int(r['test episodes'])}" for m, r in table.iterrows()) + ".")
    return "\n".join(lines)


def tips(profile: str, results_dir: str = "results", task: str = suite.MAIN_TASK, seed: int = 0, episodes: int = 2) -> str:
    """Notebook 02: one memory, the tips written in training, memory-only adaptation with each kind of tips
    (`lessons.TIP_STUDY_CONDITIONS`), and tips inside EMPO² training."""
    from empo2.analysis.lessons import TIP_STUDY_BUDGET, memory_vs_plain, tip_trials, trial_gain

    lines = []
    snapshot = _lesson_value(Path(results_dir) / profile / "memory" / f"{task}-seed{seed}.json",
                             {"episodes": episodes}, profile, task=task, seed=seed)
    if snapshot is not None:
        entries = pd.DataFrame(snapshot["entries"])
        lines.append(f"- **Part 1, one memory**: {len(entries)} entries; similarity to the query "
                     f"{entries['similarity'].min():.2f} to {entries['similarity'].max():.2f}; "
                     f"{int(entries['retrieved'].sum())} retrieved; entry scores "
                     f"{', '.join(f'{v:g}' for v in sorted(set(entries['score'])))}.")
    empo2_runs = _finished(c for c in suite.main_comparison(profile, results_dir) if c.method == "empo2")
    if empo2_runs:
        written = pd.concat([experiments.read_jsonl(f / "tips.jsonl") for f in empo2_runs], ignore_index=True)
        by_iteration = written.groupby("iteration")["score"].mean()
        cut = f"{100 * written['tip_cut'].mean():.0f} % cut by the budget" if "tip_cut" in written else "cut not recorded"
        lines.append(f"- **Part 2, tips written in training** ({len(empo2_runs)} EMPO² runs): {len(written)} tips, "
                     f"{written['tip'].str.split().str.len().mean():.1f} words on average, {cut}; the mean score "
                     f"behind them {by_iteration.iloc[0]:.1f} in iteration {by_iteration.index[0]}, "
                     f"{by_iteration.iloc[-1]:.1f} in iteration {by_iteration.index[-1]}.")
    trials = tip_trials(profile, results_dir, saved_only=True, **TIP_STUDY_BUDGET[profile])
    if trials is None:
        lines.append(_not_yet_run("Memory-only adaptation"))
    else:
        gain = trial_gain(trials)
        early, late = (c for c in gain.columns if c.startswith("trial"))
        for (study_task, decoding), r in gain.iterrows():
            lines.append(f"- **Memory-only, {decoding} tips, {study_task}** ({_n(int(r['seeds']), 'seed')}, "
                         f"{int(r['episodes'])} episodes): {early} {r[early]:.1f}, "
                         f"{late} {r[late]:.1f}, late − early "
                         f"{interval(r['late - early'], r['95% low'], r['95% high'], signed=True)} "
                         f"({verdict(r['95% low'], r['95% high'], r['p'], claim=False)}); fatal endings (−100) "
                         f"{100 * r[f'fatal, {early}']:.0f} % → {100 * r[f'fatal, {late}']:.0f} %; "
                         f"{100 * r['tips naming their episode']:.0f} % of "
                         f"the tips name an action or object of their episode, {100 * r['tips cut']:.0f} % are cut.")
    d = memory_vs_plain(empo2_runs) if empo2_runs else {"paired iterations": 0}
    if d["paired iterations"]:  # none in a tiny ci run
        lines.append(f"- **Inside training** ({len(empo2_runs)} EMPO² runs of notebook 04, constrained tips): rollouts "
                     f"with tips − plain rollouts of the same iteration "
                     f"{interval(d['memory - plain'], d['95% low'], d['95% high'], signed=True)} "
                     f"({d['paired iterations']} paired iterations, "
                     f"{verdict(d['95% low'], d['95% high'], d['p'], claim=False)}).")
    return "\n".join(lines)


def importance_ratios(profile: str, results_dir: str = "results", task: str = suite.MAIN_TASK, seed: int = 0) -> str:
    """Notebook 03: the three modes' importance ratios on one batch, before and after one update."""
    from empo2.analysis.lessons import ratio_table

    overrides = dict(task=task, seed=seed, p=1.0, q=0.5, group_size=6, experiment="ratios", checkpoint_every=0,
                     results_dir=str(Path(results_dir) / "scratch"))
    tokens = _lesson_value(Path(results_dir) / profile / "ratios" / f"{task}-seed{seed}.json", None, profile,
                           **overrides)
    if tokens is None:
        return _not_yet_run("The importance ratios")
    tokens = pd.DataFrame(tokens)
    from empo2.config import EMPO2Config

    table = ratio_table(tokens, EMPO2Config.from_profile(profile, **overrides).delta)
    episodes = tokens.groupby("episode")[["score", "advantage"]].first()
    return "\n".join([
        f"- **The batch**: {len(episodes)} episodes scoring {', '.join(f'{s:g}' for s in episodes['score'])}; "
        f"advantages {episodes['advantage'].min():.2f} to {episodes['advantage'].max():.2f}.",
        "- **Ratios of the decisions** (mean / maximum before the update → after it): " + "; ".join(
            f"{mode} {r['ratio_before_mean']:.2f} / {r['ratio_before_max']:.2f} → {r['ratio_after_mean']:.2f} / "
            f"{r['ratio_after_max']:.2f} ({int(r['decisions'])} decisions)" for mode, r in table.iterrows()) + ".",
        "- **The δ mask** drops " + ", ".join(f"{100 * r['dropped_by_delta']:.0f} % of the {mode} decisions"
                                              for mode, r in table.iterrows() if mode == "off_policy") + ".",
    ])


# ------------------------------------------------------------------------------------------ notebook 10
def webshop(profile: str, results_dir: str = "results", scripted: pd.DataFrame | None = None) -> str:
    """Notebook 10: scores, purchases, skipped updates and EMPO² − GRPO on WebShop; with `scripted` (the scripted
    shopper's rows, one per goal) its score too."""

    folders = _finished(suite.webshop_runs(profile, results_dir))
    return _not_yet_run("WebShop") if folders is None else webshop_runs(folders, scripted)


def webshop_runs(folders: list[Path], scripted: pd.DataFrame | None = None) -> str:
    """`webshop`'s bullets for the WebShop runs `folders` (one per method and seed)."""
    from empo2.analysis.lessons import bought, last_evaluation, read_episodes, skipped_updates

    table = experiments.score_table(folders)
    per_run = int(table["test episodes"].iloc[0] / table["seeds"].iloc[0])
    scores = ", ".join(f"{METHODS[m]} {interval(r['score'], r['95% low'], r['95% high'], digits=2)} "
                       f"({100 * r['success']:.0f} % success, {_n(int(r['seeds']), 'seed')})"
                       for m, r in table.iterrows())
    reference = paper.table2()
    lines = [f"- **Final test scores** (mean over seeds [95% interval], {per_run} test episodes a run): {scores}; "
             f"the paper (Qwen2.5-7B, WebShop's 1,000 products): Naive {reference.loc['Naive', 'paper score']}, "
             f"GRPO {reference.loc['GRPO', 'paper score']}, EMPO² {reference.loc['EMPO2', 'paper score']}."]
    tested = pd.concat([last_evaluation(f) for f in folders])
    trained = pd.concat([read_episodes(f).query("phase == 'train'") for f in folders])
    purchases = trained[[bought(a) for a in trained["actions"]]]
    lines.append(f"- **Buying.** {sum(map(bought, tested['actions']))} of {len(tested)} test episodes (all runs) bought "
                 f"something, and {len(purchases)} of {len(trained)} training episodes; "
                 f"{int((purchases['score'] > 0).sum())} of those purchases scored above 0.")
    method_of = {f: experiments.metrics(f)["method"].iloc[0] for f in folders}
    by_method = {m: [f for f in folders if method_of[f] == m] for m in ("grpo", "empo2")}
    for method, chosen in by_method.items():
        frames = [experiments.metrics(f) for f in chosen]
        lines.append(f"- **{METHODS[method]} skipped its update** in {int(sum(skipped_updates(f).sum() for f in frames))} "
                     f"of {sum(len(f) for f in frames)} iterations.")
    if by_method["grpo"] and by_method["empo2"]:
        lines.append(f"- **EMPO² − GRPO**: {difference(by_method['empo2'], by_method['grpo'], '')[1:]}.")
    if scripted is not None:
        lines.append(f"- **The scripted shopper** that reads the goal scores {scripted['score'].mean():.1f} with "
                     f"{100 * scripted['success'].mean():.0f} % success on {len(scripted)} test goals.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ notebook 11
def _share(row: pd.Series, part: str, where: str) -> str:
    """"70.2 % in training" from a `searching_on_seen_and_unseen_games` row, or "no such game in training"."""
    return f"{row[f'{part} success %']:.1f} % in {where}" if row[f"{part} episodes"] else f"no such game in {where}"


def coin(profile: str, results_dir: str = "results", window: int = 10) -> str:
    """Notebook 11: CoinCollector's final scores and differences, the learning curves' landmarks (training blocks
    of `window` iterations), where the coin was found, and how EMPO²'s modes fared."""
    from empo2.episode import succeeded
    from empo2.analysis.lessons import last_evaluation

    configs = suite.coin_runs(profile, results_dir)
    folders = _finished(configs)
    if folders is None:
        return _not_yet_run("CoinCollector")
    runs = {m: [f for f, c in zip(folders, configs) if c.method == m] for m in METHODS}
    order = [m for m in METHODS if runs[m]]
    table = experiments.score_table(folders)
    successes = {m: seed_interval([100 * succeeded(experiments.final_test_scores(f)) for f in runs[m]])
                 for m in order}
    lines = [f"- **Final test scores** on the {configs[0].n_test_variations} held-out games (without memory; "
             "memory-only with its memory): " + "; ".join(
                 f"{METHODS[m]} {interval(*table.loc[m, ['score', '95% low', '95% high']])} "
                 f"({_n(table.loc[m, 'seeds'], 'seed')}, "
                 f"success {100 * table.loc[m, 'success']:.1f} % [{successes[m][1]:.1f}, {successes[m][2]:.1f}])"
                 for m in order) + "."]
    lines.append("- **Differences** (t-intervals over the seeds' means; p of the permutation test): " + "; ".join(
        difference(runs[a], runs[b], f"{METHODS[a]} − {METHODS[b]}")
        for a, b in (("empo2", "grpo"), ("empo2", "naive"), ("grpo", "naive")) if runs[a] and runs[b]) + ".")
    for m in ("grpo", "empo2"):
        if not runs[m]:
            continue
        train, test = (experiments.training_curve(runs[m], window=window, tip_free=True),
                       experiments.training_curve(runs[m], phase="eval"))
        half_way = train.index[train["score"] >= 50]
        lines.append(
            f"- **{METHODS[m]}** tip-free training score {train['score'].iloc[0]:.1f} in iterations 1–{train.index[0]}, "
            + (f"first 50 or more in the block ending at iteration {half_way[0]}, " if len(half_way) else "never 50 or more, ")
            + f"{train['score'].iloc[-1]:.1f} in the last block; test score {test['score'].iloc[0]:.1f} at iteration "
            f"{test.index[0]}, highest {test['score'].max():.1f} (iteration {test['score'].idxmax()}), final "
            f"{test['score'].iloc[-1]:.1f} ({table.loc[m, 'training minutes per run']:.0f} training minutes a run).")
    if runs["empo2"] and runs["grpo"]:
        lines.append(learning_speed(runs["empo2"], runs["grpo"], configs[0].iterations))
    for m in order:
        tested = pd.concat([last_evaluation(f) for f in runs[m]])
        won = tested[succeeded(tested["score"])]
        lines.append(f"- {METHODS[m]}: {len(won)} of {len(tested)} final test episodes took the coin"
                     + (f", {int((won['steps'] == 1).sum())} of them at the first step; median steps to the coin "
                        f"{won['steps'].median():g}" if len(won) else "") + ".")
    if runs["empo2"]:
        played = experiments.episodes(runs["empo2"][0]).query("phase == 'train'")
        late = played[played["iteration"] > configs[0].iterations // 2]
        by_mode = late.groupby("mode")["success"].agg(["size", "mean"])
        lines.append(f"- In {METHODS['empo2']}'s second half (first run), training episodes took the coin in " + ", ".join(
            f"{100 * r['mean']:.1f} % of {int(r['size'])} {mode}" for mode, r in by_mode.iterrows()) + " episodes.")
    lines += _coin_follow_ups(profile, results_dir, configs, folders, runs)
    single = [METHODS[m] for m in order if table.loc[m, "seeds"] == 1]
    if single:
        lines.append(f"- One seed so far for {', '.join(single)}: those intervals are over test games only, not runs.")
    return "\n".join(lines)


def _coin_follow_ups(profile: str, results_dir: str, configs: list, folders: list, runs: dict) -> list[str]:
    """Notebook 11's looks chosen after reading the runs, for EMPO² and GRPO: where the coin lies, the 200-game
    retest and training on few games (each labelled as such)."""
    from empo2.analysis.lessons import (coin_in_first_room, scores_by_coin_room, searching_on_seen_and_unseen_games,
                                        test_scores_on)

    order = [m for m in METHODS if runs[m]]
    lines = []
    if runs["empo2"] and runs["grpo"]:
        in_first_room = coin_in_first_room(configs[0])
        if (~in_first_room).any():
            room = scores_by_coin_room({METHODS[m]: runs[m] for m in order}, in_first_room)["score"]
            explored = seed_difference(test_scores_on(runs["empo2"], ~in_first_room),
                                       test_scores_on(runs["grpo"], ~in_first_room))
            lines.append("- **Where the coin lies** (a split chosen after reading the episodes): in the first room "
                         + ", ".join(f"{m} {v:.1f}" for m, v in room["coin in the first room"].items())
                         + "; elsewhere " + ", ".join(f"{m} {v:.1f}" for m, v in room["coin elsewhere"].items())
                         + f". On the {int((~in_first_room).sum())} games that need exploring, EMPO² − GRPO "
                         f"{interval(*explored, signed=True)}.")
    retest_configs = suite.coin_retests(profile, results_dir)
    retests = [experiments.saved_retest(c) for c in retest_configs]
    if retests and None not in retests:
        again = {m: [f for f, c in zip(retests, retest_configs) if c.method == m] for m in ("grpo", "empo2")}
        scores = experiments.score_table(retests)
        lines.append(f"- **On more held-out games** (the final policies of seeds "
                     f"{', '.join(map(str, suite.COIN_SEEDS[profile]))} on {retest_configs[0].n_test_variations} "
                     "games, a test chosen after reading seeds 0–3): "
                     + "; ".join(f"{METHODS[m]} {interval(*scores.loc[m, ['score', '95% low', '95% high']])}"
                                 for m in ("grpo", "empo2"))
                     + "; " + difference(again["empo2"], again["grpo"], "EMPO² − GRPO") + ".")
    few_configs = suite.coin_few_games(profile, results_dir)
    few = _finished(few_configs)
    if few is not None and runs["empo2"] and runs["grpo"]:
        few_runs = {m: [f for f, c in zip(few, few_configs) if c.method == m] for m in ("grpo", "empo2")}
        seen = searching_on_seen_and_unseen_games(few_configs + configs, few + folders,
                                                  {m: METHODS[m] for m in ("grpo", "empo2")})
        lines.append("- **Training games against new ones** (coin outside the first room; tip-free training episodes of "
                     "the last 20 iterations, then the final test): " + "; ".join(
                         f"{m} on {_n(n, 'game')} {_share(r, 'training', 'training')}, {_share(r, 'test', 'the test')}"
                         for (m, n), r in seen.iterrows()) + ". On "
                     f"{_n(few_configs[0].n_train_variations, 'training game')}, final test "
                     + difference(few_runs["empo2"], few_runs["grpo"], "EMPO² − GRPO") + ".")
    return lines


# ------------------------------------------------------------------------------------------ the CoinCollector study
def coin_study(profile: str, results_dir: str = "results") -> str:
    """The CoinCollector study: its plan, which runs are in, and each planned contrast with what it shows."""
    tests = suite.coin_study_tests(profile, results_dir)
    measures = study.measures(profile, results_dir)
    progress = "; ".join(f"{label} {len(measures['test'][label])} of {len(configs)}" for label, configs in tests.items())
    lines = [suite.coin_study_plan(profile), "", f"**Runs in, trained and tested** (of those planned): {progress}.", ""]
    table = study.contrasts(measures)
    lines += ["| planned contrast | seeds an arm | estimate [95%] | p | verdict |", "|---|---|---|---|---|"]
    for name, r in table.iterrows():
        shown = "—" if np.isnan(r["estimate"]) else interval(r["estimate"], r["95% low"], r["95% high"], signed=True)
        lines.append(f"| {name} | {r['seeds']} | {shown} | {p_text(r['p']) or '—'} | {r['verdict']} |")
    lines += ["", "*A second view, added after 16 runs were in (not planned):* the interquartile mean (IQM, rliable's "
              "robust mean: an arm's seed means less the lowest and highest quarter, so all of 3, the middle 3 of 5, "
              "the middle 6 of 10) of the contrasts of two arms, with Yuen's 95% interval for the difference "
              "(Welch's t on trimmed means; coverage tested at 3, 5 and 10 seeds). A seed far from its arm's others "
              "moves an IQM less than a mean.", "",
              "| contrast of two arms | seeds an arm | IQMs | difference [95%] |", "|---|---|---|---|"]
    for name, r in study.iqm_view(measures).iterrows():
        if np.isnan(r["difference"]):
            lines.append(f"| {name} | {r['seeds']} | — | waiting for runs |")
        else:
            lines.append(f"| {name} | {r['seeds']} | {r['IQM']:.1f} / {r['other IQM']:.1f} | "
                         f"{interval(r['difference'], r['95% low'], r['95% high'], signed=True)} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ docs/results.md
SECTIONS = (
    ("00_quickstart", "One episode of the untrained policy", quickstart),
    ("01_exploration_problem", "The exploration problem", exploration),
    ("02_memory_and_tips", "The memory of tips", tips),
    ("03_importance_ratios", "Importance ratios of the three update modes", importance_ratios),
    ("04_scienceworld", "EMPO² against GRPO on power-component", main_comparison),
    ("05_ood_adaptation", "Adapting to a new task with memory", ood_adaptation),
    ("06_ablation_modes", "Ablation of the update modes", mode_ablation),
    ("07_sweep_p_q", "Sweeps over p and q", pq_sweep),
    ("08_intrinsic_reward", "The novelty reward", intrinsic_sweep),
    ("09_cost", "What EMPO² costs", cost),
    ("10_webshop", "WebShop", webshop),
    ("11_empo2_on_a_laptop", "CoinCollector, a game a laptop can train on", coin),
)
"""Each notebook's takeaways function, in the notebooks' order: (notebook, title, function(profile, results_dir))."""


def document(results_dir: str | Path = "results", profile: str = "laptop") -> str:
    """docs/results.md: every notebook's takeaways at `profile`, computed from the runs saved in `results_dir`."""
    results_dir = str(results_dir)
    commits = sorted({json.loads(p.read_text()).get("git_commit", "")[:7]
                      for p in (Path(results_dir) / profile).glob("*/*/config.json")})
    parts = ["# Results committed so far", "",
             f"Generated by `python -m empo2.analysis.report` from the `{profile}` runs in `results/{profile}/` (do not edit): "
             "each section is one notebook's takeaways, computed from the saved runs by `empo2.analysis.takeaways`, so the "
             "numbers here, in the notebooks and in the runs agree. Intervals over several runs are 95% Student-t "
             "intervals on the runs' mean scores (Welch's for a difference; over the episodes where there is one "
             "run), p the two-sided p of an exact permutation test of the runs' means; a difference whose interval "
             "excludes 0 counts as established only with p < 0.05 (`empo2.stats`). The README's table of claims "
             "gives the verdicts; `results/README.md` lists every run with its budget, minutes and commit. What "
             "the numbers mean is discussed in each notebook "
             f"and in the workshop guide (`notebooks/README.md`). Commits of these runs: {', '.join(commits)}.", ""]
    for notebook, title, takeaways in SECTIONS:
        parts += [f"## {notebook[:2]} · {title}", "",
                  f"[notebook](../notebooks/{notebook}.ipynb) · [executed at {profile}](../results/executed/{notebook}.ipynb)",
                  "", takeaways(profile, results_dir), ""]
    parts += ["## 11 · The CoinCollector study: why EMPO² wins (planned before its runs)", "",
              coin_study(profile, results_dir), ""]
    return "\n".join(parts)
