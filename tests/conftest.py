import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Test models are tiny: one intra-op thread is faster than two, and never stalls in OpenMP
# barriers when the other core is busy (CI machines are shared).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct as a safetensors directory, fetched once into the launcher's cache
    (the same place `./dev.sh serve` uses). Only slow tests use it."""
    from sglang_dspark import zoo

    return zoo.resolve_model("smollm2-135m-instruct")


@pytest.fixture
def plugin_env(monkeypatch):
    """Set the plugin's environment and forget the cached settings around each test."""
    from sglang_dspark.sglang_plugin import settings

    def configure(**env):
        for key in (settings.PROFILE_ENV, settings.TIER_ENV, settings.LEARNING_ENV, settings.EXPORT_DIR_ENV):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        settings.settings.cache_clear()
        settings.profile_table.cache_clear()

    yield configure
    settings.settings.cache_clear()
    settings.profile_table.cache_clear()
