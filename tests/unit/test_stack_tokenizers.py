"""`boomerang up` and `boomerang demo` point their gateways at the simulator's model files."""

from __future__ import annotations

import pytest
from boomerang_tools.sim import hfmodel
from boomerang_tools.stack.stack import sim_tokenizers, tokenizers_env


def test_each_profile_served_name_gets_the_simulators_files() -> None:
    plain, thinking = str(hfmodel.folder(False)), str(hfmodel.folder(True))
    assert sim_tokenizers(["qwen3-32b", "glm-5-fp8"], ["--enable-prompt-tokens-details"]) == {
        "Qwen/Qwen3-32B": plain, "zai-org/GLM-5-FP8": plain}
    assert sim_tokenizers(["qwen3-32b"], [], strip_reasoning=True) == {"Qwen/Qwen3-32B": thinking}
    assert sim_tokenizers(["qwen3-32b"], ["--strip-reasoning"]) == {"Qwen/Qwen3-32B": thinking}
    assert sim_tokenizers(["qwen3-32b"], ["--served-model-name", "mine"]) == {"mine": plain}
    assert sim_tokenizers(["qwen3-32b"], ["--served-model-name=mine"]) == {"mine": plain}
    assert sim_tokenizers([], []) == {}


def test_the_callers_own_entries_are_kept_and_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BOOMERANG_TOKENIZERS", raising=False)
    assert tokenizers_env({}) == {}
    assert tokenizers_env({"a": "/x", "b": "/y"}) == {"BOOMERANG_TOKENIZERS": "a=/x,b=/y"}
    monkeypatch.setenv("BOOMERANG_TOKENIZERS", "b=/mine,other")
    assert tokenizers_env({"a": "/x", "b": "/y"}) == {"BOOMERANG_TOKENIZERS": "b=/mine,other,a=/x"}
