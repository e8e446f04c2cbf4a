"""The embedded model's Hugging Face id (SGLang's users pass it as --model-path) names the
embedded GGUF with no download; another Hub id that is no local path says treadle does not
download models and what to pass instead."""
from __future__ import annotations

import pytest

from treadle.runtime.model_source import embedded_model_path, resolve_model_source

HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_the_embedded_models_hf_id_resolves_to_its_gguf_and_other_ids_say_there_is_no_download(tmp_path,
                                                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)
    for model_path in (HF_ID, HF_ID.lower()):
        source = resolve_model_source(model_path)
        assert (source.kind, source.path) == ("gguf", embedded_model_path())
    with pytest.raises(ValueError, match="treadle does not download models.*--local-dir DIR"):
        resolve_model_source("meta-llama/Llama-3.1-8B-Instruct")
    # a local directory of that name wins over the id
    local = tmp_path / "HuggingFaceTB" / "SmolLM2-135M-Instruct"
    local.mkdir(parents=True)
    with pytest.raises(ValueError, match="a directory without config.json"):
        resolve_model_source(HF_ID)
