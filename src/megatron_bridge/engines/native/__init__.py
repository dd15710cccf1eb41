"""The native engine (``model.engine="native"``): :class:`.engine.NativeEngine` and its optimizer
(:mod:`.optimizer`). Its model is :mod:`megatron_bridge.models` (``LlamaModel``, MoE, pipeline stages); its
data-parallel backends, pipeline schedules and tensor/context/expert parallelism are :mod:`megatron_bridge.distributed`.
"""
