"""AutoBridge keeps Megatron-Bridge's method names and positional parameters (NVIDIA-NeMo/Megatron-Bridge
``src/megatron/bridge/models/conversion/auto_bridge.py`` at 067f987df), so porters' calls bind the same way."""

import inspect

import pytest

import megatron_bridge
from megatron_bridge.bridge import AutoBridge


MEGATRON_BRIDGE_POSITIONAL = {
    "from_hf_pretrained": ["path"],
    "to_megatron_provider": ["load_weights", "hf_path"],
    "to_megatron_model": ["load_weights", "hf_path"],
    "load_hf_weights": ["model", "hf_path", "allowed_mismatched_params"],
    "export_hf_weights": ["model", "cpu", "show_progress", "conversion_tasks", "merge_adapter_weights",
                          "weight_dtype"],
    "save_hf_pretrained": ["model", "path", "show_progress", "source_path", "strict", "merge_adapter_weights",
                           "distributed_save", "save_every_n_ranks", "weight_dtype"],
    "save_hf_weights": ["model", "path", "show_progress", "strict", "merge_adapter_weights", "distributed_save",
                        "save_every_n_ranks", "weight_dtype"],
    "save_megatron_model": ["model", "path", "hf_tokenizer_path", "low_memory_save", "hf_tokenizer_kwargs"],
    "load_megatron_model": ["path"],
    "get_model_config": [],
    "get_model": ["model_config"],
    "get_conversion_tasks": ["megatron_model", "hf_path"],
    "import_ckpt": ["hf_model_id", "megatron_path"],
    "export_ckpt": ["megatron_path", "hf_path", "show_progress", "strict", "source_path"],
}


@pytest.mark.parametrize("name", list(MEGATRON_BRIDGE_POSITIONAL))
def test_positional_parameters_match_megatron_bridge(name: str) -> None:
    raw = AutoBridge.__dict__[name]  # a function, a classmethod or export_ckpt's class-or-instance descriptor
    func = getattr(raw, "func", None) or getattr(raw, "__func__", raw)
    params = [p for p in inspect.signature(func).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in ("self", "cls",
                                                                                        "self_or_cls")]
    assert [p.name for p in params] == MEGATRON_BRIDGE_POSITIONAL[name]


def test_top_level_import_is_lazy() -> None:
    assert megatron_bridge.AutoBridge is AutoBridge
    with pytest.raises(AttributeError):
        megatron_bridge.NoSuchThing  # noqa: B018
    import subprocess
    import sys

    code = ("import sys, megatron_bridge; "
            "assert 'torch' not in sys.modules and 'megatron_bridge.bridge' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
