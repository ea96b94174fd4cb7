"""EMPO2Config: every knob of a run, with its help text, validation and named profiles.

    cfg = EMPO2Config.from_profile("laptop", method="grpo", task="power-component", seed=1)

Profiles:
    ci      minutes on a 2-core CPU: tiny budgets, the real ScienceWorld and default model
    laptop  at most about 30 minutes per training run on a 2-core CPU (constrained action decoding)
    paper   the paper's settings (its appendix D) with Qwen2.5-7B-Instruct, for GPUs

Methods are configurations of the same trainer:
    empo2        memory rollouts with probability p, off-policy updates with probability q
    grpo         p = 0, no tips, no intrinsic reward
    naive        evaluation of the base model only, no training
    memory_only  every rollout memory-augmented, tips written, no weight updates
                 (the Reflexion-style non-parametric baseline; evaluated with memory)
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

from empo2.envs import ENV_NAMES
from empo2.prompts import TIP_TEMPLATES

METHODS = ("empo2", "grpo", "naive", "memory_only")
PROFILES = ("ci", "laptop", "paper")
CHOICES = {
    "method": METHODS, "profile": PROFILES, "env": ENV_NAMES, "mode_granularity": ("rollout", "iteration"),
    "memory_scope": ("variation", "task"), "delta_mode": ("token", "sequence", "none"),
    "prompt_style": ("chat", "single_turn"), "action_decoding": ("free", "constrained"),
    "tip_decoding": ("free", "constrained"), "tip_template": TIP_TEMPLATES, "webshop_goals": ("synthetic", "human"),
    "webshop_query": ("free", "words"), "rollout_engine": ("transformers", "vllm"),
    "vllm_constraint": ("tokens", "choice"), "vllm_weight_sync": ("adapter", "weights"),
}
"""The allowed values of each option that takes one of a few, declared once: `validate`, the command line and the
modules that take these options check against this."""
SPLIT_FIELDS = ("n_train_variations", "n_test_variations")


_FIELD_TYPES = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}
_A_TYPE = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}


@dataclass
class EMPO2Config:
    # --- experiment -------------------------------------------------------------
    method: str = "empo2"
    """Which method: empo2, grpo, naive, memory_only (see the module docstring)."""
    profile: str = "laptop"
    """The preset these values started from: ci, laptop or paper (recorded, not re-applied; it names the
    results folder). Only `EMPO2Config.from_profile` applies a preset: a bare `EMPO2Config()` holds each field's own
    default, not the laptop profile's values, although it is filed under "laptop"."""
    experiment: str = ""
    """The experiment's folder under `results_dir/profile/`; empty means the task's name (ScienceWorld,
    TextWorldExpress) or the environment's (webshop, corridor), the folders the notebooks read."""
    run_name: str = ""
    """Run folder name; empty means `<method>-<task>-seed<seed>`."""
    results_dir: str = "results"
    """Root folder of all results: a run lives in `results_dir/profile/experiment/run_name/` (`run_dir`),
    whether the command line, a notebook or a script made it."""
    seed: int = 0
    """Seeds Python, NumPy and torch (sampling, mode draws, variation order)."""
    # --- environment --------------------------------------------------------------
    env: str = "scienceworld"
    """Environment: scienceworld, webshop, textworld_express (a fast text game) or corridor (a toy world for tests)."""
    task: str = "power-component"
    """ScienceWorld task name, or TextWorldExpress game (coin, ...); ignored by single-task environments."""
    n_train_variations: int = 5
    """Train on the first N variations of the task's train split (paper: 5); at most the split's size (a profile's
    value is cut to it, a value given is refused above it)."""
    n_test_variations: int = 5
    """Evaluate on the first M variations of the test split (paper: up to 20; power-component has 5); at most the
    split's size, as n_train_variations."""
    max_steps: int = 0
    """Episode step limit; 0 means the task's own default (30 for most ScienceWorld tasks)."""
    jvm_heap: str = "1g"
    """Java heap cap of each ScienceWorld JVM."""
    game_params: str = ""
    """TextWorldExpress game parameters, e.g. "numLocations=5,numDistractorItems=0,includeDoors=1,limitInventorySize=0"
    (the difficulty); empty: the game's default in `empo2.envs.textworld_express.DEFAULT_PARAMS`."""
    webshop_products: str = ""
    """WebShop products in the official format (items_shuffle_1000.json, items_shuffle.json, or
    JSONL); empty: the shipped data/webshop/products_100.jsonl (100 products)."""
    webshop_instructions: str = ""
    """WebShop attributes/instructions (items_ins_v2_1000.json or items_ins_v2.json); empty: the shipped one."""
    webshop_goals: str = "synthetic"
    """WebShop goals: synthetic (built from the instructions file) or human (items_human_ins.json)."""
    webshop_query: str = "free"
    """WebShop's search query: free (any text after `search[` until `]`; the prompt names the form
    `search[your query]`), or words (with constrained action decoding: only words of the goal
    instruction, which the policy picks one at a time from its renormalised probabilities, then `]`;
    the prompt shows no placeholder to copy; an item's page lists `click[buy now]` first, and a chat prompt's first
    turn says that it buys, so that the untrained policy sometimes buys: `WebShopEnv.buy_first`)."""
    webshop_human_goals: str = ""
    """WebShop human goals file (items_human_ins.json) for webshop_goals=human; empty: data/webshop's, if any."""
    # --- models -------------------------------------------------------------------
    model: str = "smollm2-135m"
    """Policy: `smollm2-135m` (embedded), a local folder, or a Hugging Face id already on disk."""
    embedder: str = "all-minilm-l6-v2"
    """State embedder for memory keys and novelty (embedded default, 384-d)."""
    init_weights: str = ""
    """Start from another run's trained weights: its folder as `experiment/run_name` under
    `results_dir/profile` (its `final_weights.pt`); empty: the base model. With method naive this evaluates a trained policy."""
    lora_rank: int = 8
    """LoRA rank; 0 trains all weights (full fine-tuning)."""
    lora_alpha: int = 16
    """LoRA scaling numerator (scale = alpha / rank)."""
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Linear layers that get LoRA adapters."""
    device: str = "cpu"
    """Torch device of the policy: cpu or cuda."""
    # --- rollout ------------------------------------------------------------------
    group_size: int = 8
    """Rollouts per task variation (GRPO group, paper: 8)."""
    groups_per_iteration: int = 16
    """Task variations (groups) sampled per iteration (release: 16)."""
    response_tokens: int = 32
    """Max new tokens per action (paper: 32 for ScienceWorld)."""
    tip_tokens: int = 100
    """Max new tokens of a free-text tip (the paper's prompt asks for at most 100 words); a constrained
    tip ends by itself."""
    tip_decoding: str = "free"
    """free: the policy writes its tip as text, asked with the paper's prompt; constrained: it fills a
    template whose slots take only text from its episode, "Helpful: <an action it took>. Avoid: <an
    action it took>. Next, try: <an admissible action it saw>." (`prompts.tip_template`), choosing each
    slot from its own probabilities renormalised over that slot's token trie, as it chooses actions;
    such a tip always ends by itself."""
    tip_template: str = "helpful_avoid_next"
    """The slots of a constrained tip (`prompts.tip_template`): helpful_avoid_next, the three slots above
    whatever the score (both of the first two take the episode's actions, so one action can fill both);
    by_score, "Helpful: <an action it took>. Next, try: <...>." after a score above 0, and "Avoid: <an
    action it took>. Next, try: <...>." otherwise, the tip prompt asking for those slots only."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts (paper: 1.0)."""
    eval_temperature: float = 0.4
    """Sampling temperature of evaluation rollouts (paper: 0.4)."""
    reuse_cache: bool = True
    """Keep each episode's KV cache across turns (prefill only new tokens); chat prompts only."""
    prompt_style: str = "chat"
    """chat: one growing conversation (full history); single_turn: a fresh prompt each step with recent history."""
    history_turns: int = 2
    """single_turn prompts: how many recent (action, observation) pairs to show."""
    action_decoding: str = "free"
    """free: the policy writes text, snapped to the most similar admissible action (the paper);
    constrained: it samples only token sequences that spell an admissible action of the current
    state, from its distribution renormalised over those tokens, in rollouts and in the update."""
    think_first: bool = True
    """single_turn prompts: ask for reasoning in <think> before the <action> (needs a few hundred
    response tokens); False asks for the action alone, for short response budgets."""
    rollout_engine: str = "transformers"
    """Who samples rollouts: transformers (the policy itself, any device) or vllm (a vLLM engine beside the
    policy: on a GPU with the gpu extra, on a CPU with vLLM's CPU build (`make vllm-check`); the policy's
    weights reach it as vllm_weight_sync says). See empo2.llm.vllm_engine."""
    vllm_weight_sync: str = "adapter"
    """vllm: how the policy's weights reach the engine when they change. adapter: the LoRA adapter, saved under a new
    id and applied by vLLM's LoRA kernels (LoRA only; exact in any dtype); weights: every weight, each LoRA layer
    merged, reloaded into the engine in place, which then samples at the base model's speed (about 3x faster decode
    steps on a CPU, `benchmarks/bench.py --engines`). Full fine-tuning needs weights; with LoRA, merging into bf16
    rounds most of a young adapter's change away (77-83% at iterations 10-20 of a laptop run,
    `benchmarks/merge_precision.py`), so there use it in float32 or not at all."""
    vllm_constraint: str = "tokens"
    """vllm + constrained decoding: tokens (exact: the trie's allowed ids, one engine call per decision token)
    or choice (one call per action through vLLM's structured outputs; a wider set than the trie)."""
    vllm_gpu_memory: float = 0.35
    """device cuda: fraction of the GPU's memory the vLLM engine takes (the policy and its optimiser share the GPU)."""
    vllm_cpu_kv_cache_gib: int = 4
    """device cpu: GiB of RAM for the vLLM engine's KV cache (vLLM's VLLM_CPU_KVCACHE_SPACE); a CPU has no
    memory fraction to give, and vLLM would otherwise take its default."""
    # --- EMPO² --------------------------------------------------------------------
    p: float = 0.25
    """Probability that a rollout is memory-augmented (paper: 0.25)."""
    q: float = 2 / 3
    """Probability that a memory rollout gets an off-policy update (paper: 2/3)."""
    mode_granularity: str = "rollout"
    """Draw modes per rollout (paper's algorithm) or per iteration (the release)."""
    memory_capacity: int = 1000
    """Tips kept per memory scope; the oldest is evicted (paper: 1000)."""
    similarity_threshold: float = 0.5
    """Retrieve tips whose key has cosine similarity above this to the current state."""
    top_k: int = 10
    """Show at most this many retrieved tips, best episode score first (paper: 10)."""
    repeat_tips: bool = True
    """Show a retrieved tip again at every later step that retrieves it (the paper: each turn shows its top_k);
    False shows each tip once per episode, at the first step that retrieves it (it stays in the conversation)."""
    memory_scope: str = "variation"
    """One memory per task variation (release) or per task."""
    intrinsic_coef: float = 1.0
    """Weight of the novelty reward 1/n added to the episode return (0 switches it off)."""
    novelty_threshold: float = 0.9
    """Cosine similarity above which two states count as the same state for novelty."""
    # --- update -------------------------------------------------------------------
    lr: float = 1e-5
    """AdamW learning rate (paper: 1e-6 full fine-tuning; LoRA needs a larger one)."""
    clip_low: float = 0.2
    """PPO clip range below 1 (ratio >= 1 - clip_low)."""
    clip_high: float = 0.3
    """PPO clip range above 1 (clip-higher, ratio <= 1 + clip_high)."""
    dual_clip: float = 10.0
    """Dual-clip constant bounding the loss of negative-advantage tokens."""
    delta: float = 0.0067
    """Off-policy tokens whose tip-free probability is below delta get no gradient (e^-5)."""
    delta_mode: str = "token"
    """How the delta mask applies: token, sequence (whole turn) or none."""
    kl_beta: float = 0.0
    """Weight of the KL penalty to the initial policy (0 for ScienceWorld, 0.01 WebShop): with LoRA the
    adapter-free base model, with full fine-tuning a frozen bf16 copy of the initial weights."""
    ppo_epochs: int = 1
    """Passes over the iteration's episodes."""
    minibatch_episodes: int = 0
    """Episodes per optimiser step; 0 means all episodes of the iteration in one step."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm."""
    packed_logprobs: bool = True
    """Score a whole append-only episode in one forward pass (else one pass per turn)."""
    shard_optimizer: bool = False
    """With several processes, each keeps only its 1/W share of AdamW's state (ZeRO stage 1, torch's
    ZeroRedundancyOptimizer): 8 bytes a trained parameter become 8/W. For full fine-tuning of large
    models; one process ignores it."""
    # --- schedule -----------------------------------------------------------------
    iterations: int = 20
    """Training iterations (naive: ignored; it only evaluates)."""
    eval_every: int = 5
    """Evaluate (without memory) every k iterations, and after the last."""
    eval_variations: int = 0
    """Test variations per evaluation; 0 means all n_test_variations."""
    eval_samples: int = 1
    """Episodes per test variation at each evaluation (sampled at eval_temperature)."""
    checkpoint_every: int = 5
    """Save a resumable checkpoint every k iterations (0: only at the end)."""

    # ------------------------------------------------------------------------------
    def __post_init__(self):
        self.lora_target_modules = tuple(self.lora_target_modules)
        self.validate()
        if not self.experiment:
            self.experiment = self.task if self.has_tasks else self.env

    def validate(self) -> None:
        """Raise ValueError naming the first field that is out of range."""
        for spec in fields(self):
            value, kinds = getattr(self, spec.name), _FIELD_TYPES.get(spec.type)
            if kinds and (not isinstance(value, kinds) or (spec.type != "bool" and isinstance(value, bool))):
                raise ValueError(f"{spec.name}: {value!r} is not allowed; need {_A_TYPE[spec.type]}")
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}: {value!r} is not allowed; choose one of {', '.join(allowed)}")
        if self.env == "scienceworld":
            from empo2.envs.scienceworld import TASK_NAMES

            if self.task not in TASK_NAMES:
                raise ValueError(f"task: {self.task!r} is not a ScienceWorld task; choose one of {', '.join(TASK_NAMES)}")
        if self.env == "textworld_express":
            from empo2.envs.textworld_express import GAME_NAMES, parse_game_params

            if self.task not in GAME_NAMES:
                raise ValueError(f"task: {self.task!r} is not a TextWorldExpress game; choose one of {', '.join(GAME_NAMES)}")
            parse_game_params(self.task, self.game_params)
        elif self.game_params:
            raise ValueError(f"game_params: {self.game_params!r} is not allowed with env {self.env}; only "
                             "TextWorldExpress games (env textworld_express) take parameters")
        if self.tip_template != "helpful_avoid_next" and self.tip_decoding != "constrained":
            raise ValueError(f"tip_template: {self.tip_template!r} needs tip_decoding 'constrained' (free tips have no slots)")
        if self.webshop_query == "words" and self.action_decoding != "constrained":
            raise ValueError("webshop_query: 'words' needs action_decoding 'constrained' (free text is not constrained)")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device: {self.device!r} is not allowed; use cpu or cuda[:N]")
        if self.rollout_engine == "vllm" and self.trains_weights and self.lora_rank == 0 and self.vllm_weight_sync == "adapter":
            raise ValueError("vllm_weight_sync: 'adapter' is not allowed with lora_rank 0 when training (there is no "
                             "adapter to send); use 'weights'")
        if not 0 < self.vllm_gpu_memory <= 1:
            raise ValueError(f"vllm_gpu_memory: {self.vllm_gpu_memory} is out of range; allowed (0, 1]")
        if not self.vllm_cpu_kv_cache_gib >= 1:
            raise ValueError(f"vllm_cpu_kv_cache_gib: {self.vllm_cpu_kv_cache_gib} is out of range; allowed >= 1")
        ranges = {
            "p": (0.0, 1.0), "q": (0.0, 1.0), "similarity_threshold": (-1.0, 1.0),
            "novelty_threshold": (-1.0, 1.0), "clip_low": (0.0, 1.0), "delta": (0.0, 1.0),
        }
        for name, (low, high) in ranges.items():
            value = getattr(self, name)
            if not (low <= value <= high):
                raise ValueError(f"{name}: {value} is out of range; allowed [{low}, {high}]")
        minimums = {
            "group_size": 2, "groups_per_iteration": 1, "n_train_variations": 1, "n_test_variations": 1,
            "response_tokens": 1, "tip_tokens": 1, "memory_capacity": 1, "top_k": 1, "ppo_epochs": 1,
            "iterations": 0, "eval_every": 1, "max_steps": 0, "lora_rank": 0, "lora_alpha": 1,
            "minibatch_episodes": 0, "eval_variations": 0, "eval_samples": 1, "checkpoint_every": 0, "seed": 0, "history_turns": 0,
        }
        for name, low in minimums.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name}: {value!r} is not allowed; need an integer >= {low}")
        self.validate_split_sizes()
        positives = {"lr": self.lr, "clip_high": self.clip_high, "max_grad_norm": self.max_grad_norm}
        for name, value in positives.items():
            if not value > 0:
                raise ValueError(f"{name}: {value} is not allowed; need a number > 0")
        non_negative = {"temperature": self.temperature, "eval_temperature": self.eval_temperature,
                        "intrinsic_coef": self.intrinsic_coef, "kl_beta": self.kl_beta}
        for name, value in non_negative.items():
            if not value >= 0:
                raise ValueError(f"{name}: {value} is not allowed; need a number >= 0")
        if not self.dual_clip > 1:
            raise ValueError(f"dual_clip: {self.dual_clip} is not allowed; need a number > 1")
        if self.eval_variations > self.n_test_variations:
            raise ValueError(
                f"eval_variations: {self.eval_variations} is not allowed; need <= n_test_variations "
                f"({self.n_test_variations})"
            )
        for name in ("webshop_products", "webshop_instructions", "webshop_human_goals"):
            path = getattr(self, name)
            if path and not os.path.isfile(os.path.expanduser(path)):
                raise ValueError(f"{name}: {path!r} is not a file; give the path of WebShop's official file, "
                                 "or leave it empty for the shipped data")
        if not self.lora_target_modules and self.lora_rank > 0:
            raise ValueError("lora_target_modules: empty; name at least one module, or set lora_rank 0")

    def validate_split_sizes(self, sizes: tuple[int, int] | None = None) -> None:
        """Raise ValueError where a run asks for more test (or, when it plays training episodes, training)
        variations than its task's split holds: the (training, test) `sizes` a built environment has, or by
        default those known without starting one (`envs.split_sizes`; none for WebShop)."""
        from empo2.envs import split_sizes

        sizes = sizes or split_sizes(self.env, self.task)
        if sizes is None:
            return
        for name, size, split in zip(SPLIT_FIELDS, sizes, ("training", "test")):
            value = getattr(self, name)
            if value > size and (name != "n_train_variations" or self.plays_training_episodes):
                where = self.task if self.has_tasks else self.env
                raise ValueError(f"{name}: {value} is more than {where}'s {split} split holds ({size} "
                                 f"variations); allowed 1..{size}")

    # --- what the method implies -------------------------------------------------------
    @property
    def rollout_p(self) -> float:
        """Memory-rollout probability actually used."""
        return {"empo2": self.p, "grpo": 0.0, "naive": 0.0, "memory_only": 1.0}[self.method]

    @property
    def rollout_q(self) -> float:
        return self.q if self.method == "empo2" else 0.0

    @property
    def loss_settings(self) -> dict:
        """The keyword arguments of `loss.policy_loss` this config sets (besides the tensors and normaliser)."""
        return {"clip_low": self.clip_low, "clip_high": self.clip_high, "dual_clip": self.dual_clip,
                "delta": self.delta, "delta_mode": self.delta_mode, "kl_beta": self.kl_beta}

    @property
    def writes_tips(self) -> bool:
        return self.method in ("empo2", "memory_only")

    @property
    def plays_training_episodes(self) -> bool:
        """Every method but naive (which only evaluates) plays on the training variations."""
        return self.method != "naive"

    @property
    def trains_weights(self) -> bool:
        return self.method in ("empo2", "grpo")

    @property
    def uses_novelty(self) -> bool:
        return self.method == "empo2" and self.intrinsic_coef > 0

    @property
    def eval_with_memory(self) -> bool:
        """Only the non-parametric baseline is evaluated with its memory; EMPO² is tested without."""
        return self.method == "memory_only"

    @property
    def has_tasks(self) -> bool:
        """The environment has several tasks (ScienceWorld's, TextWorldExpress's games), named by `task`."""
        return self.env in ("scienceworld", "textworld_express")

    @property
    def name(self) -> str:
        return self.run_name or f"{self.method}-{self.task if self.has_tasks else self.env}-seed{self.seed}"

    @property
    def run_dir(self) -> Path:
        """The run's folder: `results_dir/profile/experiment/run_name/` (one layout for every caller)."""
        return Path(self.results_dir) / self.profile / self.experiment / self.name

    # --- construction and (de)serialisation ---------------------------------------------
    @classmethod
    def from_profile(cls, profile: str = "laptop", **overrides) -> "EMPO2Config":
        """Start from a named profile, then apply overrides (unknown names are an error)."""
        if profile not in PROFILES:
            raise ValueError(f"profile: {profile!r} is not allowed; choose one of {', '.join(PROFILES)}")
        values = {**PROFILE_VALUES[profile], "profile": profile}
        env = overrides.get("env", values.get("env", "scienceworld"))
        values.update(ENV_VALUES.get(env, {}).get(profile, {}))
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown config field(s): {', '.join(sorted(unknown))}")
        # A profile's split sizes are upper bounds ("up to 20 test variations"): a task with fewer gets all it has,
        # and the config says so. A size the caller asks for is checked as given (`validate_split_sizes`).
        from empo2.envs import split_sizes

        sizes = split_sizes(env, overrides.get("task", values.get("task", cls.task)))
        evaluates_only = overrides.get("method", values.get("method", cls.method)) == "naive"
        for name, size in zip(SPLIT_FIELDS, sizes or ()):
            if name not in overrides and not (evaluates_only and name == "n_train_variations"):
                values[name] = min(values.get(name, getattr(cls, name)), size)
        values.update(overrides)
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "EMPO2Config":
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown config field(s): {', '.join(sorted(unknown))}")
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @staticmethod
    def help() -> dict[str, str]:
        """Field name -> its help text (the docstring under the field)."""
        return dict(_FIELD_HELP)


PROFILE_VALUES: dict[str, dict] = {
    # Each notebook/test in minutes: still the real ScienceWorld JVM and the real model.
    "ci": dict(
        group_size=2, groups_per_iteration=1, n_train_variations=1, n_test_variations=1, max_steps=3,
        response_tokens=12, tip_tokens=16, iterations=2, eval_every=2, checkpoint_every=1,
        lora_rank=4, lora_alpha=8, lr=1e-4, action_decoding="constrained", tip_decoding="constrained",
    ),
    # At most about 30 minutes per training run on a 2-core CPU: one group of 8 episodes of at most
    # 15 steps per iteration, 10 iterations (80 training episodes, 2 optimiser steps each iteration),
    # and one evaluation of 20 test episodes (5 test variations x 4 samples; power-component's test
    # split has only 5 variations) at the end. Constrained decoding: the 135M model cannot write
    # ScienceWorld commands, so it chooses among the admissible ones. Each retrieved tip is shown once
    # per episode (repeat_tips=False): an EMPO2 iteration then takes about 124 s here instead of 364 s
    # (`python benchmarks/bench.py`), against about 88 s for GRPO.
    # 15 steps, not power-component's 30: the conversation, and so the cache, grows every step, and a
    # group of 8 x 30 steps takes about 3 times as long as 8 x 15 (and more memory than 24 GB with tips).
    # Constrained tips: the 135M model's free-text tips name nothing of their episode and run past any budget.
    "laptop": dict(
        group_size=8, groups_per_iteration=1, n_train_variations=5, n_test_variations=5, eval_samples=4,
        max_steps=15, response_tokens=12, tip_tokens=32, iterations=10, eval_every=10, checkpoint_every=2,
        minibatch_episodes=4, lora_rank=8, lora_alpha=16, lr=1e-4, action_decoding="constrained",
        tip_decoding="constrained", repeat_tips=False,
    ),
    # The paper's settings (appendix D) with Qwen2.5-7B-Instruct: full fine-tuning at lr 1e-6 on GPUs.
    "paper": dict(
        model="Qwen/Qwen2.5-7B-Instruct", device="cuda", lora_rank=0, lr=1e-6, shard_optimizer=True,
        group_size=8, groups_per_iteration=16, n_train_variations=5, n_test_variations=20,
        # 100 words are about 130 of Qwen2.5's tokens: a budget of 160 lets a tip of the asked length end itself.
        response_tokens=32, tip_tokens=160, iterations=250, eval_every=10, checkpoint_every=10,
        minibatch_episodes=32,
        # Full fine-tuning: a vLLM engine (--set rollout_engine=vllm) can only be sent the whole weights.
        vllm_weight_sync="weights",
    ),
}

# WebShop differs from ScienceWorld in the paper: 15 steps, 512-token responses, KL 0.01.
# The WebShop RL baselines' prompt: a fresh single-turn prompt per step with the recent history.
WEBSHOP_VALUES: dict[str, dict] = {
    "paper": dict(max_steps=15, response_tokens=512, kl_beta=0.01, prompt_style="single_turn", history_turns=2,
                  n_test_variations=100),
    # A 2-core CPU budget: shorter episodes and responses with no room for reasoning, the growing
    # conversation of the ScienceWorld runs (its KV cache is reused across turns and the update is one
    # packed pass per episode; the 135M model also follows it far better than the single-turn prompt),
    # and no KL term, so that groups whose scores are all equal cost no update at all. The 135M policy
    # cannot spell a query (free text, it copies the prompt's placeholder), so it searches with the goal's words.
    "laptop": dict(max_steps=8, response_tokens=20, kl_beta=0.0, prompt_style="chat",
                   n_train_variations=20, n_test_variations=8, iterations=4, eval_every=4,
                   webshop_query="words"),
    "ci": dict(max_steps=3, kl_beta=0.01, prompt_style="single_turn", history_turns=2, webshop_query="words"),
}

# TextWorldExpress: a game whose steps cost almost nothing (the JVM steps in about a millisecond), so that the
# policy's own cost sets the budget. The laptop game, CoinCollector with 4 rooms joined by doors and 12 steps:
# a random agent that never looks or checks its inventory takes the coin in about 1 game of 3, the untrained
# 135M policy in 2 of 32 episodes (it opens and closes doors, and rarely takes a coin it sees).
TEXTWORLD_EXPRESS_VALUES: dict[str, dict] = {
    # The paper's ScienceWorld settings on another game (never run).
    "paper": dict(task="coin", max_steps=20, n_train_variations=100, n_test_variations=100, tip_decoding="free"),
    # One to two hours a run on a 2-core CPU: 60 iterations of one group of 8 (480 training episodes), each group on
    # a game drawn from 100 training games (so most games are played in one iteration or none), with constrained
    # tips; evaluation on 40 held-out games every 20 iterations. On 10 training games for 100 iterations
    # (`suite.coin_few_games`) both methods learned those games' routes instead of searching: late in training
    # their tip-free episodes took the coin in 54-83% of the training games that need exploring, and at the end
    # in 13-26% of such held-out games.
    "laptop": dict(task="coin", game_params="numLocations=4,numDistractorItems=0,includeDoors=1,limitInventorySize=0",
                   max_steps=12, n_train_variations=100, n_test_variations=40, eval_samples=1, iterations=60,
                   eval_every=20, checkpoint_every=10),
    "ci": dict(task="coin", max_steps=3),
}

ENV_VALUES: dict[str, dict[str, dict]] = {"webshop": WEBSHOP_VALUES, "textworld_express": TEXTWORLD_EXPRESS_VALUES}
"""What each environment changes in a profile (applied over PROFILE_VALUES, under the caller's overrides)."""


def _field_help() -> dict[str, str]:
    """Read the docstring under each field from this module's source."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(EMPO2Config))
    body = tree.body[0].body
    helps = {}
    for node, following in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(following, ast.Expr):
            if isinstance(following.value, ast.Constant) and isinstance(following.value.value, str):
                helps[node.target.id] = following.value.value
    return helps


_FIELD_HELP = _field_help()
