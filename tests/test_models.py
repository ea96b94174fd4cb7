"""The offline default models: policy load + one chat generation, embedder shape and norm, errors."""

import numpy as np
import pytest
import torch

from empo2.llm.models import DEFAULT_POLICY, default_dtype, resolve_policy_path


def test_policy_loads_offline_and_chats(policy_and_tokenizer):
    model, tokenizer = policy_and_tokenizer
    assert model.dtype == default_dtype()  # bfloat16 where the CPU has bf16 instructions, else float32
    assert sum(p.numel() for p in model.parameters()) > 100_000_000  # the real 135M model, not a stub
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    output = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    reply = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "paris" in reply.lower()


def test_the_dtype_variable_overrides_the_machines_choice_and_refuses_other_values(monkeypatch):
    monkeypatch.setenv("EMPO2_DTYPE", "float32")
    assert default_dtype() == torch.float32 and default_dtype("cuda") == torch.float32
    monkeypatch.setenv("EMPO2_DTYPE", "bfloat16")
    assert default_dtype() == torch.bfloat16
    monkeypatch.setenv("EMPO2_DTYPE", "fp16")
    with pytest.raises(ValueError, match="EMPO2_DTYPE: 'fp16' is not allowed; allowed: bfloat16, float32"):
        default_dtype()


def test_embedder_shape_and_unit_norm(embedder):
    vectors = embedder.encode(["You are in the kitchen.", "A red light bulb is on the table.", "kitchen"])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[2] > vectors[1] @ vectors[2]  # "kitchen" is closer to the kitchen sentence
    assert embedder.encode([]).shape == (0, 384)
    with pytest.raises(TypeError, match="list of strings"):
        embedder.encode("a single string")


def test_embedder_computes_each_distinct_text_once_and_matches_a_padded_batch(embedder):
    """Each distinct text is computed once, alone; its vector is the usual masked mean pooling over a padded batch."""
    from empo2.llm.models import Embedder

    texts = ["A room with a battery.", "The door is open.", "A room with a battery.", "A bird in a tree, far away."]
    cached = Embedder(cache_size=2)
    before = cached.computed
    first = cached.encode(texts)
    assert cached.computed - before == 3  # the repeated text once
    again = cached.encode(texts[2:])  # both still cached (a cache of 2 keeps the two most recent texts)
    assert cached.computed - before == 3
    np.testing.assert_array_equal(again, first[2:])
    batch = cached.tokenizer(texts, padding=True, return_tensors="pt")  # texts of different lengths: padding
    with torch.no_grad():
        hidden = cached.model(**batch).last_hidden_state  # (4, L, dim)
    mask = batch["attention_mask"].unsqueeze(-1).float()  # (4, L, 1)
    reference = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()  # (4, dim)
    np.testing.assert_allclose(first, reference, atol=1e-5)
    cached.encode(["The door is open."])  # evicted by the two more recent texts: computed again
    assert cached.computed - before == 4


def test_missing_model_gives_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no-such-org/no-such-model.*embedded default"):
        resolve_policy_path("no-such-org/no-such-model")


def test_default_policy_is_cached_after_first_conversion():
    path = resolve_policy_path(DEFAULT_POLICY)
    assert (torch.serialization.os.path.exists(f"{path}/model.safetensors"))
    assert resolve_policy_path(DEFAULT_POLICY) == path
