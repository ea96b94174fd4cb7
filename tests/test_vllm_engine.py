"""The vLLM rollout backend.

vLLM does not share the project's venv (its CPU build pins an older transformers), so most of
these tests check our side without it: the sampling and engine settings we pass, the conversion
of vLLM-shaped outputs (the documented `outputs[0].token_ids` / `outputs[0].logprobs` fields)
into `Response`s, the constrained decoding loop driven by a stand-in engine that honours
`max_tokens`, `stop_token_ids` and `allowed_token_ids` as documented, the adapter versions and
the merged weights that the engine reloads.
The last test runs the real engine on this CPU (`python -m empo2.llm.vllm_check`) where `make
vllm-check` has built .venv-vllm, and says it skipped where it has not.
"""

import json
import os
import subprocess
import sys
from collections import namedtuple
from types import SimpleNamespace

import pytest
import torch

from empo2 import ROOT
from empo2.config import CHOICES, EMPO2Config
from empo2.llm import vllm_check
from empo2.llm.constrained import ActionEncoder, action_text
from empo2.llm.models import load_tokenizer
import empo2.llm.vllm_engine as ve

ACTIONS = ["look around", "go east", "go west", "focus on apple", "focus on red light bulb",
           "open door to kitchen", "open door to hallway"]
WEBSHOP = ["search[...]", "click[back to search]", "click[buy now]"]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def ids_of(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------ a stand-in engine
class Params:
    """Stands in for vllm.SamplingParams: keeps its keyword arguments."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class Choice:
    """Stands in for StructuredOutputsParams / GuidedDecodingParams."""

    def __init__(self, choice):
        self.choice = choice


API = ve.VLLMApi(Params, lambda choices: {"structured_outputs": Choice(choices)})
Logprob = namedtuple("Logprob", "logprob")


def output(tokens, logprobs, top=None):
    """A RequestOutput as documented: outputs[0].token_ids, outputs[0].logprobs (dicts id -> Logprob)."""
    entries = [{token: Logprob(lp), **({top: Logprob(-0.01)} if top is not None else {})}
               for token, lp in zip(tokens, logprobs)]
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens, logprobs=entries, finish_reason="stop")])


class FakeLLM:
    """Answers LLM.generate(prompts, params, use_tqdm, lora_request) with what `want(slot, context)` wants next,
    cut as vLLM's documented request fields cut it: at the first stop token (kept) or `max_tokens`;
    a first token outside `allowed_token_ids` is an error (the engine could not sample it).
    Each token's log-prob is -(its position in the response + 1) / 10, so positions can be told apart."""

    def __init__(self, prompts, want):
        self.prompts, self.want, self.calls = prompts, want, []

    def generate(self, prompts, params, use_tqdm=True, lora_request=None):
        assert use_tqdm is False
        self.calls.append((prompts, params, lora_request))
        outputs = []
        for prompt, p in zip(prompts, params):
            context = prompt["prompt_token_ids"]
            slot = next(s for s, ids in self.prompts.items() if context[: len(ids)] == ids)
            done = len(context) - len(self.prompts[slot])
            tokens = []
            for token in self.want(slot, p)[done:]:
                tokens.append(token)
                if token in p.stop_token_ids or len(tokens) == p.max_tokens:
                    break
            allowed = getattr(p, "allowed_token_ids", None)
            assert allowed is None or tokens[0] in allowed, f"{tokens[0]} is not in allowed_token_ids"
            outputs.append(output(tokens, [-(done + k + 1) / 10 for k in range(len(tokens))]))
        return outputs


# ------------------------------------------------------------------ imports and settings
def test_module_imports_without_vllm_and_missing_vllm_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ImportError) as error:
        ve.import_vllm()
    message = str(error.value)
    assert "\n" not in message and "gpu" in message and "vllm" in message
    with pytest.raises(ImportError, match="gpu"):
        ve.VLLMGenerator(object(), SimpleNamespace(eos_token_id=0), 2)  # no api given: loads vLLM
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.9.2"))
    with pytest.raises(ImportError, match=r"vllm >= 0\.10\.1.*found 0\.9\.2"):
        ve.import_vllm()
    assert ve.version_tuple("0.10.1rc2.dev5+gabc") == (0, 10, 1) and ve.version_tuple("0.33.0") == (0, 33, 0)


def test_choice_params_follow_the_vllm_version():
    class New:
        def __init__(self, choice):
            self.choice = choice

    new = ve.choice_kwargs(SimpleNamespace(StructuredOutputsParams=New), ["a", "b"])
    assert list(new) == ["structured_outputs"] and new["structured_outputs"].choice == ["a", "b"]
    old = ve.choice_kwargs(SimpleNamespace(GuidedDecodingParams=New), ("a",))
    assert list(old) == ["guided_decoding"] and old["guided_decoding"].choice == ["a"]
    both = ve.choice_kwargs(SimpleNamespace(StructuredOutputsParams=New, GuidedDecodingParams=None), ["a"])
    assert list(both) == ["structured_outputs"]  # 0.10.2-0.11 have both; the new name wins
    with pytest.raises(ImportError, match="StructuredOutputsParams"):
        ve.choice_kwargs(SimpleNamespace(), ["a"])


def test_sampling_and_engine_settings_match_the_trainers_distribution():
    kwargs = ve.sampling_kwargs(0.7, max_tokens=5, stop_ids=[2], allowed=(4, 9), seed=3)
    assert kwargs["temperature"] == 0.7 and kwargs["top_p"] == 1.0 and kwargs["top_k"] == -1
    assert kwargs["min_p"] == 0.0 and kwargs["repetition_penalty"] == 1.0
    assert kwargs["presence_penalty"] == kwargs["frequency_penalty"] == 0.0
    assert kwargs["logprobs"] == 1 and kwargs["allowed_token_ids"] == [4, 9] and kwargs["stop_token_ids"] == [2]
    assert kwargs["max_tokens"] == 5 and kwargs["seed"] == 3 and kwargs["n"] == 1
    assert "allowed_token_ids" not in ve.sampling_kwargs(1.0, max_tokens=5, stop_ids=[2])

    engine = ve.engine_kwargs("/m", lora_rank=4, gpu_memory=0.3, seed=1)
    assert engine["logprobs_mode"] == "processed_logprobs" and engine["enable_prefix_caching"] is True
    assert engine["generation_config"] == "vllm" and engine["gpu_memory_utilization"] == 0.3
    assert engine["enable_lora"] is True and engine["max_lora_rank"] == 8 and engine["max_loras"] == 1
    assert "enable_lora" not in ve.engine_kwargs("/m", lora_rank=0, gpu_memory=0.3, seed=1)
    # A CPU has no memory fraction to give: its KV cache is vLLM's environment variable, in GiB.
    assert "gpu_memory_utilization" not in ve.engine_kwargs("/m", lora_rank=4, gpu_memory=0.3, seed=1, device="cpu")
    assert ve.cpu_environment(4, cores=2) == {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    assert [ve.lora_rank_slot(r) for r in (1, 4, 8, 9, 64, 512)] == [1, 8, 8, 16, 64, 512]
    with pytest.raises(ValueError, match="lora_rank"):
        ve.lora_rank_slot(1024)


def test_from_config_refuses_an_adapter_without_lora_and_unknown_ways(monkeypatch, tmp_path):
    from transformers import LlamaConfig

    monkeypatch.setitem(sys.modules, "vllm", None)
    untied = tmp_path / "untied"
    LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                tie_word_embeddings=False).save_pretrained(untied)
    full = EMPO2Config.from_profile("ci", env="corridor", method="grpo", lora_rank=0, model=str(untied),
                                    vllm_weight_sync="weights")
    with pytest.raises(ImportError, match="gpu"):  # full fine-tuning through the merged weights: allowed
        ve.VLLMEngine.from_config(full, None)
    tied = EMPO2Config.from_profile("ci", env="corridor", method="grpo", lora_rank=0,
                                    vllm_weight_sync="weights")  # SmolLM2 ties its output layer
    with pytest.raises(ValueError, match="lora_rank: 0 is not allowed with rollout_engine 'vllm' for .*tied"):
        ve.VLLMEngine.from_config(tied, None)
    with pytest.raises(ValueError, match="vllm_weight_sync: 'adapter' is not allowed with lora_rank 0"):
        EMPO2Config.from_profile("ci", env="corridor", method="grpo", lora_rank=0, rollout_engine="vllm",
                                 vllm_weight_sync="adapter")
    no_adapter = SimpleNamespace(trains_weights=True, lora_rank=0, vllm_weight_sync="adapter")
    with pytest.raises(ValueError, match="vllm_weight_sync: 'adapter' is not allowed with lora_rank 0"):
        ve.VLLMEngine.from_config(no_adapter, None)
    with pytest.raises(ValueError, match="vllm_weight_sync: 'lora' is not allowed; choose one of adapter, weights"):
        ve.VLLMEngine.from_config(SimpleNamespace(trains_weights=True, lora_rank=4, vllm_weight_sync="lora"), None)
    odd = SimpleNamespace(trains_weights=True, lora_rank=4, vllm_constraint="regex")
    with pytest.raises(ValueError, match="vllm_constraint: 'regex' is not allowed"):
        ve.VLLMEngine.from_config(odd, None)
    lora = EMPO2Config.from_profile("ci", env="corridor", method="grpo")
    with pytest.raises(ImportError, match="gpu"):
        ve.VLLMEngine.from_config(lora, None)


# ------------------------------------------------------------------ output conversion
def test_sampled_tokens_reads_the_sampled_tokens_logprob_not_the_top_ones():
    tokens, logprobs = ve.sampled_tokens(output([5, 7, 2], [-0.5, -1.5, 0.0], top=99))
    assert tokens == [5, 7, 2] and logprobs == [-0.5, -1.5, 0.0]
    no_logprobs = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[5], logprobs=None)])
    with pytest.raises(ValueError, match="logprobs=1"):
        ve.sampled_tokens(no_logprobs)
    short = output([5, 7], [-0.5, -1.5])
    short.outputs[0].logprobs.pop()
    with pytest.raises(ValueError, match="1 logprob entries for 2 tokens"):
        ve.sampled_tokens(short)
    wrong = output([5], [-0.5])
    wrong.outputs[0].logprobs[0] = {6: Logprob(-0.1)}
    with pytest.raises(ValueError, match="sampled token 5 at position 0"):
        ve.sampled_tokens(wrong)


def test_trie_paths_give_back_the_action_strings(tok):
    encoder = ActionEncoder(tok)
    fixed, templates = encoder.constraint(ACTIONS).paths()
    assert sorted(tok.decode(ids) for ids in fixed) == sorted(ACTIONS) and templates == []
    fixed, templates = encoder.constraint(WEBSHOP).paths()
    assert sorted(tok.decode(ids) for ids in fixed) == ["click[back to search]", "click[buy now]"]
    assert [tok.decode(ids) for ids in templates] == ["search["]


def test_follow_trie_records_the_tries_sets_and_zero_for_forced_tokens(tok):
    encoder = ActionEncoder(tok)
    constraint = encoder.constraint(ACTIONS)
    ids = ids_of(tok, "open door to kitchen") + [tok.eos_token_id, 123]  # a token after the end is dropped
    response = ve.follow_trie(constraint, ids, [-0.3] * len(ids))
    cursor = constraint.cursor()
    for token, logprob, allowed in zip(response.ids, response.logprobs, response.allowed):
        assert allowed == cursor.allowed()
        assert logprob == (0.0 if len(allowed) == 1 else -0.3)
        cursor.advance(token)
    assert cursor.done and response.ids == ids[:-1]
    other_spelling = [tok.convert_tokens_to_ids(c) for c in "go"] + ids_of(tok, " east") + [tok.eos_token_id]
    assert ids_of(tok, "go east")[0] not in other_spelling[:1]  # really another tokenisation
    assert ve.follow_trie(constraint, other_spelling, [-0.1] * len(other_spelling)) is None
    assert ve.follow_trie(constraint, ids_of(tok, "open door"), [-0.1] * 2) is None  # incomplete


# ------------------------------------------------------------------ the generation loop
def test_tokens_mode_asks_one_allowed_set_per_decision_and_appends_forced_runs(tok):
    encoder = ActionEncoder(tok)
    constraint = encoder.constraint(ACTIONS)
    prompts = {0: [1, 2, 3], 1: [4, 5, 6, 7], 2: [8]}  # no prompt starts another (the stand-in tells slots apart)
    targets = {0: "open door to hallway", 1: "go west", 2: "focus on red light bulb"}
    want = {slot: ids_of(tok, text) + [tok.eos_token_id] for slot, text in targets.items()}
    llm = FakeLLM(prompts, lambda slot, params: want[slot])
    generator = ve.VLLMGenerator(llm, tok, 3, temperature=0.6, lora_request="adapter", api=API)
    responses = generator.generate(prompts, 12, {slot: constraint for slot in prompts})

    for slot, response in responses.items():
        assert response.ids == want[slot] and action_text(tok.decode(response.ids, skip_special_tokens=True)) == targets[slot]
        reference = ve.follow_trie(constraint, response.ids, [0.0] * len(response.ids))
        assert response.allowed == reference.allowed  # the trie's sets, which the update scores with
        for k, (logprob, allowed) in enumerate(zip(response.logprobs, response.allowed)):
            assert logprob == (0.0 if len(allowed) == 1 else -(k + 1) / 10)
    decisions = {slot: sum(len(a) > 1 for a in r.allowed) for slot, r in responses.items()}
    assert generator.engine_calls == len(llm.calls) == max(decisions.values())
    assert generator.requests == sum(decisions.values())
    for prompts_sent, params, lora in llm.calls:
        assert lora == "adapter"
        for prompt, p in zip(prompts_sent, params):
            assert p.max_tokens == 1 and p.temperature == 0.6 and p.logprobs == 1 and p.allowed_token_ids
            slot = next(s for s, ids in prompts.items() if prompt["prompt_token_ids"][: len(ids)] == ids)
            sent = prompt["prompt_token_ids"][len(prompts[slot]):]
            assert sent == want[slot][: len(sent)]  # the whole conversation so far, response included
            assert set(p.allowed_token_ids) == set(responses[slot].allowed[len(sent)])


def test_free_text_response_ends_at_the_end_token_or_the_budget(tok):
    prompts = {0: [1, 2], 1: [3]}
    text = ids_of(tok, "The bulb is in the workshop.")
    llm = FakeLLM(prompts, lambda slot, params: text + [tok.eos_token_id] + ids_of(tok, " more"))
    generator = ve.VLLMGenerator(llm, tok, 2, api=API)
    responses = generator.generate(prompts, {0: 50, 1: 3})
    assert responses[0].ids == text + [tok.eos_token_id] and responses[0].allowed is None
    assert responses[1].ids == text[:3]
    assert responses[0].logprobs == [-(k + 1) / 10 for k in range(len(text) + 1)]
    assert len(llm.calls) == 1 and {p.max_tokens for p in llm.calls[0][1]} == {50, 3}
    assert all(p.stop_token_ids == [tok.eos_token_id] for p in llm.calls[0][1])
    with pytest.raises(ValueError, match="slots \\[5\\] do not exist"):
        generator.generate({5: [1]}, 4)


def test_template_argument_is_one_request_up_to_its_closing_token(tok):
    encoder = ActionEncoder(tok)
    constraint = encoder.constraint(WEBSHOP, free_text_tokens=8)
    prompts = {0: [1, 2]}
    argument = ids_of(tok, "red shoes]")
    want = ids_of(tok, "search[") + argument + [tok.eos_token_id]
    llm = FakeLLM(prompts, lambda slot, params: want)
    generator = ve.VLLMGenerator(llm, tok, 1, api=API, constraint="choice")  # a template: tokens way
    response = generator.generate(prompts, 12, {0: constraint})[0]
    assert action_text(tok.decode(response.ids, skip_special_tokens=True)) == "search[red shoes]"
    text_calls = [p for _, params, _ in llm.calls for p in params if getattr(p, "allowed_token_ids", None) is None]
    assert len(text_calls) == 1 and text_calls[0].max_tokens == 8
    assert tok.eos_token_id in text_calls[0].stop_token_ids and argument[-1] in text_calls[0].stop_token_ids
    assert not any(hasattr(p, "structured_outputs") for _, params, _ in llm.calls for p in params)
    prefix = len(ids_of(tok, "search["))
    assert response.allowed[prefix:] == [None] * (len(response.ids) - prefix)  # free text: any token


def test_choice_mode_is_one_request_and_keeps_the_grammars_allowed_sets(tok):
    encoder = ActionEncoder(tok)
    constraint = encoder.constraint(ACTIONS)
    prompts = {0: [1], 1: [2], 2: [3]}
    canonical = ids_of(tok, "focus on apple") + [tok.eos_token_id]
    other = [tok.convert_tokens_to_ids(c) for c in "go"] + ids_of(tok, " east") + [tok.eos_token_id]
    want = {0: canonical, 1: other, 2: canonical}
    asked = []

    def grammar_sets(tokenizer, choices, tokens, stop_ids):  # stands in for ChoiceGrammar (xgrammar)
        asked.append((sorted(choices), stop_ids))
        return [(token,) if token in stop_ids else (token, 7) for token in tokens]

    api = ve.VLLMApi(Params, lambda choices: {"structured_outputs": Choice(choices)}, grammar_sets)
    llm = FakeLLM(prompts, lambda slot, params: want[slot])
    generator = ve.VLLMGenerator(llm, tok, 3, api=api, constraint="choice")
    responses = generator.generate(prompts, 12, {slot: constraint for slot in prompts})

    assert len(llm.calls) == 1
    for p in llm.calls[0][1]:
        assert sorted(p.structured_outputs.choice) == sorted(ACTIONS) and not hasattr(p, "allowed_token_ids")
        assert p.max_tokens >= len(canonical)
    assert asked == [(sorted(ACTIONS), [tok.eos_token_id])] * 3
    for slot in prompts:  # kept as sampled, each position with the grammar's set; the stop token is forced
        response = responses[slot]
        assert response.ids == want[slot] and response.allowed == grammar_sets(tok, ACTIONS, want[slot], [tok.eos_token_id])
        assert response.logprobs == [0.0 if len(a) == 1 else -(k + 1) / 10 for k, a in enumerate(response.allowed)]
    assert generator.respelled == 1  # "go east" letter by letter: another spelling than the trie's, kept

    llm = FakeLLM({0: [1]}, lambda slot, params: ids_of(tok, "go") + [tok.eos_token_id])
    with pytest.raises(ValueError, match="'go', which is no admissible action"):
        ve.VLLMGenerator(llm, tok, 1, api=api, constraint="choice").generate({0: [1]}, 12, {0: constraint})


def test_a_state_with_one_action_needs_no_engine_call(tok):
    constraint = ActionEncoder(tok).constraint(["look around"])
    llm = FakeLLM({0: [1]}, lambda slot, params: pytest.fail("no call expected"))
    response = ve.VLLMGenerator(llm, tok, 1, api=API).generate({0: [1]}, 12, {0: constraint})[0]
    assert response.ids == ids_of(tok, "look around") + [tok.eos_token_id] and set(response.logprobs) == {0.0}
    assert llm.calls == []


def test_seeds_come_from_the_generators_rng(tok):
    import numpy as np

    prompts = {0: [1], 1: [2]}
    draws = []
    for _ in range(2):
        llm = FakeLLM(prompts, lambda slot, params: [tok.eos_token_id])
        ve.VLLMGenerator(llm, tok, 2, api=API, rng=np.random.default_rng(7)).generate(prompts, 4)
        draws.append([p.seed for p in llm.calls[0][1]])
    assert draws[0] == draws[1] and len(set(draws[0])) == 2 and all(isinstance(s, int) for s in draws[0])
    llm = FakeLLM(prompts, lambda slot, params: [tok.eos_token_id])
    ve.VLLMGenerator(llm, tok, 2, api=API).generate(prompts, 4)
    assert {p.seed for p in llm.calls[0][1]} == {None}


# ------------------------------------------------------------------ adapter versions
def tiny_lora_model():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    return get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


def test_adapter_folder_publishes_a_new_id_only_when_the_weights_change(tmp_path):
    model = tiny_lora_model()
    folder = ve.AdapterFolder(tmp_path / "adapters", keep=2)
    first = folder.publish(model)
    assert (first.id, first.name) == (1, "policy-v1") and first.path == tmp_path / "adapters" / "v00001"
    assert {p.name for p in first.path.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    assert json.loads((first.path / "adapter_config.json").read_text())["r"] == 4
    assert folder.publish(model) is first  # unchanged weights: same version, nothing saved
    lora_b = next(p for n, p in model.named_parameters() if "lora_B" in n)
    for step in (2, 3):
        with torch.no_grad():
            lora_b.add_(0.01)
        version = folder.publish(model)
        assert version.id == step and version.path.exists()
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["v00002", "v00003"]  # keep=2
    with pytest.raises(ValueError, match="no LoRA parameters"):
        ve.adapter_fingerprint(torch.nn.Linear(2, 2))


def test_engine_generators_carry_the_current_adapter(tmp_path, tok):
    model = tiny_lora_model()
    LoRARequest = namedtuple("LoRARequest", "lora_name lora_int_id lora_path")
    llm = FakeLLM({0: [1]}, lambda slot, params: [tok.eos_token_id])
    engine = ve.VLLMEngine(llm, tok, adapters=ve.AdapterFolder(tmp_path / "a"), api=API, lora_request_class=LoRARequest)
    engine.generator(model, 1, temperature=1.0).generate({0: [1]}, 4)
    engine.generator(model, 1, temperature=1.0).generate({0: [1]}, 4)
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "lora_A" in n).mul_(2)
    engine.generator(model, 1, temperature=1.0).generate({0: [1]}, 4)
    ids = [lora.lora_int_id for _, _, lora in llm.calls]
    assert ids == [1, 1, 2] and llm.calls[-1][2].lora_path == str(tmp_path / "a" / "v00002")
    base = ve.VLLMEngine(llm, tok, adapters=None, api=API)
    assert base.generator(model, 1, temperature=1.0).lora_request is None
    engine.close()
    assert not (tmp_path / "a").exists()


# ------------------------------------------------------------------ merged weights
def trained_lora_model():
    """The tiny LoRA model after one real optimiser step (its B matrices are no longer zero)."""
    model = tiny_lora_model()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
    model(torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss.backward()
    optimizer.step()
    return model, optimizer


def test_merged_weights_are_the_peft_merge_under_the_base_models_names():
    import copy

    model, _ = trained_lora_model()
    weights = ve.merged_weights(model)
    reference = copy.deepcopy(model).merge_and_unload()  # peft's own merge
    assert set(weights) == {name for name, _ in reference.named_parameters()}
    assert not any("lora_" in name or "base_layer" in name for name in weights)
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(weights[name], parameter.detach(), rtol=1e-6, atol=1e-6)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(weights[q], model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight)
    plain = torch.nn.Linear(3, 2)
    assert set(ve.merged_weights(plain)) == {"weight", "bias"}


def test_weights_folder_saves_again_only_after_the_weights_change(tmp_path):
    from safetensors.torch import load_file

    model, optimizer = trained_lora_model()
    folder = ve.WeightsFolder(tmp_path / "w")
    assert folder.publish(model) == tmp_path / "w"  # the first call always saves
    saved = load_file(tmp_path / "w" / "model.safetensors")
    assert saved.keys() == ve.merged_weights(model).keys()
    assert folder.publish(model) is None and folder.saves == 1  # unchanged
    model(torch.tensor([[4, 3, 2, 1]]), labels=torch.tensor([[4, 3, 2, 1]])).loss.backward()
    optimizer.step()  # an in-place update moves the parameters' version counters
    assert folder.publish(model) == tmp_path / "w" and folder.saves == 2
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(load_file(tmp_path / "w" / "model.safetensors")[q], saved[q])
    halved = ve.WeightsFolder(tmp_path / "bf16", "bfloat16")  # saved in the engine's dtype
    halved.publish(model)
    assert {w.dtype for w in load_file(tmp_path / "bf16" / "model.safetensors").values()} == {torch.bfloat16}


def test_engine_reloads_merged_weights_when_they_change_and_empties_its_prefix_cache(tmp_path, tok):
    class ReloadingLLM(FakeLLM):
        def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            self.calls.append(("rpc", method, kwargs))

        def reset_prefix_cache(self):
            self.calls.append(("reset",))

        @property
        def llm_engine(self):
            return SimpleNamespace(engine_core=SimpleNamespace(shutdown=lambda: self.calls.append(("shutdown",))))

    model, optimizer = trained_lora_model()
    llm = ReloadingLLM({0: [1]}, lambda slot, params: [tok.eos_token_id])
    engine = ve.VLLMEngine(llm, tok, weights=ve.WeightsFolder(tmp_path / "w"), api=API)
    for _ in range(2):
        generator = engine.generator(model, 1, temperature=1.0)
        assert generator.lora_request is None  # the engine holds the merged weights itself
        generator.generate({0: [1]}, 4)
    model(torch.tensor([[4, 3, 2, 1]]), labels=torch.tensor([[4, 3, 2, 1]])).loss.backward()
    optimizer.step()
    engine.generator(model, 1, temperature=1.0).generate({0: [1]}, 4)
    kinds = [call[0] if call[0] in ("rpc", "reset") else "generate" for call in llm.calls]
    assert kinds == ["rpc", "reset", "generate", "generate", "rpc", "reset", "generate"]
    assert llm.calls[0][1:] == ("reload_weights", {"weights_path": str(tmp_path / "w")})
    assert engine.weight_loads == 2
    with pytest.raises(ValueError, match="not both"):
        ve.VLLMEngine(llm, tok, weights=ve.WeightsFolder(tmp_path / "x"), adapters=ve.AdapterFolder(tmp_path / "a"))
    engine.close()
    assert llm.calls[-1] == ("shutdown",)  # the engine's processes stop now, not at garbage collection
    assert not (tmp_path / "w").exists()


# ------------------------------------------------------------------ vLLM itself, on this CPU
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def run_check(*options: str) -> tuple[int, list[str], str]:
    """`python -m empo2.llm.vllm_check` in .venv-vllm: its exit code, its `vllm` lines, and the tail of its output."""
    done = subprocess.run([str(VLLM_PYTHON), "-m", "empo2.llm.vllm_check", "--device", "cpu", *options],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("vllm")]
    return done.returncode, lines, done.stdout[-2000:] + done.stderr[-2000:]


NO_VLLM = "vLLM's CPU build is not installed here: `make vllm-check` builds .venv-vllm and runs this"


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=NO_VLLM)
@pytest.mark.parametrize("sync", CHOICES["vllm_weight_sync"])
def test_the_engine_on_this_cpu_samples_what_the_update_scores(sync):
    """The real engine, float32, with a non-zero adapter sent either way: the three ways' log-probs equal the
    policy's within 1e-3, where the adapter moves them by far more (a sync that did not arrive would fail)."""
    code, lines, tail = run_check("--dtype", "float32", "--weight-sync", sync)
    assert code == 0 and len(lines) == 4 and "PASSED" in lines[-1], tail
    moved = [float(line.split("moves them up to ")[1].split()[0]) for line in lines[:3]]
    assert min(moved) > 2 * vllm_check.CHECK_FLOAT32_BOUND, lines


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=NO_VLLM)
@pytest.mark.parametrize("dtype", ("float32", "bfloat16"))
def test_an_engine_that_never_receives_the_adapter_fails_the_check(dtype):
    """The check can fail: the same engine, sampling the base model because the adapter is never sent, is caught in
    both dtypes (its gaps are the adapter's effect, above the bound)."""
    code, lines, tail = run_check("--dtype", dtype, "--broken")
    assert code == 1 and len(lines) == 4 and "FAILED" in lines[-1], tail
    assert all("NOT held" in line for line in lines[:3]), lines
