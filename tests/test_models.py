"""Offline model provisioning: the packaged GGUF becomes a reusable HF folder."""

import pytest

from presto_ray import models


def test_missing_or_bad_model_folders_get_clear_errors(tmp_path):
    with pytest.raises(models.ModelProvisionError, match="does not exist"):
        models.check_model_dir(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(models.ModelProvisionError, match="not a Hugging Face model folder"):
        models.check_model_dir(tmp_path)


def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PRESTO_RAY_CACHE", str(tmp_path))
    assert models.default_model_dir() == tmp_path / "models" / models.MODEL_NAME


@pytest.mark.vllm
def test_prepared_model_is_reused_and_answers_sensibly(vllm_engine, hf_reference):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    messages = []
    assert models.prepare_smollm2(log=messages.append) == models.default_model_dir()
    assert messages == []  # already prepared: nothing converted again
    folder = models.default_model_dir()
    assert models.is_prepared(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])
