"""The runs behind each notebook, defined once so notebooks and batch jobs agree exactly.

Every function returns `EMPO2Config`s for a profile; `experiments.run` trains or
reuses them. Runs live under `<results_dir>/<profile>/<experiment>/<run>/` (`EMPO2Config.run_dir`), where
`python -m empo2 train` puts them too.
"""

from __future__ import annotations

import dataclasses

from empo2.config import EMPO2Config
from empo2.paper import SCIENCEWORLD_TABLE1

MAIN_TASK = "power-component"
SEEDS = {"ci": (0, 1), "laptop": (0, 1, 2), "paper": (0, 1, 2)}

def _cfg(profile: str, results_dir: str, experiment: str, **overrides) -> EMPO2Config:
    return EMPO2Config.from_profile(profile, results_dir=results_dir, experiment=experiment, **overrides)


MAIN_BUDGET = {"ci": {}, "laptop": dict(iterations=40, eval_every=10), "paper": {}}
"""The main comparison's budget where it differs from the profile's. At `laptop`, 40 iterations (320 training
episodes, 4x the variants' 10) tested every 10: as long as two cores train both methods side by side in one
sitting (about two hours). The authors' own curve turns only after thousands of episodes."""


def _main(profile: str, results_dir: str, method: str, seed: int) -> EMPO2Config:
    return _cfg(profile, results_dir, "power-component", method=method, task=MAIN_TASK, seed=seed,
                **MAIN_BUDGET[profile])


def main_comparison(profile: str, results_dir: str = "results") -> list[EMPO2Config]:
    """EMPO² and GRPO on power-component, same budget, several seeds (Fig. 1a)."""
    return [_main(profile, results_dir, method, seed) for method in ("empo2", "grpo") for seed in SEEDS[profile]]


def baselines(profile: str, results_dir: str = "results") -> list[EMPO2Config]:
    """Naive (the untrained model under the same decoding, one evaluation per seed) and memory-only."""
    naive = [_cfg(profile, results_dir, "power-component", method="naive", task=MAIN_TASK, seed=seed)
             for seed in SEEDS[profile]]
    return naive + [_main(profile, results_dir, "memory_only", 0)]


def main_run(profile: str, method: str, results_dir: str = "results") -> EMPO2Config:
    """The seed-0 main-comparison run of `method`: the policy notebook 05 adapts to a new task."""
    return _main(profile, results_dir, method, 0)


def reference_run(profile: str, results_dir: str = "results") -> EMPO2Config:
    """EMPO² seed 0 at the profile's budget: the run that variants equal to it share (the ablation's full
    method, p = 0.25 and q = 2/3 of the sweep, the 1x novelty reward). The main run where the main
    comparison keeps the profile's budget."""
    if not MAIN_BUDGET[profile]:
        return main_run(profile, "empo2", results_dir)
    return _cfg(profile, results_dir, "variants", method="empo2", task=MAIN_TASK, seed=0, run_name="empo2-reference")


def training_temperature(profile: str, results_dir: str = "results") -> list[EMPO2Config]:
    """The main comparison's final policies, and the untrained one, tested again at the training temperature
    (the main test samples at eval_temperature, 0.4): run `<source>-seed<k>` evaluates seed k's final weights
    of `source` (untrained: the base model) on the same test variations with the same sampling seeds."""
    temperature = EMPO2Config.from_profile(profile).temperature
    runs = []
    for seed in SEEDS[profile]:
        sources = {"untrained": ""} | {main.method: f"{main.experiment}/{main.name}"
                                       for main in main_comparison(profile, results_dir) if main.seed == seed}
        runs += [_cfg(profile, results_dir, "training-temperature", method="naive", task=MAIN_TASK, seed=seed,
                      eval_temperature=temperature, init_weights=weights, run_name=f"{source}-seed{seed}")
                 for source, weights in sources.items()]
    return runs


def policy_tested(cfg: EMPO2Config) -> str:
    """The policy a `training_temperature` run tests: "untrained" or the main comparison's method."""
    return cfg.run_name.rsplit("-seed", 1)[0]


def naive_all_tasks(profile: str, results_dir: str = "results") -> list[EMPO2Config]:
    """The default model without training on the paper's 18 tasks (a few test variations each)."""
    tasks = list(SCIENCEWORLD_TABLE1)
    if profile == "ci":
        tasks = tasks[:: len(tasks) // 3][:3]
    variations = {"ci": 1, "laptop": 2, "paper": 20}[profile]
    return [_cfg(profile, results_dir, "naive-18", method="naive", task=task, n_test_variations=variations)
            for task in tasks]


def _or_reference_run(cfg: EMPO2Config, profile: str, results_dir: str) -> EMPO2Config:
    """A variant whose settings are the reference run's IS that run: trained once, shared."""
    reference = reference_run(profile, results_dir)
    same = dataclasses.replace(cfg, experiment=reference.experiment, run_name=reference.run_name) == reference
    return reference if same else cfg


def mode_ablation(profile: str, results_dir: str = "results") -> dict[str, list[EMPO2Config]]:
    """Full EMPO² vs without off-policy updates (q = 0) vs without on-policy-with-memory updates (q = 1), at the
    profile's budget: the runs of each variant, one per seed (the full method is the reference run)."""
    variants = {"EMPO2 (full)": {}, "without off-policy": {"q": 0.0}, "without on-policy with memory": {"q": 1.0}}
    return {label: [_or_reference_run(_cfg(profile, results_dir, "ablation-modes", task=MAIN_TASK, run_name=f"empo2-{name}",
                                           **values), profile, results_dir)]
            for (label, values), name in zip(variants.items(), ("full", "q0", "q1"))}


def pq_sweep(profile: str, results_dir: str = "results") -> dict[str, list[EMPO2Config]]:
    """p in (0.1, 0.25, 0.4, 0.7) at q = 2/3, and q in (0.3, 2/3, 0.85, 0.95) at p = 0.25, at the profile's budget:
    the runs of each value, one per seed."""
    runs = {f"p={p}": _cfg(profile, results_dir, "sweep-pq", task=MAIN_TASK, p=p, run_name=f"empo2-p{p}")
            for p in (0.1, 0.25, 0.4, 0.7)}
    for q in (0.3, 2 / 3, 0.85, 0.95):
        runs[f"q={q:.2f}"] = _cfg(profile, results_dir, "sweep-pq", task=MAIN_TASK, q=q, run_name=f"empo2-q{q:.2f}")
    return {label: [_or_reference_run(cfg, profile, results_dir)] for label, cfg in runs.items()}


def intrinsic_sweep(profile: str, results_dir: str = "results") -> dict[str, list[EMPO2Config]]:
    """Intrinsic reward weight: none, 0.5x, 1x, 2x, at the profile's budget: the runs of each weight, one per seed."""
    return {f"{c}x" if c else "none": [_or_reference_run(_cfg(profile, results_dir, "intrinsic", task=MAIN_TASK,
                                                              intrinsic_coef=c, run_name=f"empo2-int{c}"),
                                                         profile, results_dir)]
            for c in (0.0, 0.5, 1.0, 2.0)}


def webshop_runs(profile: str, results_dir: str = "results") -> list[EMPO2Config]:
    """Naive, memory-only, GRPO and EMPO² on the shipped WebShop data (Table 2 shape)."""
    runs = [_cfg(profile, results_dir, "webshop", env="webshop", method=m, seed=0) for m in ("naive", "memory_only")]
    runs += [_cfg(profile, results_dir, "webshop", env="webshop", method=m, seed=seed)
             for m in ("grpo", "empo2") for seed in SEEDS[profile]]
    return runs


COIN_SEEDS = SEEDS | {"laptop": (0, 1, 2, 3, 4)}
"""The seeds of `coin_runs`. At `laptop`, five: with seeds 0-2, EMPO² − GRPO was +13.3 [-1.7, +28.3], as wide
from the spread between seeds as from the 40 test games each plays, so seed 3 was added, and with seeds 0-3,
+10.0 [-3.1, +23.1], seed 4 (decisions taken after reading those seeds, which notebook 11 states)."""


def coin_runs(profile: str, results_dir: str = "results") -> list[EMPO2Config]:
    """Naive, memory-only, GRPO and EMPO² on TextWorldExpress's CoinCollector (notebook 11): EMPO² and GRPO first,
    seed by seed, so that a partly trained group already holds a comparison."""
    game = dict(env="textworld_express", task="coin")
    runs = [_cfg(profile, results_dir, "coin", method=m, seed=seed, **game)
            for seed in COIN_SEEDS[profile] for m in ("empo2", "grpo")]
    runs += [_cfg(profile, results_dir, "coin", method="naive", seed=seed, **game) for seed in COIN_SEEDS[profile]]
    return runs + [_cfg(profile, results_dir, "coin", method="memory_only", seed=0, **game)]


COIN_RETEST_GAMES = {"ci": 4, "laptop": 200, "paper": 400}
"""How many held-out games `coin_retests` plays at each profile: at `laptop` five times the runs' own 40 (each
game once). Chosen after reading seeds 0-3, whose EMPO² − GRPO interval crossed 0 and owed as much to those 40
games as to the spread between seeds (notebook 11 says so)."""


def coin_retests(profile: str, results_dir: str = "results") -> list[EMPO2Config]:
    """The final GRPO and EMPO² policies of `coin_runs`, every seed, tested again on `COIN_RETEST_GAMES` held-out
    games (`experiments.retest`; notebook 11). Their first games are those of the runs' own last evaluation, played
    with the same sampling seeds, so where the runs played them in whole groups (`group_size` games at once, as
    at `laptop`) those episodes replay it."""
    return [dataclasses.replace(cfg, n_test_variations=COIN_RETEST_GAMES[profile])
            for cfg in coin_runs(profile, results_dir)
            if cfg.method in ("grpo", "empo2")]


FEW_COIN_GAMES = {"ci": dict(n_train_variations=2), "laptop": dict(n_train_variations=10, iterations=100),
                  "paper": dict(n_train_variations=10)}
"""What `coin_few_games` changes in each profile's CoinCollector runs: 10 training games (at `laptop` for 100
iterations, 800 episodes). At `ci`, whose runs play 1 game, 2 games: only so that the two settings differ."""


def coin_few_games(profile: str, results_dir: str = "results") -> list[EMPO2Config]:
    """GRPO and EMPO² on CoinCollector trained on `FEW_COIN_GAMES` (notebook 11's contrast): with few training
    games a policy can learn their routes instead of learning to search, and scores far better on them than on
    held-out games."""
    game = dict(env="textworld_express", task="coin", **FEW_COIN_GAMES[profile])
    return [_cfg(profile, results_dir, "coin-10games", method=m, seed=seed, **game)
            for seed in SEEDS[profile] for m in ("empo2", "grpo")]


# ------------------------------------------------------------------ the CoinCollector study (planned before it runs)
@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm of the CoinCollector study: a method's settings and the seeds it trains (at `laptop`)."""

    label: str
    slug: str
    """Its runs' folder names: `<slug>-seed<k>` under `results/<profile>/coin-study/`."""
    settings: dict
    seeds: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Contrast:
    """A planned contrast of the study: Σ weight × (an arm's mean over its seeds of each seed's mean)."""

    name: str
    weights: dict[str, float]
    """Arm label -> weight."""
    paper: str
    """What the paper reports: every contrast is written so that the paper's direction is above 0 ("" where the
    paper reports no direction: the verdict is worded neutrally)."""
    strata: tuple[tuple[str, ...], ...] = ()
    """The arms whose seeds a permutation test shuffles among each other (`stats.contrast_p`); () for all."""
    measure: str = "test"
    """test: the final policy's score on the study's held-out games; entropy: the mean decision entropy of the tip-free
    training episodes of the last 20 iterations (`train/entropy/plain`)."""


FRESH_SEEDS = tuple(range(10, 20))
"""Seeds no CoinCollector run used before (the runs of notebook 11 so far: 0-4)."""
COIN_STUDY_ARMS = (
    Arm("EMPO²", "empo2", dict(method="empo2"), FRESH_SEEDS),
    Arm("GRPO", "grpo", dict(method="grpo"), FRESH_SEEDS),
    Arm("GRPO with the novelty bonus", "grpo-novelty", dict(method="empo2", p=0.0), FRESH_SEEDS[:5]),
    Arm("EMPO² without the novelty bonus", "empo2-no-novelty", dict(method="empo2", intrinsic_coef=0.0),
        FRESH_SEEDS[:5]),
    Arm("q = 0 (no off-policy updates)", "q0", dict(method="empo2", q=0.0), FRESH_SEEDS[:5]),
    Arm("q = 1 (off-policy updates only)", "q1", dict(method="empo2", q=1.0), FRESH_SEEDS[:5]),
    Arm("p = 0.1", "p0.1", dict(method="empo2", p=0.1), FRESH_SEEDS[:3]),
    Arm("p = 0.7", "p0.7", dict(method="empo2", p=0.7), FRESH_SEEDS[:3]),
    Arm("q = 0.3", "q0.3", dict(method="empo2", q=0.3), FRESH_SEEDS[:3]),
    Arm("q = 0.95", "q0.95", dict(method="empo2", q=0.95), FRESH_SEEDS[:3]),
    Arm("Naive", "naive", dict(method="naive"), FRESH_SEEDS[:5]),
    Arm("memory-only", "memory-only", dict(method="memory_only"), FRESH_SEEDS[:3]),
)
"""The arms: EMPO² (p = 0.25, q = 2/3, novelty bonus 1/n) and GRPO, 10 seeds each, the primary contrast; memory ×
novelty (GRPO with the bonus, EMPO² without it), 5 seeds each; the update modes (q = 0, q = 1), 5 each; the sweep's
other points, 3 each; the floors. All at the `laptop` CoinCollector budget (`TEXTWORLD_EXPRESS_VALUES`)."""

_MEMORY, _NO_MEMORY = ("EMPO²", "EMPO² without the novelty bonus"), ("GRPO with the novelty bonus", "GRPO")


def _slope(points: dict[str, float]) -> dict[str, float]:
    """The weights of the least-squares slope of the arms' means on their settings x: (x − x̄) / Σ(x − x̄)²."""
    x = dict(points)
    mean = sum(x.values()) / len(x)
    spread = sum((v - mean) ** 2 for v in x.values())
    return {label: (v - mean) / spread for label, v in x.items()}


COIN_STUDY_CONTRASTS = (
    Contrast("EMPO² − GRPO (primary)", {"EMPO²": 1, "GRPO": -1}, "EMPO² above GRPO (Fig. 1a)"),
    Contrast("memory, main effect", {"EMPO²": 0.5, "EMPO² without the novelty bonus": 0.5,
                                     "GRPO with the novelty bonus": -0.5, "GRPO": -0.5},
             "memory rollouts help (EMPO² above GRPO)",
             strata=(("EMPO²", "GRPO with the novelty bonus"), ("EMPO² without the novelty bonus", "GRPO"))),
    Contrast("novelty bonus, main effect", {"EMPO²": 0.5, "GRPO with the novelty bonus": 0.5,
                                            "EMPO² without the novelty bonus": -0.5, "GRPO": -0.5},
             "the novelty reward helps (App. F.2: 1x above none)", strata=(_MEMORY, _NO_MEMORY)),
    Contrast("memory × novelty, interaction", {"EMPO²": 1, "EMPO² without the novelty bonus": -1,
                                               "GRPO with the novelty bonus": -1, "GRPO": 1}, ""),
    Contrast("off-policy updates: full − (q = 0)", {"EMPO²": 1, "q = 0 (no off-policy updates)": -1},
             "full above q = 0 (§6, App. F)"),
    Contrast("on-policy updates with memory: full − (q = 1)", {"EMPO²": 1, "q = 1 (off-policy updates only)": -1},
             "full above q = 1 (§6, App. F)"),
    Contrast("p trend: slope over p = 0, 0.1, 0.25 (per unit of p)",
             _slope({"GRPO with the novelty bonus": 0.0, "p = 0.1": 0.1, "EMPO²": 0.25}),
             "rising (App. F.1: p = 0.1 collapses to GRPO, 0.25 learns)"),
    Contrast("p = 0.7 − p = 0.25", {"p = 0.7": 1, "EMPO²": -1}, ""),
    Contrast("q ordering: (q = 2/3) − mean of q = 0.3 and q = 0.95", {"EMPO²": 1, "q = 0.3": -0.5, "q = 0.95": -0.5},
             "q = 2/3 above both (App. F.1: 0.3 and 0.95 learn worse)"),
    Contrast("q trend: slope over q = 0, 0.3, 2/3, 0.95, 1 (per unit of q)",
             _slope({"q = 0 (no off-policy updates)": 0.0, "q = 0.3": 0.3, "EMPO²": 2 / 3, "q = 0.95": 0.95,
                     "q = 1 (off-policy updates only)": 1.0}), ""),
    Contrast("EMPO² − Naive (floor)", {"EMPO²": 1, "Naive": -1}, "EMPO² above the untrained model (Table 1)"),
    Contrast("EMPO² − memory-only (floor)", {"EMPO²": 1, "memory-only": -1},
             "EMPO² above a memory without weight updates (Table 1)"),
    Contrast("novelty bonus and the policy's entropy, main effect", {"EMPO²": 0.5, "GRPO with the novelty bonus": 0.5,
                                                                     "EMPO² without the novelty bonus": -0.5, "GRPO": -0.5},
             "the novelty bonus maintains the policy's entropy (App. F.2)", strata=(_MEMORY, _NO_MEMORY),
             measure="entropy"),
)
"""The planned contrasts, each reported with its 95% t-interval (`stats.contrast`: Welch-Satterthwaite over the arms'
seed means, coverage tested at these seed counts in tests/test_stats.py) and permutation p (`stats.contrast_p`),
whatever they show; a verdict is worded for the paper's direction where it reports one (`stats.verdict`)."""

COIN_STUDY_TEST_GAMES = {"ci": 4, "laptop": 200, "paper": 400}
"""The study's test: each final policy on the first this many held-out games (the test fold's), once each at the
evaluation temperature (0.4), without memory (memory-only with its memory)."""
COIN_STUDY_DTYPE = "bfloat16"
"""Every run of the study is trained with EMPO2_DTYPE set to this (saved as `policy_dtype`); a machine without bf16
instructions (18x slower there) trains none of them."""


def coin_study(profile: str, results_dir: str = "results") -> dict[str, list[EMPO2Config]]:
    """The study's runs, by arm label (at `ci`, seeds 0 and 1 for every arm, to test the plumbing)."""
    game = dict(env="textworld_express", task="coin")
    return {arm.label: [_cfg(profile, results_dir, "coin-study", seed=seed, run_name=f"{arm.slug}-seed{seed}",
                             **game, **arm.settings)
                        for seed in (arm.seeds if profile != "ci" else (0, 1))]
            for arm in COIN_STUDY_ARMS}


def coin_study_tests(profile: str, results_dir: str = "results") -> dict[str, list[EMPO2Config]]:
    """The study's test of every run (`experiments.retest`): its final policy on `COIN_STUDY_TEST_GAMES` games."""
    return {label: [dataclasses.replace(cfg, n_test_variations=COIN_STUDY_TEST_GAMES[profile]) for cfg in configs]
            for label, configs in coin_study(profile, results_dir).items()}


def coin_study_order(profile: str, results_dir: str = "results") -> list[EMPO2Config]:
    """The order the study trains in: seed by seed, every arm of that seed, so that a study stopped part-way holds
    every arm at the seeds it reached (the arms' seeds are prefixes of the same fresh seeds)."""
    runs = coin_study(profile, results_dir)
    seeds = sorted({cfg.seed for configs in runs.values() for cfg in configs})
    return [cfg for seed in seeds for configs in runs.values() for cfg in configs if cfg.seed == seed]


def coin_study_plan(profile: str = "laptop") -> str:
    """The plan, as markdown (notebook 11 and docs/results.md print it): arms, seeds, budget, test, contrasts."""
    cfg = EMPO2Config.from_profile(profile, env="textworld_express", task="coin")
    count = lambda *methods: sum(len(c) for label, c in coin_study(profile).items()  # noqa: E731
                                 if c[0].method in methods)
    lines = [f"**Budget.** Every run at the `{profile}` CoinCollector budget: {cfg.iterations} iterations × "
             f"{cfg.group_size} episodes of at most {cfg.max_steps} steps on {cfg.n_train_variations} training games "
             f"({cfg.game_params}), evaluated on {cfg.n_test_variations} held-out games every {cfg.eval_every} "
             f"iterations, in {COIN_STUDY_DTYPE}; {count('empo2', 'grpo')} runs that train weights, "
             f"{count('memory_only')} memory-only runs and {count('naive')} Naive evaluations, all from one clean "
             "commit, trained seed by seed (`python -m empo2.analysis.suite laptop coin-study`) into the experiment folder "
             f"`coin-study`, seeds {FRESH_SEEDS[0]}–{FRESH_SEEDS[-1]}, which no CoinCollector run used before (at "
             "`ci`, seeds 0 and 1 in every arm, to test the plumbing).",
             f"**Test.** Each final policy on the first {COIN_STUDY_TEST_GAMES[profile]} held-out games, once each at "
             f"temperature {cfg.eval_temperature}, without memory (memory-only with its own).", "",
             "| arm | settings | seeds |", "|---|---|---|"]
    seeds = {label: [c.seed for c in configs] for label, configs in coin_study(profile).items()}
    lines += [f"| {arm.label} | {', '.join(f'{k}={v}' for k, v in arm.settings.items())} | "
              f"{len(seeds[arm.label])} ({seeds[arm.label][0]}–{seeds[arm.label][-1]}) |" for arm in COIN_STUDY_ARMS]
    lines += ["", "| planned contrast | arms (weight) | the paper |", "|---|---|---|"]
    lines += [f"| {c.name}{' (decision entropy)' if c.measure == 'entropy' else ''} | "
              f"{', '.join(f'{label} ({w:+.3g})' for label, w in c.weights.items())} | {c.paper or 'no direction'} |"
              for c in COIN_STUDY_CONTRASTS]
    lines += ["", "Each contrast is reported with its 95% t-interval over the arms' seed means (Welch-Satterthwaite; "
              "coverage tested at these seed counts) and a permutation p (seeds shuffled among the arms compared, "
              "within the strata of a main effect), whatever it shows; a verdict of reproduced needs the interval on the "
              "paper's side and p < 0.05. Anything computed after reading the runs is labelled so."]
    return "\n".join(lines)


GROUPS = {
    "main": main_comparison, "baselines": baselines, "temperature": training_temperature, "naive18": naive_all_tasks,
    "ablation": mode_ablation, "sweep": pq_sweep, "intrinsic": intrinsic_sweep, "webshop": webshop_runs,
    "coin": coin_runs, "coin10": coin_few_games,
}
"""The runs each notebook reads (tests check that every laptop run of these is committed)."""


def group_configs(group: str, profile: str, results_dir: str = "results") -> list[EMPO2Config]:
    """The runs of one of `GROUPS`, as a list (the variant groups label lists of runs in a dict)."""
    configs = GROUPS[group](profile, results_dir)
    return [cfg for runs in configs.values() for cfg in runs] if isinstance(configs, dict) else configs


def unfinished(profile: str, results_dir: str = "results") -> list[str]:
    """The runs of every group with no finished run of their config (what the notebooks would train), as
    "group: experiment/run", and the `coin_retests` with no saved evaluation (what notebook 11 would evaluate)."""
    from empo2.analysis.experiments import is_finished, saved_retest

    runs = [f"{group}: {cfg.experiment}/{cfg.name}" for group in GROUPS
            for cfg in group_configs(group, profile, results_dir) if not is_finished(cfg)]
    return runs + [f"coin retest: {cfg.experiment}/{cfg.name} on {cfg.n_test_variations} test games"
                   for cfg in coin_retests(profile, results_dir) if saved_retest(cfg) is None]


def train_coin_study(profile: str, results_dir: str = "results") -> None:
    """Train (or reuse) the study's runs in `coin_study_order`, each followed by its test, in `COIN_STUDY_DTYPE`:
    a machine that would train in another precision stops before anything starts.

    Started several times side by side (lanes: on 2 cores, twice with OMP_NUM_THREADS=1 and jemalloc, see
    docs/performance.md), each process takes the next run no other lane holds (`experiments.lane_claim`)."""
    import os

    from empo2.analysis.experiments import lane_claim, retest, run
    from empo2.llm.models import DTYPE_VARIABLE, fast_bfloat16

    if os.environ.setdefault(DTYPE_VARIABLE, COIN_STUDY_DTYPE) != COIN_STUDY_DTYPE or not fast_bfloat16():
        raise SystemExit(f"error: {DTYPE_VARIABLE}: the CoinCollector study trains in {COIN_STUDY_DTYPE} only, on a "
                         f"machine with bfloat16 instructions (this one: {fast_bfloat16()}; {DTYPE_VARIABLE}="
                         f"{os.environ[DTYPE_VARIABLE]})")
    tests = {cfg.run_dir: cfg for configs in coin_study_tests(profile, results_dir).values() for cfg in configs}
    held = []
    for cfg in coin_study_order(profile, results_dir):
        with lane_claim(cfg.run_dir) as mine:
            if not mine:
                held.append(cfg.name)
                continue
            run(cfg, show_progress=False)
            retest(tests[cfg.run_dir], show_progress=False)
        print(f"finished {cfg.experiment}/{cfg.name} and its test on {tests[cfg.run_dir].n_test_variations} games",
              flush=True)
    if held:
        print(f"left to the other lanes, which held them: {', '.join(held)}", flush=True)


def main(argv: list[str] | None = None) -> None:
    """`python -m empo2.analysis.suite PROFILE GROUP [GROUP ...]`: train (or reuse) those runs in order (coin-study: the
    CoinCollector study, each run with its test)."""
    import argparse

    from empo2.analysis.experiments import run

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("profile", choices=("ci", "laptop", "paper"))
    parser.add_argument("groups", nargs="+", choices=sorted(GROUPS) + ["coin-study"])
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    if "coin-study" in args.groups:
        train_coin_study(args.profile, args.results_dir)
    for group in (g for g in args.groups if g != "coin-study"):
        for cfg in group_configs(group, args.profile, args.results_dir):
            run(cfg, force=args.force, show_progress=False)
            print(f"finished {cfg.experiment}/{cfg.name}", flush=True)


if __name__ == "__main__":
    main()
