"""Config sections refuse names they do not declare, from Python (``cfg.train.micro_batch_sise = 4``) as from YAML and
overrides, with the section, the name and the nearest field; copies, pickling and YAML keep working."""

import copy
import dataclasses
import pickle
import typing

import pytest

from megatron_bridge.config import ConfigContainer, FSDP2Config, FSDP2MixedPrecisionPolicy, ModelConfig
from megatron_bridge.config.declared import RETIRED_NAMES
from megatron_bridge.config.serialization import to_dict
from megatron_bridge.errors import ConfigOverrideError, ConfigValidationError
from megatron_bridge.recipes import llama3_8b_pretrain_config


def _sections() -> dict[str, type]:
    """Every config dataclass under ``cfg.`` (found from ConfigContainer's annotations, nested ones too) → its path."""
    found: dict[str, type] = {"cfg": ConfigContainer}
    queue = [("", ConfigContainer)]
    while queue:
        prefix, cls = queue.pop(0)
        for name, tp in typing.get_type_hints(cls).items():
            for sub in [tp, *typing.get_args(tp)]:
                if dataclasses.is_dataclass(sub) and sub not in found.values():
                    found[prefix + name] = sub
                    queue.append((f"{prefix}{name}.", sub))
    return found


SECTIONS = _sections()


def _typo(name: str) -> str:
    """``name`` with its last two letters swapped (``micro_batch_size`` → ``micro_batch_siez``)."""
    return name[:-2] + name[-1] + name[-2]


def test_every_section_is_found() -> None:
    assert {"model", "train", "dist", "ddp", "fsdp2", "fsdp2.mp_policy", "mixed_precision",
            "distillation"} <= set(SECTIONS)
    assert len(SECTIONS) >= 20


@pytest.mark.parametrize("path", sorted(SECTIONS))
def test_a_typo_in_any_section_names_the_section_and_the_nearest_field(path: str) -> None:
    obj = SECTIONS[path]()
    name = max((f.name for f in dataclasses.fields(obj)), key=len)
    section = "" if path == "cfg" else f"{path}."
    with pytest.raises(ConfigValidationError, match=rf"did you mean '{section}{name}'\?") as info:
        setattr(obj, _typo(name), 1)
    assert info.value.paths == (f"{section}{_typo(name)}",)
    assert f"cfg.{section}{_typo(name)} = 1" in str(info.value)
    assert type(obj).__name__ in str(info.value)
    assert not hasattr(obj, _typo(name))


@pytest.mark.parametrize("path", sorted(SECTIONS))
def test_every_declared_field_can_be_set(path: str) -> None:
    obj = SECTIONS[path]()
    for f in dataclasses.fields(obj):
        setattr(obj, f.name, getattr(obj, f.name))
    assert obj == SECTIONS[path]()


def test_the_issue_example_is_refused_before_validate() -> None:
    cfg = llama3_8b_pretrain_config()
    with pytest.raises(ConfigValidationError, match=r"cfg\.train\.micro_batch_sise = 4: .*did you mean "
                                                    r"'train\.micro_batch_size'\?"):
        cfg.train.micro_batch_sise = 4  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", ["dist.use_tp_pp_dp_mapping", "train.skip_train", "logger.wandb_project"])
def test_a_retired_megatron_bridge_name_is_refused_with_its_replacement(path: str) -> None:
    section, name = path.split(".")
    cfg = ConfigContainer()
    with pytest.raises(ConfigValidationError) as from_python:
        setattr(getattr(cfg, section), name, True)
    with pytest.raises(ConfigOverrideError) as from_override:
        cfg.apply_overrides(overrides=[f"{path}=true"])
    for err in (from_python.value, from_override.value):
        assert path in str(err) and RETIRED_NAMES[path] in str(err)


def test_deprecated_eval_iters_is_refused_from_python_and_moved_from_overrides() -> None:
    """Megatron-Bridge's deprecated train.eval_iters: set from Python it names validation.eval_iters; from YAML or an
    override it is moved there (config/deprecated.py), as Megatron-Bridge does."""
    cfg = ConfigContainer()
    with pytest.raises(ConfigValidationError, match=r"train\.eval_iters.*set validation\.eval_iters"):
        cfg.train.eval_iters = 5  # type: ignore[attr-defined]
    assert cfg.apply_overrides(overrides=["train.eval_iters=5"]).validation.eval_iters == 5


def test_a_yaml_typo_gets_the_same_suggestion(tmp_path) -> None:
    (tmp_path / "c.yaml").write_text("train:\n  micro_batch_sise: 4\n")
    with pytest.raises(ConfigOverrideError, match=r"unknown config key 'train\.micro_batch_sise' \(did you mean "
                                                  r"'train\.micro_batch_size'\?\)"):
        ConfigContainer().apply_overrides(tmp_path / "c.yaml")


def test_a_read_only_property_is_named() -> None:
    with pytest.raises(ConfigValidationError, match=r"cfg\.train_iters is computed from the fields \(read-only\)"):
        ConfigContainer().train_iters = 3  # type: ignore[misc]


def test_copies_pickling_replace_and_yaml_keep_working(tmp_path) -> None:
    cfg = llama3_8b_pretrain_config()
    cfg.fsdp2 = FSDP2Config(mp_policy=FSDP2MixedPrecisionPolicy(param_dtype="float32"))
    assert copy.deepcopy(cfg) == cfg and copy.copy(cfg) == cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert dataclasses.replace(cfg.train, micro_batch_size=2).micro_batch_size == 2
    cfg.to_yaml(tmp_path / "c.yaml")
    assert ConfigContainer.from_yaml(tmp_path / "c.yaml") == cfg
    assert cfg.apply_overrides(overrides=["train.micro_batch_size=2"]).train.micro_batch_size == 2


def test_internal_names_and_subclasses_keep_working() -> None:
    from megatron_bridge.bridge.provider import GPTModelProvider

    provider = GPTModelProvider(num_layers=2)
    provider.register_pre_wrap_hook(lambda chunks: chunks)
    twin = copy.deepcopy(provider)
    assert len(twin._pre_wrap_hooks) == 1 and twin == provider
    with pytest.raises(ConfigValidationError, match=r"cfg\.model\.num_layer = 3: .*did you mean 'model\.num_layers'"):
        provider.num_layer = 3  # type: ignore[attr-defined]
    model = ModelConfig()
    model._cache = 1  # internal names (leading underscore) are not config fields and are not checked
    assert model._cache == 1 and "_cache" not in to_dict(model)


def test_a_torch_dtype_is_stored_as_its_name() -> None:
    """``provider.params_dtype = torch.bfloat16`` (Megatron-Bridge's examples): the config keeps the name."""
    import torch

    from megatron_bridge.bridge.provider import GPTModelProvider

    provider = GPTModelProvider(pipeline_dtype=torch.float16)
    provider.params_dtype = torch.bfloat16
    assert (provider.params_dtype, provider.pipeline_dtype) == ("bfloat16", "float16")
    cfg = ConfigContainer(model=provider)
    cfg.fsdp2.mp_policy = FSDP2MixedPrecisionPolicy(param_dtype=torch.float32)
    assert cfg.fsdp2.mp_policy.param_dtype == "float32"
    assert "params_dtype: bfloat16" in cfg.to_yaml()
    cfg.model.params_dtype = torch.int8
    with pytest.raises(ConfigValidationError, match=r"model\.params_dtype='int8' is not one of"):
        cfg.validate(world_size=1)
