"""Randomly initialised copies of models whose weights cannot travel to a machine (seed 0).

    python scripts/random_models.py SOURCE [SOURCE ...] --out FOLDER

Each SOURCE folder holds a model's config and tokenizer files (no weights needed); FOLDER/<SOURCE's name>
gets them plus random weights of that shape: a causal LM where the config names one, else a bare encoder.
The GPU check ran this way (docs/gpu.md) because a device call carries 64 MiB and SmolLM2-135M's weights
are 538 MB: it exercises the CUDA code path (decoding, LoRA, the update, memory), not the model's skill.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sources", nargs="+", type=Path, help="folders with config.json and tokenizer files")
    parser.add_argument("--out", type=Path, required=True, help="where the random copies are written")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="of the saved weights")
    parser.add_argument("--device", default="cpu", help="where they are drawn (cuda: a 7B model in seconds)")
    args = parser.parse_args()
    torch.set_default_dtype(getattr(torch, args.dtype))
    for source in args.sources:
        target = args.out / source.name
        if target.resolve() == source.resolve():  # before drawing the weights (a 7B model takes a while)
            parser.error(f"--out: {args.out} would overwrite the source {source}; choose another folder")
        config = AutoConfig.from_pretrained(source)
        causal = any(name.endswith("ForCausalLM") for name in config.architectures or [])
        torch.manual_seed(0)
        with torch.device(args.device):
            model = (AutoModelForCausalLM if causal else AutoModel).from_config(config)
        shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
        model.save_pretrained(target)
        print(f"{target}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, random (seed 0)")


if __name__ == "__main__":
    main()
