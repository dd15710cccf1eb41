"""The one place that reads ``model.engine``: :func:`get_engine` returns the engine the config names."""

from typing import TYPE_CHECKING

from megatron_bridge.engines.base import Engine


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer


def get_engine(cfg: "ConfigContainer") -> Engine:
    """The :class:`~megatron_bridge.engines.base.Engine` of ``cfg.model.engine`` ("native" or "megatron_core";
    ``validate()`` refuses other values and a megatron-core that does not import)."""
    if cfg.model.engine == "megatron_core":
        from megatron_bridge.engines.megatron_core.engine import MegatronCoreEngine

        return MegatronCoreEngine()
    from megatron_bridge.engines.native.engine import NativeEngine

    return NativeEngine()
