"""Group rollouts on a vLLM engine: the `GroupGenerator` interface, for GPUs and vLLM's CPU build.

Written against vLLM's documented API (versions 0.10.1 to 0.33: `LLM`, `SamplingParams`, token-id
prompts, `LoRARequest`, `StructuredOutputsParams` / `GuidedDecodingParams`, the engine's
`logprobs_mode`); run on vLLM's CPU build 0.32.0 (`make vllm-check`), not yet on a GPU.
`python -m empo2.llm.vllm_check [--device cpu] [--dtype float32]` compares vLLM's log-probs with the
policy's own; tests/test_vllm_engine.py tests our side against a stand-in engine, and the real
engine where .venv-vllm exists. On a CPU the engine's KV cache is `vllm_cpu_kv_cache_gib` and its
threads are bound to every core (`cpu_environment`).

    engine = VLLMEngine.from_config(cfg, tokenizer)
    generator = engine.generator(model, num_slots=8, temperature=1.0)   # publishes the adapter if it changed
    responses = generator.generate({slot: prompt_ids, ...}, 32, constraints)  # as GroupGenerator.generate

What matches the transformers generator (`empo2.llm.generation`):

- One distribution. Requests set the temperature T and switch off everything else (top-p 1,
  top-k off, min-p 0, no penalties), and the engine is built with
  `logprobs_mode="processed_logprobs"`: the log-prob vLLM returns for a sampled token is then
  log softmax(mask(logits) / T), the same distribution `empo2.llm.logprobs` scores (logits / T,
  renormalised over the allowed tokens). vLLM's default, `raw_logprobs`, is of the logits before
  temperature and before `allowed_token_ids`. `generation_config="vllm"` keeps the model
  folder's sampling defaults (Qwen2.5's top-p 0.8, top-k 20, repetition penalty 1.05) and extra
  end tokens out; the only stop token is the tokenizer's end-of-turn token, as in GroupGenerator.
  The trainer recomputes θ_old's log-probs itself, so vLLM's (bf16 kernels) are only recorded.
- Conversations. Each call sends the whole conversation as token ids; the engine's prefix
  caching (`enable_prefix_caching=True`) finds the already-computed prefix (whole KV blocks).
- Weights (`vllm_weight_sync`), sent when a trainable parameter changed:
    adapter  (default) `AdapterFolder.publish` saves the peft adapter to a new folder and the requests
             carry `LoRARequest(name, new id, folder)`; vLLM loads it on first use and applies it with
             its LoRA kernels. LoRA only.
    weights  the policy's weights merged (base + scale * B A for each LoRA layer; every
             weight under full fine-tuning), saved by `WeightsFolder` as a checkpoint and reloaded in
             place by each vLLM worker (`collective_rpc("reload_weights", weights_path=...)`, vLLM's
             own in-place reload, which repacks weights for its kernels as the first load did); then
             the prefix cache is emptied (its blocks were computed with the old weights). The engine
             samples at the base model's speed (on a CPU about 3x faster decode steps than with
             the adapter). Exact for full fine-tuning and in float32; merging a LoRA adapter into bf16
             weights rounds most of a young adapter's change away (`benchmarks/merge_precision.py`).
             Needs workers with `reload_weights(weights_path=...)` (run on vLLM 0.32's CPU build).
- Constrained decoding (`empo2.llm.constrained`), `constraint`:
    tokens  exact (default). Each decision token is one request with `max_tokens=1` and
            `allowed_token_ids` = the trie's allowed set; forced runs are appended here with
            log-prob 0, as GroupGenerator does; a free-text argument (WebShop's `search[...]`)
            is one request that stops at a token holding `]` or the end token. The response
            records the trie's allowed sets, which the update scores with. Costs one engine
            call per decision position (2-5 per action here), batched over the group.
    choice  one request per turn: vLLM's structured outputs with the state's admissible actions
            as the `choice` list (`StructuredOutputsParams(choice=...)` from vLLM 0.10.2,
            `GuidedDecodingParams(choice=...)` in 0.10.1). The grammar allows every token whose
            text continues an action, a wider set than the trie's own tokenisation of each action
            (docs/design.md: 62 vs 20 first tokens), and the model does use other spellings (letter by
            letter). So the response is kept as sampled and each position records the set the
            grammar allowed there (`ChoiceGrammar`: the same xgrammar grammar, replayed), which
            the update renormalises over: the distribution it scores is the one sampled from.
            Spellings other than the trie's are counted in `respelled`. States with a free-text
            template, or whose actions all begin with the same forced tokens, use `tokens`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from empo2.config import CHOICES
from empo2.episode import is_forced
from empo2.llm.constrained import ActionConstraint, Cursor
from empo2.llm.generation import Response, append_forced
from empo2.llm.models import resolve_policy_path

MIN_VLLM = (0, 10, 1)
"""The first vLLM with the engine argument `logprobs_mode` (processed log-probs)."""
LORA_RANK_SLOTS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""Values vLLM accepts for `max_lora_rank`."""
_INSTALL = ("install the gpu extra on a CUDA machine (pip install -e '.[gpu]'), or on a CPU run `make vllm-check`, "
            "which builds .venv-vllm with vLLM's CPU build")


# ------------------------------------------------------------------ vLLM, imported lazily
def version_tuple(version: str) -> tuple[int, ...]:
    """'0.10.1rc2.dev5+gabc' -> (0, 10, 1)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def import_vllm():
    """The vllm module; a one-line ImportError naming the gpu extra when it is missing or too old."""
    try:
        import vllm
    except ImportError:
        raise ImportError(f"rollout_engine: 'vllm' needs the vllm package, which is not installed; {_INSTALL}") from None
    if version_tuple(vllm.__version__) < MIN_VLLM:
        raise ImportError(f"rollout_engine: 'vllm' needs vllm >= {'.'.join(map(str, MIN_VLLM))} (logprobs_mode), "
                          f"found {vllm.__version__}; {_INSTALL}")
    return vllm


def choice_kwargs(sampling_module, choices: list[str]) -> dict:
    """SamplingParams keyword arguments that restrict the output to exactly one of `choices`.

    vLLM 0.10.2 renamed guided decoding to structured outputs (the old names went in 0.12):
    `structured_outputs=StructuredOutputsParams(choice=...)`, before it
    `guided_decoding=GuidedDecodingParams(choice=...)`, both in `vllm.sampling_params`.
    """
    if hasattr(sampling_module, "StructuredOutputsParams"):
        return {"structured_outputs": sampling_module.StructuredOutputsParams(choice=list(choices))}
    if hasattr(sampling_module, "GuidedDecodingParams"):
        return {"guided_decoding": sampling_module.GuidedDecodingParams(choice=list(choices))}
    raise ImportError("vllm.sampling_params has neither StructuredOutputsParams nor GuidedDecodingParams; "
                      f"need vllm >= {'.'.join(map(str, MIN_VLLM))}")


class ChoiceGrammar:
    """The token sets vLLM's `choice` grammar allowed, position by position: the grammar compiled as vLLM's
    xgrammar backend compiles a choice list (`choice_as_grammar`, the model's tokenizer, the request's stop
    tokens), replayed over the sampled tokens. Recording these sets makes the choice way exact: the update
    renormalises each position over the set the engine sampled from, not over the trie's narrower one."""

    def __init__(self):
        self._compilers: dict[int, Any] = {}
        self._grammars: dict[tuple[int, tuple[str, ...]], Any] = {}

    def __call__(self, tokenizer, choices: list[str], tokens: list[int], stop_ids: list[int]
                 ) -> list[tuple[int, ...]]:
        import torch
        import xgrammar as xgr
        from vllm.v1.structured_output.utils import choice_as_grammar

        vocab = len(tokenizer)
        compiler = self._compilers.get(id(tokenizer))
        if compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
            compiler = self._compilers[id(tokenizer)] = xgr.GrammarCompiler(info)
        key = (id(tokenizer), tuple(choices))
        if key not in self._grammars:
            self._grammars[key] = compiler.compile_grammar(choice_as_grammar(list(choices)))
        matcher = xgr.GrammarMatcher(self._grammars[key], override_stop_tokens=list(stop_ids))
        bitmask = xgr.allocate_token_bitmask(1, vocab)  # (1, ceil(vocab / 32)) int32
        shifts = torch.arange(32, dtype=torch.int32)
        sets = []
        for token in tokens:
            matcher.fill_next_token_bitmask(bitmask)
            bits = ((bitmask[0].unsqueeze(1) >> shifts) & 1).flatten()[:vocab]  # (vocab,)
            sets.append(tuple(bits.nonzero().flatten().tolist()))
            if not matcher.accept_token(token):
                raise ValueError(f"vllm choice decoding: token {token} is not allowed by the choice grammar")
        return sets


@dataclass
class VLLMApi:
    """The few vLLM names the generator uses (a stand-in in tests)."""

    sampling_params: Callable[..., Any]
    """`vllm.SamplingParams`."""
    choice: Callable[[list[str]], dict]
    """Choice list -> SamplingParams keyword arguments (`choice_kwargs`)."""
    choice_sets: Callable[[Any, list[str], list[int], list[int]], list[tuple[int, ...]]] | None = None
    """(tokenizer, choices, sampled tokens, stop ids) -> the allowed set of each position (`ChoiceGrammar`)."""

    @classmethod
    def load(cls) -> "VLLMApi":
        import_vllm()
        from vllm import SamplingParams
        from vllm import sampling_params as module

        return cls(SamplingParams, lambda choices: choice_kwargs(module, choices), ChoiceGrammar())


# ------------------------------------------------------------------ settings (pure)
def lora_rank_slot(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds an adapter of `rank`."""
    for slot in LORA_RANK_SLOTS:
        if slot >= rank:
            return slot
    raise ValueError(f"lora_rank: {rank} is not allowed with vllm; need <= {LORA_RANK_SLOTS[-1]}")


def engine_kwargs(model_path: str, *, lora_rank: int, gpu_memory: float, seed: int, device: str = "cuda",
                  dtype: str = "bfloat16") -> dict:
    """Keyword arguments of `vllm.LLM` for a rollout engine (lora_rank 0: no adapters). On a CPU the KV cache's
    size is vLLM's environment variable instead (`cpu_environment`)."""
    kwargs = dict(
        model=model_path, tokenizer=model_path, dtype=dtype, seed=seed,
        enable_prefix_caching=True,  # each turn resubmits the whole conversation
        logprobs_mode="processed_logprobs",  # log-probs after temperature and allowed-token masks
        generation_config="vllm",  # no sampling defaults or extra end tokens from the model folder
    )
    if device != "cpu":
        kwargs["gpu_memory_utilization"] = gpu_memory  # the policy and its optimiser share the GPU
    if lora_rank > 0:
        kwargs.update(enable_lora=True, max_lora_rank=lora_rank_slot(lora_rank), max_loras=1, max_cpu_loras=2)
    return kwargs


def cpu_environment(kv_cache_gib: int, cores: int | None = None) -> dict[str, str]:
    """The environment vLLM's CPU build reads: its KV cache in GiB, and its threads bound to every core this
    process may use (its default binds fewer than a laptop has)."""
    cores = cores or len(os.sched_getaffinity(0))
    return {"VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gib)), "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}"}


def sampling_kwargs(temperature: float, *, max_tokens: int, stop_ids: list[int],
                    allowed: tuple[int, ...] | None = None, seed: int | None = None) -> dict:
    """SamplingParams keyword arguments: plain temperature sampling, the sampled token's log-prob, token ids only.

    top_k=-1 means "off" in every vLLM since 0.10 (newer ones prefer 0 but accept -1).
    logprobs=1 returns the sampled token's log-prob (and the top-1's, ignored).
    """
    kwargs = dict(n=1, temperature=temperature, top_p=1.0, top_k=-1, min_p=0.0, repetition_penalty=1.0,
                  presence_penalty=0.0, frequency_penalty=0.0, max_tokens=max_tokens, stop_token_ids=list(stop_ids),
                  logprobs=1, detokenize=False, seed=seed)
    if allowed is not None:
        kwargs["allowed_token_ids"] = list(allowed)
    return kwargs


# ------------------------------------------------------------------ outputs (pure)
def sampled_tokens(output) -> tuple[list[int], list[float]]:
    """A vLLM `RequestOutput` -> (sampled token ids, each one's log-prob).

    Reads the documented fields `outputs[0].token_ids` and `outputs[0].logprobs`: one dict per
    token, token id -> `Logprob` (`.logprob`), holding the sampled token (and the top ones).
    A stopped response's ids end with its stop token.
    """
    completion = output.outputs[0]
    ids = [int(token) for token in completion.token_ids]
    if completion.logprobs is None:
        raise ValueError("vllm output has no logprobs; the request must set SamplingParams(logprobs=1)")
    if len(completion.logprobs) != len(ids):
        raise ValueError(f"vllm output has {len(completion.logprobs)} logprob entries for {len(ids)} tokens")
    logprobs = []
    for position, (token, entry) in enumerate(zip(ids, completion.logprobs)):
        if token not in entry:
            raise ValueError(f"vllm output: no log-prob for the sampled token {token} at position {position}")
        logprobs.append(float(entry[token].logprob))
    return ids, logprobs


def follow_trie(constraint: ActionConstraint, tokens: list[int], logprobs: list[float]) -> Response | None:
    """`tokens` as the trie spells them: each with the trie's allowed set, forced ones with log-prob 0.

    None when the tokens leave the trie (another tokenisation of an action) or stop before an
    action is complete. Tokens after the completing one are dropped.
    """
    cursor, response = constraint.cursor(), Response([], [], [])
    for token, logprob in zip(tokens, logprobs):
        allowed = cursor.allowed()
        if allowed is not None and token not in allowed:
            return None
        response.append(token, 0.0 if is_forced(allowed) else logprob, allowed)
        cursor.advance(token)
        if cursor.done:
            return response
    return None


# ------------------------------------------------------------------ the generator
@dataclass
class _Request:
    """One engine request of one slot: what it asks for and how its answer is taken."""

    kind: str
    """free (no constraint), token (one decision token), text (a free-text argument), choice (a whole action)."""
    prompt: dict
    params: Any
    allowed: tuple[int, ...] | None = None


class VLLMGenerator:
    """Samples one response per requested slot on a vLLM engine; `generate` as `GroupGenerator.generate`."""

    def __init__(self, llm, tokenizer, num_slots: int, *, temperature: float = 1.0, lora_request=None,
                 constraint: str = "tokens", rng: np.random.Generator | None = None, api: VLLMApi | None = None):
        if constraint not in CHOICES["vllm_constraint"]:
            raise ValueError(f"vllm_constraint: {constraint!r} is not allowed; choose one of {', '.join(CHOICES['vllm_constraint'])}")
        self.llm = llm
        self.tokenizer = tokenizer
        self.stop_id = tokenizer.eos_token_id
        self.slots = set(range(num_slots))
        self.temperature = temperature
        self.lora_request = lora_request
        self.constraint = constraint
        self.rng = rng
        """Draws one seed per request (None: vLLM's own randomness)."""
        self.api = api or VLLMApi.load()
        self.engine_calls = 0
        self.requests = 0
        self.respelled = 0
        """choice: responses spelled with another tokenisation than the trie's (kept as sampled)."""
        self._choices: dict[int, tuple[ActionConstraint, list[str] | None, int]] = {}

    def generate(self, prompts: dict[int, list[int]], max_new_tokens: dict[int, int] | int,
                 constraints: dict[int, ActionConstraint] | None = None) -> dict[int, Response]:
        """Sample a response for each slot in `prompts` (slot -> full prompt ids); see GroupGenerator.generate."""
        unknown = set(prompts) - self.slots
        if unknown:
            raise ValueError(f"generate: slots {sorted(unknown)} do not exist (this generator has {len(self.slots)})")
        if isinstance(max_new_tokens, int):
            max_new_tokens = {slot: max_new_tokens for slot in prompts}
        constraints = constraints or {}
        cursors = {slot: constraints[slot].cursor() for slot in prompts if slot in constraints}
        responses = {slot: Response([], [], [] if slot in cursors else None) for slot in prompts}
        active = [slot for slot in sorted(prompts) if not append_forced(responses[slot], cursors.get(slot))]
        while active:
            requests = [self._request(prompts[slot], responses[slot], cursors.get(slot), constraints.get(slot),
                                      max_new_tokens[slot]) for slot in active]
            outputs = self.llm.generate([r.prompt for r in requests], [r.params for r in requests],
                                        use_tqdm=False, lora_request=self.lora_request)
            self.engine_calls += 1
            self.requests += len(requests)
            still = []
            for slot, request, output in zip(active, requests, outputs):
                tokens, logprobs = sampled_tokens(output)
                if request.kind == "choice":
                    responses[slot] = self._take_choice(constraints[slot], tokens, logprobs)
                    continue
                if not self._take(request, responses[slot], cursors.get(slot), tokens, logprobs):
                    still.append(slot)
            active = still
        return responses

    def _seed(self) -> int | None:
        return None if self.rng is None else int(self.rng.integers(2**31 - 1))

    def _params(self, max_tokens: int, stop_ids: list[int], allowed=None, extra: dict | None = None):
        kwargs = sampling_kwargs(self.temperature, max_tokens=max_tokens, stop_ids=stop_ids, allowed=allowed,
                                 seed=self._seed())
        return self.api.sampling_params(**kwargs, **(extra or {}))

    def _request(self, prompt: list[int], response: Response, cursor: Cursor | None,
                 constraint: ActionConstraint | None, budget: int) -> _Request:
        context = {"prompt_token_ids": prompt + response.ids}  # a TokensPrompt (a TypedDict)
        if cursor is None:
            return _Request("free", context, self._params(budget, [self.stop_id]))
        if self.constraint == "choice" and not response.ids:
            choices, longest = self._choice_list(constraint)
            if choices is not None:  # room for other tokenisations of the longest action, and the end token
                return _Request("choice", context, self._params(4 * (longest + 1), [self.stop_id],
                                                                extra=self.api.choice(choices)))
        allowed = cursor.allowed()
        if allowed is None:  # inside a free-text argument: up to its closing token, end token or budget
            left = constraint.free_text_tokens - cursor.free_tokens
            stops = [constraint.end_id, *sorted(constraint.closing_ids)]
            return _Request("text", context, self._params(left, stops))
        return _Request("token", context, self._params(1, [self.stop_id], allowed=allowed), allowed)

    @staticmethod
    def _take(request: _Request, response: Response, cursor: Cursor | None, tokens: list[int],
              logprobs: list[float]) -> bool:
        """Append a free, token or text request's answer; True when the response is complete."""
        if cursor is None:
            for token, logprob in zip(tokens, logprobs):
                response.append(token, logprob, None)
            return True
        for token, logprob in zip(tokens, logprobs):
            if request.allowed is not None and token not in request.allowed:
                raise ValueError(f"vllm sampled token {token}, which allowed_token_ids did not allow")
            response.append(token, logprob, request.allowed)
            cursor.advance(token)
            if cursor.done:
                return True
        return append_forced(response, cursor)

    def _choice_list(self, constraint: ActionConstraint) -> tuple[list[str] | None, int]:
        """The action strings of a constraint and its longest action in tokens (None: it has free-text templates)."""
        cached = self._choices.get(id(constraint))
        if cached is None or cached[0] is not constraint:
            fixed, templates = constraint.paths()
            choices = None if templates else [self.tokenizer.decode(ids) for ids in fixed]
            cached = self._choices[id(constraint)] = (constraint, choices, max(map(len, fixed), default=0))
        return cached[1], cached[2]

    def _take_choice(self, constraint: ActionConstraint, tokens: list[int], logprobs: list[float]) -> Response:
        """A whole-action answer as sampled, each token with the set the choice grammar allowed there (forced
        ones log-prob 0). A spelling other than the trie's is kept and counted in `respelled`."""
        choices, _ = self._choice_list(constraint)
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if text not in choices or tokens[-1:] != [self.stop_id]:
            raise ValueError(f"vllm choice decoding returned {text!r}, which is no admissible action")
        allowed = self.api.choice_sets(self.tokenizer, choices, tokens, [self.stop_id])
        self.respelled += follow_trie(constraint, tokens, logprobs) is None
        return Response(list(tokens), [0.0 if is_forced(a) else lp for lp, a in zip(logprobs, allowed)], allowed)


# ------------------------------------------------------------------ adapter versions
def adapter_fingerprint(model) -> str:
    """A digest of the LoRA weights (parameters named `lora_`), to publish a new version only when they change."""
    digest = hashlib.blake2b(digest_size=16)
    count = 0
    for name, parameter in model.named_parameters():
        if "lora_" in name:
            digest.update(name.encode())
            digest.update(parameter.detach().float().cpu().numpy().tobytes())
            count += 1
    if not count:
        raise ValueError("adapter_fingerprint: the model has no LoRA parameters (lora_rank 0?)")
    return digest.hexdigest()


@dataclass
class AdapterVersion:
    """One published adapter: vLLM's name and integer id for it, and its folder."""

    name: str
    id: int
    path: Path
    fingerprint: str = field(repr=False)


class AdapterFolder:
    """Versions of the policy's LoRA adapter on disk, for vLLM to load by a new id each time it changes.

    `publish(model)` saves the peft adapter (adapter_config.json + adapter_model.safetensors)
    to `root/v00001`, `root/v00002`, ... when its weights differ from the last version's, and
    keeps only the `keep` newest folders. Ids start at 1 (vLLM needs a positive id).
    """

    def __init__(self, root: str | Path, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep: {keep} is not allowed; need an integer >= 1")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.current: AdapterVersion | None = None

    def publish(self, model) -> AdapterVersion:
        """The adapter version of `model`'s current weights (saved now if they changed)."""
        fingerprint = adapter_fingerprint(model)
        if self.current is not None and self.current.fingerprint == fingerprint:
            return self.current
        number = 1 if self.current is None else self.current.id + 1
        path = self.root / f"v{number:05d}"
        model.save_pretrained(str(path))
        self.current = AdapterVersion(f"policy-v{number}", number, path, fingerprint)
        for old in sorted(self.root.glob("v*"))[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return self.current


# ------------------------------------------------------------------ merged weights
def merged_weights(model) -> dict[str, Any]:
    """Every weight of `model` as its base model's checkpoint names it (what vLLM's loader reads), each LoRA layer
    merged: W + scale * B A, computed in float32 and kept in W's dtype. A tied output layer appears once."""
    import torch
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    if not isinstance(model, PeftModel):
        return {name: parameter.detach() for name, parameter in model.named_parameters()}
    base_model = model.get_base_model()
    merged = {}
    with torch.no_grad():
        for name, module in base_model.named_modules():
            if isinstance(module, LoraLayer):
                weight = module.get_base_layer().weight  # (out, in)
                delta = sum(module.get_delta_weight(adapter).float() for adapter in module.active_adapters)
                merged[f"{name}.weight"] = (weight.float() + delta).to(weight.dtype)
    weights = {}
    for name, parameter in base_model.named_parameters():
        if "lora_" not in name:
            name = name.replace(".base_layer.", ".")
            weights[name] = merged.get(name, parameter.detach())
    return weights


def ties_output_layer(model_path: str) -> bool:
    """Whether the model's output layer is its input embeddings (its config's tie_word_embeddings)."""
    from transformers import AutoConfig

    return bool(getattr(AutoConfig.from_pretrained(model_path), "tie_word_embeddings", False))


def weights_version(model) -> tuple[int, ...]:
    """Torch's version counter of each trainable parameter: it moves with every in-place change (an optimiser
    step, a loaded checkpoint), and reading it costs nothing (no hashing of a 7B model's weights)."""
    return tuple(parameter._version for parameter in model.parameters() if parameter.requires_grad)


class WeightsFolder:
    """The policy's merged weights as a one-file checkpoint (`model.safetensors`, in the engine's dtype) for the
    engine's workers to reload, saved again only when a trainable parameter changed since the last save."""

    def __init__(self, root: str | Path, dtype: str | None = None):
        self.root = Path(root)
        self.dtype = dtype
        """The engine's weight dtype ("bfloat16", "float32"); None keeps the policy's."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.path = self.root / "model.safetensors"
        self.saves = 0
        self._version: tuple[int, ...] | None = None

    def publish(self, model) -> Path | None:
        """The folder to reload from when `model`'s weights changed since the last call (always on the first),
        else None."""
        version = weights_version(model)
        if self.saves and version == self._version:
            return None
        import torch
        from safetensors.torch import save_file

        dtype = None if self.dtype is None else getattr(torch, self.dtype)
        save_file({name: w.detach().to("cpu", dtype).contiguous() for name, w in merged_weights(model).items()},
                  str(self.path))
        self._version = version
        self.saves += 1
        return self.root


# ------------------------------------------------------------------ the engine of a run
class VLLMEngine:
    """One vLLM engine per run (prefix caching; the policy's weights loaded in place, or its adapter by version);
    `generator()` per group."""

    def __init__(self, llm, tokenizer, *, adapters: AdapterFolder | None = None, weights: WeightsFolder | None = None,
                 constraint: str = "tokens", seed: int = 0, api: VLLMApi | None = None, lora_request_class=None):
        if adapters is not None and weights is not None:
            raise ValueError("VLLMEngine: send the adapter or the merged weights, not both")
        self.llm = llm
        self.tokenizer = tokenizer
        self.adapters = adapters
        self.weights = weights
        self.weight_loads = 0
        """How many times new weights were loaded into the engine (weights sync)."""
        self.constraint = constraint
        self.rng = np.random.default_rng(seed)
        self.api = api
        self._lora_request_class = lora_request_class

    @classmethod
    def from_config(cls, cfg, tokenizer, dtype: str = "bfloat16") -> "VLLMEngine":
        """The engine an `EMPO2Config` describes (`vllm_gpu_memory` or `vllm_cpu_kv_cache_gib`, `vllm_constraint`,
        `vllm_weight_sync`), its weights in `dtype` (the policy's default, bf16)."""
        sync = getattr(cfg, "vllm_weight_sync", "adapter")
        if sync not in CHOICES["vllm_weight_sync"]:
            raise ValueError(f"vllm_weight_sync: {sync!r} is not allowed; choose one of {', '.join(CHOICES['vllm_weight_sync'])}")
        if sync == "adapter" and cfg.trains_weights and cfg.lora_rank == 0:
            raise ValueError("vllm_weight_sync: 'adapter' is not allowed with lora_rank 0 when training (there is no "
                             "adapter to send); use 'weights'")
        constraint = getattr(cfg, "vllm_constraint", "tokens")
        if constraint not in CHOICES["vllm_constraint"]:
            raise ValueError(f"vllm_constraint: {constraint!r} is not allowed; choose one of {', '.join(CHOICES['vllm_constraint'])}")
        model_path = resolve_policy_path(cfg.model)
        if sync == "weights" and cfg.trains_weights and cfg.lora_rank == 0 and ties_output_layer(model_path):
            # Measured on vLLM 0.32's CPU build: every weight of SmolLM2 changed, the engine's log-probs were up to
            # 0.32 off the policy's; with the embeddings left alone, 0.0000.
            raise ValueError(f"lora_rank: 0 is not allowed with rollout_engine 'vllm' for {cfg.model}, whose output "
                             "layer is tied to its embeddings (vLLM's in-place reload leaves that layer stale); "
                             "train a LoRA adapter (lora_rank > 0) or use rollout_engine 'transformers'")
        vllm = import_vllm()
        from vllm.lora.request import LoRARequest

        lora_rank = cfg.lora_rank if cfg.trains_weights and sync == "adapter" else 0
        device = "cpu" if cfg.device == "cpu" else "cuda"
        if device == "cpu":
            for name, value in cpu_environment(cfg.vllm_cpu_kv_cache_gib).items():
                os.environ.setdefault(name, value)  # one the user set wins
        llm = vllm.LLM(**engine_kwargs(model_path, lora_rank=lora_rank,
                                       gpu_memory=getattr(cfg, "vllm_gpu_memory", 0.35), seed=cfg.seed, device=device,
                                       dtype=dtype))
        adapters = AdapterFolder(tempfile.mkdtemp(prefix="empo2-adapters-")) if lora_rank else None
        weights = WeightsFolder(tempfile.mkdtemp(prefix="empo2-weights-"), dtype) if sync == "weights" else None
        return cls(llm, tokenizer, adapters=adapters, weights=weights, constraint=constraint, seed=cfg.seed,
                   api=VLLMApi.load(), lora_request_class=LoRARequest)

    def sync_weights(self, model) -> bool:
        """Load `model`'s merged weights into the engine if they changed since the last load (weights sync);
        True when it loaded."""
        folder = None if self.weights is None else self.weights.publish(model)
        if folder is None:
            return False
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        self.llm.reset_prefix_cache()  # its cached blocks hold keys and values of the old weights
        self.weight_loads += 1
        return True

    def lora_request(self, model):
        """The LoRARequest of `model`'s current adapter (published if it changed); None without adapters."""
        if self.adapters is None:
            return None
        version = self.adapters.publish(model)
        return self._lora_request_class(version.name, version.id, str(version.path))

    def generator(self, model, num_slots: int, *, temperature: float) -> VLLMGenerator:
        """A generator for one group, sampling from `model`'s current weights (loaded, or its adapter)."""
        self.sync_weights(model)
        return VLLMGenerator(self.llm, self.tokenizer, num_slots, temperature=temperature,
                             lora_request=self.lora_request(model), constraint=self.constraint, rng=self.rng,
                             api=self.api)

    def close(self) -> None:
        """Stop the engine's processes (and free their memory) now, and delete the weights sent to it."""
        # `vllm.LLM` has no close(); without this the engine process lives until garbage collection, and a second
        # engine in the same process (the benchmark starts three) ran a 24 GB machine out of memory.
        engine_core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if engine_core is not None:
            engine_core.shutdown()
        for folder in (self.adapters, self.weights):
            if folder is not None:
                shutil.rmtree(folder.root, ignore_errors=True)
        self.llm = None
