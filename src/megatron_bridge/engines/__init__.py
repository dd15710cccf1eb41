"""The model engines: one object per ``model.engine`` that builds everything engine-specific of a run.

* :mod:`.base`: the :class:`~.base.Engine` protocol (model chunks, data-parallel backend, optimizer, grad scaler,
  pipeline runner, default forward step, teardown) and the :class:`~.base.PipelineRunner` protocol both runners
  implement.
* :mod:`.factory`: :func:`~.factory.get_engine`, the one place that reads ``model.engine``, and
  :func:`~.factory.engine_memory`, the engine's memory model for the estimate.
* :mod:`.memory`: the :class:`~.memory.EngineMemory` protocol (torch-free) an engine that allocates its state
  differently from the native formulas of :mod:`megatron_bridge.perf.memory` implements.
* :mod:`.native`: this library's torch-native engine (its model in :mod:`megatron_bridge.models`, its backends and
  pipeline in :mod:`megatron_bridge.distributed`).
* :mod:`.megatron_core`: megatron-core's ``GPTModel``, its parallel state, schedules, optimizer, precision, its
  DDP / Megatron FSDP / FSDP2 wrappers and its memory model; megatron-core is imported only inside these modules'
  functions.
* :mod:`.ddp_wrap`: ``ddp_wrap(model_chunks, cfg, device)``, the backend of the config's engine.

The training set-up and loop ask the engine and never compare the engine's name (a test counts the comparisons).
"""
