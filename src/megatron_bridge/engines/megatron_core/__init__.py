"""The megatron-core engine (``model.engine="megatron_core"``): megatron-core's ``GPTModel`` built from this library's
:class:`~megatron_bridge.config.model.ModelConfig`, wrapped by megatron-core's DistributedDataParallel and trained
with megatron-core's optimizer inside :func:`~megatron_bridge.training.pretrain.pretrain`.

* :mod:`.parallel_state`: megatron-core's process groups from the config's layout (the same rank order as
  :func:`megatron_bridge.distributed.init.build_device_mesh`), and its model-parallel RNG.
* :mod:`.provider`: ``TransformerConfig`` and the layer spec from the model fields, ``GPTModel`` chunks.
* :mod:`.optimizer`: ``get_megatron_optimizer`` from ``cfg.optimizer``.
* :mod:`megatron_bridge.engines.megatron_core.ddp`: the ``ddp_wrap`` backend of these chunks.

megatron-core is imported only by these modules, never when the config or the native engine is imported. It needs a
CUDA device (:func:`.parallel_state.require_cuda`); the CPU tests run it through a test-only harness
(tests/functional_tests/mcore_cpu_harness.py) that redirects its CUDA calls. See docs/training/engines.md.
"""
