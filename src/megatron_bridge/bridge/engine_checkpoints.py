"""Weights between the native engine's checkpoints and megatron-core ``torch_dist`` checkpoints, in one process.

* :func:`read_mcore_weights`: the model weights of a megatron-core checkpoint (ours, Megatron-Bridge's or
  Megatron-LM's) under the native engine's names (full tensors); :func:`read_fsdp_dtensor_weights` the same for a
  Megatron FSDP ``fsdp_dtensor`` checkpoint (a DCP folder read in one process, no megatron-core model).
* :func:`write_mcore_checkpoint`: native-named weights as a megatron-core checkpoint (``iter_0000000``, model only,
  the trackers, our manifest), which ``model.engine='megatron_core'`` loads at any TP/DP (``checkpoint.load`` or
  ``checkpoint.pretrained_checkpoint``).

Precision: a checkpoint of a ``bf16_mixed``/``fp16_mixed`` run holds the bf16/fp16 model weights (``model``: what
``Float16Module`` computes with) and the fp32 main parameters (``optimizer.state.fp32_param.*``, optimizer state).
Conversion takes the model weights, in the dtype the checkpoint stores them, as Megatron-Bridge's export to Hugging
Face does (``load_megatron_model``: model weights only); the fp32 main parameters are optimizer state, kept only by
resuming the checkpoint itself. Native weights are written in their own dtype; a bf16/fp16 run that starts from
them (``checkpoint.pretrained_checkpoint``) casts them to its compute dtype and takes its fp32 main parameters from
them, as Megatron-Bridge does.

Both build one TP=1 ``GPTModel`` on the CPU (no initialisation, no CUDA) and let megatron-core's own
``sharded_state_dict`` decide the checkpoint's keys and shapes (stacked layers, TE-style layer-norm names, gated
MLP halves; written by :func:`save_one_process`); :mod:`megatron_bridge.engines.megatron_core.weights` maps the names.
megatron-core needs ``torch.distributed``: a 1-process gloo group (and megatron-core's parallel state) is created
for the call and destroyed afterwards; inside a multi-process job the conversion is refused.
``scripts/checkpoint/convert.py --to megatron_core`` and ``convert_weights`` (:mod:`.convert`) call these; HF
folders go through the rest of the Bridge on the way in and out.
"""

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint import save as dcp_save

from megatron_bridge.bridge.hf_reader import CONFIG_FILENAME, is_hf_folder, read_json
from megatron_bridge.bridge.output import staged_output_dir
from megatron_bridge.checkpoint import files, mcore_reader, mcore_state
from megatron_bridge.checkpoint.load import resolve_checkpoint_folder
from megatron_bridge.checkpoint.reader import DCP_ERRORS, dcp_error_message
from megatron_bridge.checkpoint.saved_run import read_model_config
from megatron_bridge.config.decoder_names import VOCAB_PARAMETERS
from megatron_bridge.distributed.init import groups_destroyed_after
from megatron_bridge.errors import BridgeError, CheckpointError


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.config.model import ModelConfig

EMBEDDING_KEY = "embedding.word_embeddings.weight"
"""The megatron-core checkpoint key whose rows are the padded vocabulary."""


@contextmanager
def _one_process_mcore() -> Iterator[None]:
    """A 1-process gloo group (unless one exists) and megatron-core TP=PP=1 parallel state for the block, created and
    destroyed here, megatron-core's groups included."""
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized() or (dist.is_initialized() and dist.get_world_size() > 1):
        raise CheckpointError("converting megatron-core checkpoints runs in one process outside a training job "
                              "(scripts/checkpoint/convert.py)")
    created = not dist.is_initialized()
    if created:
        store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with groups_destroyed_after():  # megatron-core's groups, also in a process that keeps its default group
            ps.initialize_model_parallel(1, 1)
            try:
                yield
            finally:
                ps.destroy_model_parallel()
    finally:
        if created:
            dist.destroy_process_group()


def _tp1_model(model: "ModelConfig", vocab_rows: int) -> torch.nn.Module:
    """A TP=1 ``GPTModel`` of ``model`` on the CPU with ``vocab_rows`` embedding rows, weights left uninitialised, in
    fp32 (every stored dtype loads into it exactly; megatron-core builds some weights, e.g. torch norms, in fp32
    whatever ``params_dtype`` says); MoE layers with EP 1 and the all-gather dispatcher (the same weights)."""
    from megatron.core.models.gpt import GPTModel

    from megatron_bridge.engines.megatron_core.provider import layer_spec, transformer_config

    flat = dataclasses.replace(model, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                               virtual_pipeline_model_parallel_size=None, context_parallel_size=1,
                               sequence_parallel=False, transformer_impl="local", params_dtype="float32",
                               pipeline_dtype=None)
    if flat.is_moe:  # the weights are the same; megatron-core's all-to-all dispatcher makes a CUDA stream when built
        flat = dataclasses.replace(flat, expert_model_parallel_size=1, expert_tensor_parallel_size=None,
                                   moe_token_dispatcher_type="allgather")
    config = transformer_config(flat, torch.device("cpu"))
    config.perform_initialization = False
    return GPTModel(config=config, transformer_layer_spec=layer_spec(flat, config, pp_rank=0), vocab_size=vocab_rows,
                    max_sequence_length=flat.seq_length, pre_process=True, post_process=True,
                    share_embeddings_and_output_weights=flat.share_embeddings_and_output_weights,
                    position_embedding_type="rope", rotary_base=flat.rotary_base, rope_scaling=flat.rope_scaling,
                    rope_scaling_factor=flat.rope_scaling_factor)


def _weights(gpt: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in gpt.state_dict().items() if not k.endswith("_extra_state")}


def read_mcore_weights(folder: str | Path, model: "ModelConfig") -> dict[str, torch.Tensor]:
    """Full model weights (native names, the checkpoint's padded vocabulary, the dtype the checkpoint stores its
    model weights in: bf16 for a ``bf16_mixed`` run) of the megatron-core ``torch_dist`` folder ``folder`` (an
    ``iter_NNNNNNN`` folder) for the architecture ``model``.

    Raises:
        CheckpointError: the folder is not a (complete, allowed) megatron-core checkpoint or does not fit ``model``.
    """
    from megatron_bridge.engines.megatron_core.weights import megatron_core_to_native

    metadata = mcore_reader.check_mcore_folder(folder)
    embedding = metadata.state_dict_metadata.get(EMBEDDING_KEY)
    if embedding is None:
        raise CheckpointError(f"{str(folder)!r} holds no {EMBEDDING_KEY!r}: not a GPT model checkpoint")
    with _one_process_mcore():
        gpt = _tp1_model(model, int(embedding.size[0]))
        loaded = mcore_reader.load_sharded({"model": gpt.sharded_state_dict()}, folder)
        try:
            gpt.load_state_dict(loaded["model"], strict=True)
        except RuntimeError as exc:
            raise CheckpointError(f"{str(folder)!r} does not fit the model config: {exc}") from exc
        stored = embedding.properties.dtype
        return {k: v.to(stored) for k, v in megatron_core_to_native(_weights(gpt), model).items()}


def read_fsdp_dtensor_weights(folder: str | Path, model: "ModelConfig") -> dict[str, torch.Tensor]:
    """Full model weights (native names, the checkpoint's padded vocabulary, the dtypes the checkpoint stores) of
    the Megatron FSDP ``fsdp_dtensor`` folder ``folder`` (an ``iter_NNNNNNN`` folder) for the architecture ``model``:
    :func:`megatron_bridge.checkpoint.mcore_megatron_fsdp_weights.read_model_weights` (one process, no
    megatron-core) under the native engine's names.

    Raises:
        CheckpointError: the folder is not a (complete, convertible) fsdp_dtensor checkpoint or does not fit ``model``
            (the loader names keys and shapes that differ).
    """
    from megatron_bridge.checkpoint.mcore_megatron_fsdp_weights import read_model_weights
    from megatron_bridge.engines.megatron_core.weights import megatron_core_to_native

    weights = read_model_weights(folder)
    try:
        return megatron_core_to_native(weights, model)
    except (RuntimeError, KeyError) as exc:  # the fused QKV / SwiGLU rows do not split for the model's heads
        raise CheckpointError(f"fsdp_dtensor checkpoint {str(folder)!r} does not fit the model config: {exc}") from exc


def save_one_process(state: dict[str, Any], folder: Path, content_metadata: dict[str, Any]) -> None:
    """What megatron-core's ``dist_checkpointing.save`` writes (the ``common_state`` object, the tensors through
    megatron-core's own key translation and ``MCoreSavePlanner``, ``metadata.json``), for one process on any device:
    megatron-core's writer synchronises CUDA and allocates CUDA tensors, which a CPU-only conversion cannot."""
    from megatron.core.dist_checkpointing.core import CheckpointingConfig, save_config
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.dist_checkpointing.state_dict_utils import save_preprocess
    from megatron.core.dist_checkpointing.strategies import torch as mcore_torch

    state = {**state, "content_metadata": content_metadata}
    sharded, common = save_preprocess(state, validate_access_integrity=False)
    sharded[mcore_reader.COMMON_STATE_KEY] = ShardedObject(mcore_reader.COMMON_STATE_KEY, common, (1,), (0,),
                                                           replica_id=0)
    flat, _, _ = mcore_torch._replace_state_dict_keys_with_sharded_keys(sharded, True)
    pyt_state = mcore_torch.mcore_to_pyt_state_dict(flat, False)
    writer = FileSystemWriter(folder, single_file_per_rank=True, sync_files=True, overwrite=False)
    planner = mcore_torch.MCoreSavePlanner(flatten_state_dict=False, flatten_sharded_tensors=False)
    try:
        dcp_save(pyt_state, storage_writer=writer, planner=planner, no_dist=True)
    except DCP_ERRORS as exc:
        raise CheckpointError(f"writing {str(folder)!r} failed: {dcp_error_message(exc)}") from exc
    save_config(CheckpointingConfig("torch_dist", 1), str(folder))


def megatron_core_checkpoint_config(cfg: "ConfigContainer", caller: str = "a megatron-core checkpoint") -> \
        "ConfigContainer":
    """A copy of ``cfg`` with ``model.engine='megatron_core'``; BridgeError, before any weight is read or written,
    when that engine cannot build the model's weights (MoE, ...: rule ``megatron_core_features``)."""
    from megatron_bridge.config.rules_engine import megatron_core_weight_problems

    out_cfg = copy.deepcopy(cfg)
    out_cfg.model.engine = "megatron_core"
    bad = megatron_core_weight_problems(out_cfg)
    if bad:
        what = ", ".join(f"{path}={value!r}" for path, value, _ in bad)
        raise BridgeError(f"{caller}: {what}: not supported by model.engine='megatron_core' in this version (rule "
                          "megatron_core_features or megatron_core_mla, docs/training/engines.md), so its weights "
                          "have no megatron-core layout; convert with engine='native' (the default), which trains "
                          "this model")
    return out_cfg


def write_mcore_checkpoint(weights: Mapping[str, torch.Tensor], cfg: "ConfigContainer", root: str | Path,
                           overwrite: bool = False, extra: Callable[[Path], None] | None = None) -> Path:
    """Write native-named ``weights`` as a megatron-core ``torch_dist`` checkpoint of ``cfg.model`` under ``root``
    (``iter_0000000``: model weights only, step 0, with megatron-core's ``dist_checkpointing.save``; the trackers,
    ``train_state.pt``, ``run_config.yaml`` with ``model.engine='megatron_core'`` and our manifest). The folder
    appears complete or not at all; ``extra(folder)`` may add files to ``iter_0000000`` before its commit. Returns
    the committed ``iter_0000000``.

    Raises:
        BridgeError: the megatron-core engine cannot build ``cfg.model``'s weights (rule ``megatron_core_features``).
        CheckpointError: the weights do not fit ``cfg.model``, or ``root`` holds files and not ``overwrite``.
    """
    from megatron_bridge.checkpoint.save import serialize
    from megatron_bridge.checkpoint.train_state import TrainState
    from megatron_bridge.engines.megatron_core.weights import native_to_megatron_core

    out_cfg = megatron_core_checkpoint_config(cfg)
    with _one_process_mcore(), staged_output_dir(root, overwrite=overwrite) as tmp:
        gpt = _tp1_model(cfg.model, int(weights[VOCAB_PARAMETERS[0]].shape[0]))
        dtypes = {t.dtype for t in weights.values()}
        if len(dtypes) == 1:  # written in the weights' own dtype (fp32 unless they are all bf16/fp16)
            gpt.to(dtypes.pop())
        mapped = native_to_megatron_core(weights, cfg.model)
        expected = _weights(gpt)
        if set(mapped) != set(expected) or any(mapped[k].shape != expected[k].shape for k in expected):
            bad = sorted(k for k in set(mapped) ^ set(expected)) or sorted(
                k for k in expected if mapped[k].shape != expected[k].shape)
            raise CheckpointError(f"the weights do not fit the model config (keys or shapes differ): {bad[:8]}")
        gpt.load_state_dict(mapped, strict=False)
        folder = files.temporary_dir(tmp, 0, files.new_save_id())
        folder.mkdir()
        state = {"checkpoint_version": mcore_state.CHECKPOINT_VERSION, "iteration": 0,
                 "model": gpt.sharded_state_dict()}
        save_one_process(state, folder, {"singleton_local_shards": False, "chained_optim_avoid_prefix": True})
        train_state = serialize(mcore_state.train_state_dict(TrainState()))
        (folder / files.TRAIN_STATE_FILENAME).write_bytes(train_state)
        (folder / files.RUN_CONFIG_FILENAME).write_text(out_cfg.to_yaml())
        if extra is not None:
            extra(folder)
        files.commit(folder, files.iteration_dir(tmp, 0),
                      {"step": 0, "format": "torch_dist", "engine": mcore_reader.MCORE_ENGINE,
                       "backend": "mcore_convert", "world_size": 1, "has_optimizer": False, "has_rng": False})
        files.write_trackers(tmp, 0, train_state)
    return files.iteration_dir(root, 0)


def run_config_of(src: str | Path, step: int | None, model_config: "ModelConfig | None") -> "ConfigContainer":
    """The run config a conversion output carries: a HF folder's (the Bridge's provider), a checkpoint's
    ``run_config.yaml``, or a default one around ``model_config`` (which always wins for the model when given).

    Raises:
        CheckpointError: ``src`` is a weights file or a foreign checkpoint and ``model_config`` is None.
    """
    from megatron_bridge.bridge.families import family_for_hf_config
    from megatron_bridge.config.container import ConfigContainer

    path = Path(src)
    if is_hf_folder(path):  # the model config AutoBridge.from_hf_pretrained(path).to_megatron_provider() returns
        hf = read_json(path / CONFIG_FILENAME, "config")
        cfg = ConfigContainer(model=family_for_hf_config(hf).config_from_hf(hf))
    elif path.is_dir() and (resolve_checkpoint_folder(path, step) / files.RUN_CONFIG_FILENAME).is_file() and (
            model_config is None):
        try:
            cfg = ConfigContainer.from_yaml(resolve_checkpoint_folder(path, step) / files.RUN_CONFIG_FILENAME)
        except ValueError as exc:
            raise CheckpointError(f"the run_config.yaml of {str(src)!r} is not this library's ({exc}): pass the "
                                  "model config (--config run_config.yaml)") from exc
    elif model_config is not None:
        cfg = ConfigContainer(model=model_config)
    else:
        raise CheckpointError(f"{str(src)!r} does not say its model config: pass --config run_config.yaml")
    if model_config is not None:
        cfg.model = model_config
    cfg.dataset.seq_length = cfg.model.seq_length
    return cfg


def model_config_of(folder: str | Path, model_config: "ModelConfig | None") -> "ModelConfig":
    """``model_config``, else the ``model`` section of the folder's ``run_config.yaml`` (ours).

    Raises:
        CheckpointError: neither is available (e.g. a checkpoint written by Megatron-Bridge or Megatron-LM).
    """
    if model_config is not None:
        return model_config
    try:
        return read_model_config(folder)
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}. A megatron-core checkpoint written by Megatron-Bridge or Megatron-LM needs "
                              "this library's model config: pass --config run_config.yaml (model_config=)") from exc
