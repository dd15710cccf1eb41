"""The one place that reads ``model.engine``: :func:`get_engine` returns the engine the config names,
:func:`engine_memory` its memory model. Imports no torch (the memory estimate runs before any process starts)."""

from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.engines.base import Engine
    from megatron_bridge.engines.memory import EngineMemory


def get_engine(cfg: "ConfigContainer") -> "Engine":
    """The :class:`~megatron_bridge.engines.base.Engine` of ``cfg.model.engine`` ("native" or "megatron_core";
    ``validate()`` refuses other values and a megatron-core that does not import)."""
    if cfg.model.engine == "megatron_core":
        from megatron_bridge.engines.megatron_core.engine import MegatronCoreEngine

        return MegatronCoreEngine()
    from megatron_bridge.engines.native.engine import NativeEngine

    return NativeEngine()


def engine_memory(cfg: "ConfigContainer") -> "EngineMemory | None":
    """The :class:`~megatron_bridge.engines.memory.EngineMemory` of ``cfg.model.engine``; None for the native engine,
    whose formulas are :mod:`megatron_bridge.perf.memory`'s own."""
    if cfg.model.engine == "megatron_core":
        from megatron_bridge.engines.megatron_core.memory import MegatronCoreMemory

        return MegatronCoreMemory()
    return None
