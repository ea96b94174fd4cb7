"""How much of a trained LoRA adapter survives when it is merged into the base weights in each dtype: what the vLLM
engine's `weights` sync (empo2.llm.vllm_engine.merged_weights) sends, against the policy that keeps the adapter apart.

    python benchmarks/merge_precision.py RUN/checkpoints/iter-00010/weights.pt [RUN/final_weights.pt ...]

A run's saved weights hold its LoRA adapter (laptop profile: rank 8, alpha 16, q/k/v/o). Prints, per file and dtype,
the merge's rounding error as a share of the adapter's change ||round(W + dW) - (W + dW)|| / ||dW|| over every adapted
layer, and, over 400 tokens of text, the mean KL from the policy to a model with the merged weights beside the KL from
the policy to the untrained base model (how far training has moved it).
"""

from __future__ import annotations

import argparse
import copy

import torch

from empo2 import ROOT
from empo2.llm.models import load_policy, load_trained_weights
from empo2.llm.vllm_engine import merged_weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("weights", nargs="+", help="a run's weights.pt / final_weights.pt (laptop LoRA shape)")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--lora-alpha", type=int, default=16)
    args = parser.parse_args()
    model, tokenizer = load_policy(lora_rank=args.lora_rank, lora_alpha=args.lora_alpha)
    base_model, _ = load_policy()
    ids = tokenizer((ROOT / "README.md").read_text()[:3000], return_tensors="pt")["input_ids"][:, :400]  # (1, 400)

    def logprobs(m) -> torch.Tensor:  # (400, vocab)
        with torch.no_grad():
            return torch.log_softmax(m(ids).logits.float(), -1)[0]

    def kl(p: torch.Tensor, q: torch.Tensor) -> float:
        return float((p.exp() * (p - q)).sum(-1).mean())

    base = logprobs(base_model)
    for path in args.weights:
        load_trained_weights(model, path)
        model.eval()
        ours = logprobs(model)
        for dtype in (torch.bfloat16, torch.float32):
            error = change = 0.0
            for module in model.get_base_model().modules():
                if hasattr(module, "lora_A") and hasattr(module, "get_base_layer"):
                    weight = module.get_base_layer().weight.float()
                    delta = module.get_delta_weight("default").float()
                    error += float(((weight + delta).to(dtype).float() - weight - delta).pow(2).sum())
                    change += float(delta.pow(2).sum())
            merged = copy.deepcopy(base_model).to(dtype)
            merged.load_state_dict({name: w.to(dtype) for name, w in merged_weights(model).items()}, strict=False)
            print(f"{path}: merged in {str(dtype).removeprefix('torch.')}: merge error {(error / change) ** 0.5:.1%} of "
                  f"the adapter's change; KL(policy || merged) {kl(ours, logprobs(merged)):.2e} a token, "
                  f"KL(policy || base) {kl(ours, base):.2e}", flush=True)


if __name__ == "__main__":
    main()
