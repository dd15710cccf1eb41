"""The model engines: one object per ``model.engine`` that builds everything engine-specific of a run.

* :mod:`.base`: the :class:`~.base.Engine` protocol (model chunks, data-parallel backend, optimizer, grad scaler,
  pipeline runner, default forward step, teardown) and the :class:`~.base.PipelineRunner` protocol both runners
  implement.
* :mod:`.factory`: :func:`~.factory.get_engine`, the one place that reads ``model.engine``.
* :mod:`.native`: this library's torch-native engine (its model in :mod:`megatron_bridge.models`, its backends and
  pipeline in :mod:`megatron_bridge.distributed`).
* :mod:`.megatron_core`: megatron-core's ``GPTModel``, its parallel state, schedules, optimizer, precision and its
  DDP / Megatron FSDP / FSDP2 wrappers; megatron-core is imported only inside these modules' functions.
* :mod:`.ddp_wrap`: ``ddp_wrap(model_chunks, cfg, device)``, the backend of the config's engine.

The training set-up and loop ask the engine and never compare the engine's name (a test counts the comparisons).
"""
