"""Megatron-Bridge's flat pretraining perf recipes for the Llama 3 and Qwen3 families, as data: one row per
``<model>_pretrain_<N>gpu_<gpu>_<dtype>_config`` function of its ``megatron.bridge.perf_recipes`` package.
:mod:`megatron_bridge.recipes.perf_configs` turns the rows into
:class:`~megatron_bridge.recipes.perf_configs.PerfConfig` objects and picks one as Megatron-Bridge's launcher does."""

from megatron_bridge.recipes.perf_tables.llama import LLAMA_ROWS
from megatron_bridge.recipes.perf_tables.qwen import QWEN_ROWS


MB_COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
"""The NVIDIA-NeMo/Megatron-Bridge commit the rows were read at."""
ROW_FIELDS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
              "virtual_pipeline_model_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
              "sequence_parallel", "global_batch_size", "micro_batch_size", "seq_length", "env_vars")
"""The positional values of a row, in order (then an optional dict of extras)."""
ROWS: dict[str, tuple] = {**LLAMA_ROWS, **QWEN_ROWS}
"""Every row, by Megatron-Bridge's function name."""
