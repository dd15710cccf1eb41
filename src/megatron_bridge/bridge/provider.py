"""``GPTModelProvider``: what ``AutoBridge.to_megatron_provider()`` returns — a :class:`ModelConfig` (assign it to
``cfg.model``) that also builds itself as Megatron-Bridge's provider does.

>>> provider = bridge.to_megatron_provider()                          # doctest: +SKIP
>>> provider.tensor_model_parallel_size = 1
>>> provider.finalize()
>>> model = provider.provide_distributed_model(wrap_with_ddp=False)   # list of model chunks

:meth:`GPTModelProvider.provide_distributed_model` takes Megatron-Bridge's keyword names and defaults
(``src/megatron/bridge/models/model_provider.py`` at 067f987) and maps them onto this library's run config
(:func:`distributed_run_config`): ``ddp_config`` → ``cfg.ddp`` (the fields both have), ``fp16``/``bf16`` →
``cfg.mixed_precision`` ``"fp16_mixed"``/``"bf16_mixed"``, ``use_megatron_fsdp``/``use_torch_fsdp2`` → ``cfg.dist``,
``init_model_with_meta_device`` → ``model.init_model_with_meta_device``. The chunks come from the config's engine
(``model.engine``), the pre-wrap hooks run on them (``to_megatron_provider(load_weights=True)`` registers the one that
copies the Hugging Face weights in), then ``wrap_with_ddp`` wraps them with ``ddp_wrap`` (a one-process group is created
when none exists: gloo on CPU). Options this library cannot honour are refused by name, never ignored.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.distributed import DistributedDataParallelConfig
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.models.validation import check_model_buildable


WrapHook = Callable[[list[nn.Module]], list[nn.Module]]
"""A pre- or post-wrap hook: takes this rank's model chunks, returns them (possibly replaced)."""


class _DefaultWrapper:
    """Marker for ``mixed_precision_wrapper``'s default (Megatron-Bridge's ``Float16Module``): the engine's own."""

    def __repr__(self) -> str:
        return "Float16Module"


DEFAULT_MIXED_PRECISION_WRAPPER = _DefaultWrapper()
"""``mixed_precision_wrapper``'s default: the engine applies its own (megatron-core's ``Float16Module`` on the
megatron-core engine; autocast / the FSDP mixed-precision policy on the native one)."""


def _ddp_section(ddp_config: Any) -> DistributedDataParallelConfig:
    """``cfg.ddp`` from Megatron-Bridge's ``ddp_config`` (megatron-core's ``DistributedDataParallelConfig``, ours, or
    a dict): every field both have is copied."""
    if ddp_config is None:
        return DistributedDataParallelConfig()
    if isinstance(ddp_config, DistributedDataParallelConfig):
        return dataclasses.replace(ddp_config)
    values = ddp_config if isinstance(ddp_config, dict) else vars(ddp_config)
    names = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    return DistributedDataParallelConfig(**{k: v for k, v in values.items() if k in names})


def _refuse(name: str, value: Any, why: str) -> None:
    raise ConfigValidationError(f"provide_distributed_model({name}={value!r}) is not supported: {why}", (name,))


def _check_supported(*, overlap_param_gather_with_optimizer_step: bool, data_parallel_random_init: bool,
                     mixed_precision_wrapper: Any, pg_collection: Any, fp16: bool | None, bf16: bool | None) -> None:
    if overlap_param_gather_with_optimizer_step:
        _refuse("overlap_param_gather_with_optimizer_step", True, "use ddp_config.overlap_param_gather")
    if data_parallel_random_init:
        _refuse("data_parallel_random_init", True, "every data-parallel rank starts from rank 0's weights")
    if mixed_precision_wrapper is not DEFAULT_MIXED_PRECISION_WRAPPER:
        _refuse("mixed_precision_wrapper", mixed_precision_wrapper,
                "the engine applies its own (megatron-core's Float16Module on model.engine='megatron_core'); leave "
                "the default")
    if pg_collection is not None:
        _refuse("pg_collection", pg_collection, "the process groups come from the config's parallel sizes")
    if fp16 and bf16:
        _refuse("fp16", fp16, "fp16=True and bf16=True together; pick one")


def distributed_run_config(model: ModelConfig, *, ddp_config: Any = None, fp16: bool | None = None,
                           bf16: bool | None = None, use_megatron_fsdp: bool = False, use_torch_fsdp2: bool = False,
                           init_model_with_meta_device: bool | None = None) -> ConfigContainer:
    """The run config ``provide_distributed_model``'s keywords describe for ``model`` (module docstring)."""
    fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(ModelConfig)}
    plain = ModelConfig(**fields)
    if init_model_with_meta_device is not None:
        plain.init_model_with_meta_device = init_model_with_meta_device
    cfg = ConfigContainer(model=plain, ddp=_ddp_section(ddp_config))
    cfg.dist.use_megatron_fsdp = use_megatron_fsdp
    cfg.dist.use_torch_fsdp2 = use_torch_fsdp2
    if bf16:
        cfg.mixed_precision = "bf16_mixed"
    elif fp16:
        cfg.mixed_precision = "fp16_mixed"
    return cfg.finalize()


@dataclass(kw_only=True, eq=False)
class GPTModelProvider(ModelConfig):
    """A :class:`ModelConfig` with Megatron-Bridge's provider methods (module docstring). The hooks are not config
    fields: ``to_yaml``, ``dataclasses.replace`` and overrides carry the fields only, and it equals any
    :class:`ModelConfig` with the same fields."""

    def __post_init__(self) -> None:
        self._pre_wrap_hooks: list[WrapHook] = []
        self._post_wrap_hooks: list[WrapHook] = []

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ModelConfig):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in dataclasses.fields(ModelConfig))

    def finalize(self) -> None:
        """Check that the fields form a model this library builds (the model rules of ``validate()``, with its
        errors); nothing is rewritten.

        Raises:
            ConfigValidationError: a violated model rule, naming the field and the fix.
        """
        check_model_buildable(self)

    def register_pre_wrap_hook(self, hook: WrapHook, prepend: bool = False) -> None:
        """Run ``hook`` on the built chunks before they are wrapped (first with ``prepend``)."""
        self._pre_wrap_hooks.insert(0 if prepend else len(self._pre_wrap_hooks), hook)

    def register_post_wrap_hook(self, hook: WrapHook, prepend: bool = False) -> None:
        """Run ``hook`` on the wrapped chunks (first with ``prepend``)."""
        self._post_wrap_hooks.insert(0 if prepend else len(self._post_wrap_hooks), hook)

    def provide_distributed_model(
        self,
        ddp_config: Any = None,
        model_type: Any = None,
        overlap_param_gather_with_optimizer_step: bool = False,
        fp16: bool | None = None,
        bf16: bool | None = None,
        use_megatron_fsdp: bool = False,
        use_torch_fsdp2: bool = False,
        wrap_with_ddp: bool = True,
        data_parallel_random_init: bool = False,
        use_cpu_initialization: bool | None = False,
        init_model_with_meta_device: bool | None = None,
        pre_wrap_hook: WrapHook | list[WrapHook] | None = None,
        post_wrap_hook: WrapHook | None = None,
        mixed_precision_wrapper: Any = DEFAULT_MIXED_PRECISION_WRAPPER,
        pg_collection: Any = None,
    ) -> list[nn.Module]:
        """This rank's model chunks, built by the engine, hooked and (``wrap_with_ddp``) wrapped.

        Megatron-Bridge's keywords and defaults. ``model_type`` is accepted (decoder-only models only here).
        ``pre_wrap_hook`` / ``post_wrap_hook`` replace the registered hooks, as there. ``use_cpu_initialization``
        builds on the CPU; otherwise on the process's device (the CPU with gloo).

        Raises:
            ConfigValidationError: an option this library cannot honour (named), or a model rule.
        """
        from megatron_bridge.distributed.init import initialize_distributed, pipeline_parallel_rank
        from megatron_bridge.engines.ddp_wrap import ddp_wrap
        from megatron_bridge.engines.factory import get_engine

        _check_supported(overlap_param_gather_with_optimizer_step=overlap_param_gather_with_optimizer_step,
                         data_parallel_random_init=data_parallel_random_init,
                         mixed_precision_wrapper=mixed_precision_wrapper, pg_collection=pg_collection, fp16=fp16,
                         bf16=bf16)
        cfg = distributed_run_config(self, ddp_config=ddp_config, fp16=fp16, bf16=bf16,
                                     use_megatron_fsdp=use_megatron_fsdp, use_torch_fsdp2=use_torch_fsdp2,
                                     init_model_with_meta_device=init_model_with_meta_device)
        check_model_buildable(cfg.model)
        env = initialize_distributed(cfg)
        device = torch.device("cpu") if use_cpu_initialization else env.device
        chunks = get_engine(cfg).build_model_chunks(cfg, device, pipeline_parallel_rank(cfg, env.rank, env.world_size))
        pre = self._pre_wrap_hooks if pre_wrap_hook is None else (
            pre_wrap_hook if isinstance(pre_wrap_hook, list) else [pre_wrap_hook])
        for hook in pre:
            chunks = hook(chunks)
        if wrap_with_ddp:
            chunks = list(ddp_wrap(chunks, cfg, device).chunks)
        for hook in self._post_wrap_hooks if post_wrap_hook is None else [post_wrap_hook]:
            chunks = hook(chunks)
        return chunks


def provider_from(model: ModelConfig) -> GPTModelProvider:
    """A provider holding ``model``'s fields (no hooks)."""
    return GPTModelProvider(**{f.name: getattr(model, f.name) for f in dataclasses.fields(ModelConfig)})
