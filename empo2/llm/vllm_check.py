"""The vLLM check (`python -m empo2.llm.vllm_check`, run by `make vllm-check`): does the engine sample the policy
the learner trains? It samples with vLLM from a policy whose adapter is not zero, scores the samples with the policy
itself, and holds the largest log-prob gap to a bound (exact agreement in float32; in bf16 twice what bf16 rounding
costs the suite's own scoring and sampler against float32); `--broken` (nothing sent to the engine) must fail it."""

from __future__ import annotations

from empo2.chat import ChatFormat, Message
from empo2.config import CHOICES, EMPO2Config
from empo2.envs import make_env
from empo2.llm.constrained import ActionEncoder
from empo2.llm.generation import GroupGenerator
from empo2.llm.logprobs import sequence_logprobs
from empo2.llm.models import load_policy
from empo2.llm.vllm_engine import VLLMEngine
from empo2.prompts import SYSTEM_PROMPT

CHECK_FLOAT32_BOUND = 1e-3
"""`main`'s bound on the largest log-prob gap between the engine and the policy in float32. In bf16 the bound is
measured in the run: twice what bf16 costs the suite's own paths against a float32 copy of the policy (its scoring,
and its sampler `GroupGenerator` on the same prompt and constraint), and at least this."""
CHECK_ADAPTER_STD = 0.3
"""The spread of `main`'s stand-in adapter: large enough that it moves the decision tokens' log-probs well above
bf16 rounding (at 0.02 it moved the corridor's trie sets by 0.003 in bf16, less than the engine's rounding)."""

def stand_in_adapter(model, std: float, generator) -> None:
    """Draw the LoRA B matrices N(0, std²), so the adapter moves the policy as a trained one does (a fresh adapter
    is zero, and an engine holding only the base weights would then look right)."""
    import torch

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(std * torch.randn(parameter.shape, generator=generator))


def float32_copy(model, cfg):
    """`model` (the policy, its adapter included) in float32."""
    import torch

    copy = load_policy(cfg.model, lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                       lora_target_modules=cfg.lora_target_modules, device=cfg.device, dtype=torch.float32)[0]
    copy.eval()
    adapter = dict(model.named_parameters())
    with torch.no_grad():
        for name, parameter in copy.named_parameters():
            if "lora_" in name:
                parameter.copy_(adapter[name].float())
    return copy


def arguments(argv: list[str] | None):
    import argparse

    import torch

    parser = argparse.ArgumentParser(prog="python -m empo2.llm.vllm_check", description=__doc__)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the policy and the engine run (default: cuda when there is one)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="the weights of both the policy and the engine (float32 shows what bf16 rounding costs)")
    parser.add_argument("--weight-sync", choices=CHOICES["vllm_weight_sync"], default=EMPO2Config.vllm_weight_sync,
                        help="how the policy's weights reach the engine (the config's vllm_weight_sync)")
    parser.add_argument("--adapter-std", type=float, default=CHECK_ADAPTER_STD,
                        help="the stand-in adapter's B matrices are drawn N(0, std^2) (default: %(default)s)")
    parser.add_argument("--broken", action="store_true",
                        help="a deliberately broken engine: the policy's adapter or weights are never sent, so it "
                             "samples the base model; the check must fail")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Sample one corridor group with vLLM (both constraint ways, and free text) from a policy whose LoRA adapter is
    not zero (as after training), score the samples with the policy itself, and print per way the largest log-prob gap
    over decision tokens, its bound, and how far the adapter moves those log-probs from the base model's (what a weight
    sync that did not arrive would show). The bound is CHECK_FLOAT32_BOUND in float32; in bf16, twice the largest
    rounding of the suite's own bf16 paths (its scoring, and its sampler on the same prompt) against a float32 copy
    (another bf16 implementation may round as far, the other way). Passes when every gap is within its bound and the
    adapter's effect stands above twice the bound (an engine without it cannot pass). Needs vllm (`make vllm-check`)."""
    import torch

    args = arguments(argv)
    cfg = EMPO2Config.from_profile("ci", env="corridor", method="grpo", device=args.device,
                                   vllm_weight_sync=args.weight_sync)
    dtype = getattr(torch, args.dtype)
    model, tokenizer = load_policy(cfg.model, lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                                   lora_target_modules=cfg.lora_target_modules, device=cfg.device, dtype=dtype)
    model.eval()
    stand_in_adapter(model, args.adapter_std, torch.Generator().manual_seed(0))
    # The exact log-probs: the same policy in float32 (the same base weights and adapter).
    exact = model if dtype == torch.float32 else float32_copy(model, cfg)
    env = make_env("corridor")
    observation, info = env.reset(env.train_variations[0])
    messages = [Message("system", SYSTEM_PROMPT),
                Message("user", env.first_turn_text(info["task_description"], observation, info))]
    prompt = ChatFormat(tokenizer).render(messages, add_generation_prompt=True).ids()
    constraint = ActionEncoder(tokenizer).constraint(info["valid_actions"], cfg.response_tokens)

    def largest_gaps(responses) -> dict[str, float]:
        """Over the decision tokens of `responses`, the largest |log-prob| gap between: the sampler and the policy's
        scoring ("gap"); the policy and its base model ("moved"); the policy and its float32 copy ("learner
        rounding"); the sampler and that copy ("sampler rounding")."""
        largest = dict.fromkeys(("gap", "moved", "learner rounding", "sampler rounding"), 0.0)
        for response in responses.values():
            span = [(len(prompt), len(prompt) + len(response.ids))]
            score = lambda m: sequence_logprobs(m, prompt + response.ids, span, temperature=cfg.temperature,  # noqa: E731
                                                allowed=response.allowed).float().cpu()
            with torch.no_grad():
                ours = score(model)
                truth = ours if exact is model else score(exact)  # float32: the policy is its own copy
                with model.disable_adapter():
                    base = score(model)
            theirs = torch.tensor(response.logprobs)
            decided = ~torch.isnan(theirs)
            if decided.any():
                for name, (a, b) in {"gap": (ours, theirs), "moved": (ours, base), "learner rounding": (ours, truth),
                                     "sampler rounding": (theirs, truth)}.items():
                    largest[name] = max(largest[name], float((a[decided] - b[decided]).abs().max()))
        return largest

    engine = VLLMEngine.from_config(cfg, tokenizer, dtype=args.dtype)
    if args.broken:
        engine.sync_weights = lambda model: False
        engine.lora_request = lambda model: None
    passed = True
    for way, constraints in (("tokens", constraint), ("choice", constraint), ("free", None)):
        requests = ({slot: prompt for slot in range(8)}, cfg.response_tokens,
                    None if constraints is None else {slot: constraints for slot in range(8)})
        engine.constraint = "choice" if way == "choice" else "tokens"
        generator = engine.generator(model, 8, temperature=cfg.temperature)
        responses = generator.generate(*requests)
        sampled = largest_gaps(responses)
        own = largest_gaps(GroupGenerator(model, tokenizer, 8, temperature=cfg.temperature,
                                          sampling_rng=torch.Generator().manual_seed(cfg.seed)).generate(*requests))
        # What bf16 costs the suite's own two paths (scoring and sampling), against the exact log-probs; a second
        # implementation may round as far again, the other way.
        rounding = max(sampled["learner rounding"], own["learner rounding"], own["sampler rounding"])
        bound = max(CHECK_FLOAT32_BOUND, 2 * rounding)
        gap, moved = sampled["gap"], sampled["moved"]
        held = gap <= bound and moved > 2 * bound
        passed = passed and held
        texts = sorted({tokenizer.decode(r.ids, skip_special_tokens=True) for r in responses.values()})
        print(f"vllm {way:6s}: max |log-prob gap| {gap:.4f} over decision tokens, bound {bound:.4f} (the suite's own "
              f"{args.dtype} rounding {rounding:.4f}, the engine's {sampled['sampler rounding']:.4f}); the adapter "
              f"moves them up to {moved:.4f} from the base model's ({'held' if held else 'NOT held'}); "
              f"{generator.engine_calls} engine calls, {generator.respelled} re-spelled; sampled {texts[:4]}")
    engine.close()
    print(f"vllm check: {'PASSED' if passed else 'FAILED'}: {args.dtype} engine{' (broken: nothing sent)' if args.broken else ''} "
          f"vs policy on {args.device}, weight sync {args.weight_sync}, {engine.weight_loads} weight loads, "
          f"adapter std {args.adapter_std}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
