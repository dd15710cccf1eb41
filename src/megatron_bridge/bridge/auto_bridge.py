"""``AutoBridge``: Hugging Face folders in and out, with Megatron-Bridge's names.

>>> bridge = AutoBridge.from_hf_pretrained("path/to/hf_folder")      # doctest: +SKIP
>>> provider = bridge.to_megatron_provider()                          # a ModelConfig with MB's provider methods
>>> provider.finalize()
>>> chunks = provider.provide_distributed_model(wrap_with_ddp=False)  # model chunks holding the HF weights
>>> bridge.save_hf_pretrained(chunks, "out/hf")                       # and back
>>> AutoBridge.import_ckpt("path/to/hf_folder", "ckpts/imported")     # HF folder -> our checkpoint (step 0)
>>> AutoBridge.export_ckpt("runs/x/checkpoints", "out/hf")            # any of our checkpoints -> HF folder

Differences from Megatron-Bridge (the method table in docs/megatron-bridge-differences.md, and
docs/training/hf-conversion.md): ``from_hf_pretrained`` reads a local folder only (no Hub download; nothing in a
folder is ever executed, ``trust_remote_code`` only permits it); ``to_megatron_provider`` returns a
:class:`~megatron_bridge.bridge.provider.GPTModelProvider`, i.e. our :class:`ModelConfig` (assign it to
``cfg.model``; ``pretrain()`` takes weights from ``checkpoint.pretrained_checkpoint``, not from the provider's
hooks); ``export_ckpt`` also works on the class, reading the model config from the checkpoint's
``run_config.yaml``.
"""

import dataclasses
from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch import nn

from megatron_bridge.bridge.assets import HF_ASSETS_DIRNAME, copy_assets, has_tokenizer
from megatron_bridge.bridge.checkpoints import (
    CheckpointTensors,
    CheckpointWeights,
    save_model_checkpoint,
    write_streaming_checkpoint,
)
from megatron_bridge.bridge.exporting import (
    DTYPES,
    asset_sources_of_run,
    token_ids_of_run,
    write_hf_pretrained,
)
from megatron_bridge.bridge.families import (
    ModelFamily,
    family_by_name,
    family_for_hf_config,
    family_for_model_config,
    supported_architectures,
)
from megatron_bridge.bridge.hf_pretrained import PreTrainedCausalLM
from megatron_bridge.bridge.hf_reader import CONFIG_FILENAME, HFWeightsReader, is_hf_folder, read_json
from megatron_bridge.bridge.hf_writer import DEFAULT_MAX_SHARD_SIZE
from megatron_bridge.bridge.model_files import (
    WeightConversionTask,
    apply_mp_overrides,
    conversion_tasks,
    save_hf_safetensors,
)
from megatron_bridge.bridge.model_io import iter_model_weights, load_weights_into, unwrap
from megatron_bridge.bridge.output import staged_output_dir
from megatron_bridge.bridge.provider import GPTModelProvider, provider_from
from megatron_bridge.bridge.rope import RopeFormat, rope_format_of
from megatron_bridge.bridge.weights import HFModelWeights
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)


class _ClassOrInstanceMethod:
    """Descriptor: the method receives the instance when called on one, else the class."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.__doc__ = func.__doc__

    def __get__(self, obj: Any, cls: type) -> Callable[..., Any]:
        target = obj if obj is not None else cls
        return lambda *args, **kwargs: self.func(target, *args, **kwargs)


def _dtype(value: torch.dtype | str | None) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    if value in DTYPES:
        return DTYPES[value]
    raise BridgeError(f"dtype {value!r} is not supported; use one of {sorted(DTYPES)}")


class AutoBridge:
    """A HF model family bound to one config (see the module docstring)."""

    def __init__(self, family: ModelFamily, hf_config: dict[str, Any], hf_path: str | Path | None = None,
                 dtype: torch.dtype | None = None) -> None:
        self.family = family
        self.hf_config = dict(hf_config)
        self.hf_path = Path(hf_path) if hf_path is not None else None
        self.dtype = dtype
        self._model_config = family.config_from_hf(self.hf_config)
        if self.hf_path is not None and is_hf_folder(self.hf_path):
            family.config_for_folder(self._model_config, self.hf_config, HFWeightsReader(self.hf_path).names())
        if dtype is not None:
            self._model_config.params_dtype = {v: k for k, v in DTYPES.items()}[dtype]  # type: ignore[assignment]

    # ------------------------------------------------------------------------------------------ construction
    @classmethod
    def from_hf_pretrained(cls, path: str | Path, **kwargs: Any) -> "AutoBridge":
        """A bridge for a local HF folder (single or sharded safetensors, or ``pytorch_model.bin``).

        Keyword arguments: ``torch_dtype``/``dtype`` (the dtype weights are loaded in and the model's
        ``params_dtype``; ``"auto"``: the folder's; default float32 master weights); ``trust_remote_code`` is a
        permission and is accepted either way — nothing in a folder is ever executed (an architecture without a
        registered family is refused by name);
        ``device_map``, ``attn_implementation`` and ``revision`` are accepted and ignored.
        """
        path = Path(path)
        unknown = set(kwargs) - {"torch_dtype", "dtype", "trust_remote_code", "device_map", "attn_implementation",
                                 "revision"}
        if unknown:
            raise BridgeError(f"from_hf_pretrained got unknown keyword(s) {sorted(unknown)}")
        if not path.is_dir():
            raise BridgeError(f"{str(path)!r} is not a folder; the Bridge reads local Hugging Face folders only "
                              "(download the model first, e.g. with `hf download`)")
        if not is_hf_folder(path):
            raise BridgeError(f"{str(path)!r} is not a Hugging Face model folder (config.json plus "
                              "model.safetensors[.index.json] or pytorch_model.bin[.index.json])")
        hf = read_json(path / CONFIG_FILENAME, "config")
        dtype = kwargs.get("torch_dtype") or kwargs.get("dtype")
        if dtype == "auto":  # as transformers: the dtype the folder's config states
            dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
        return cls(family_for_hf_config(hf), hf, path, _dtype(dtype))

    @classmethod
    def from_hf_config(cls, config: Any) -> "AutoBridge":
        """A config-only bridge from a config dict or a ``transformers`` config object."""
        hf = _config_dict(config)
        return cls(family_for_hf_config(hf), hf)

    @classmethod
    def list_supported_models(cls) -> list[str]:
        """HF architectures the registered families convert."""
        return supported_architectures()

    @classmethod
    def supports(cls, config: Any) -> bool:
        """Whether a config (dict or ``transformers`` config) names a supported architecture."""
        hf = _config_dict(config)
        return any(arch in supported_architectures() for arch in hf.get("architectures") or [])

    @classmethod
    def can_handle(cls, path: str | Path, trust_remote_code: bool = False) -> bool:
        """Whether ``path`` is a HF folder of a supported architecture."""
        return is_hf_folder(path) and cls.supports(read_json(Path(path) / CONFIG_FILENAME, "config"))

    # ---------------------------------------------------------------------------------------------- import
    def get_model_config(self) -> ModelConfig:
        """The HF model's architecture as a fresh :class:`ModelConfig` (config conversion only: no weights, no
        checks, nothing built), as Megatron-Bridge's ``get_model_config``."""
        return dataclasses.replace(self._model_config)

    def to_megatron_provider(self, load_weights: bool = True, hf_path: str | Path | None = None) -> GPTModelProvider:
        """A :class:`GPTModelProvider` of the HF model (a :class:`ModelConfig`: set parallel sizes, ``seq_length``
        etc., then ``finalize()`` and ``provide_distributed_model()``). With ``load_weights`` it carries a pre-wrap
        hook that copies the weights of ``hf_path`` (default: this bridge's folder) into the built chunks.

        Raises:
            BridgeError: ``load_weights`` on a config-only bridge (``from_hf_config``) without ``hf_path``.
        """
        provider = provider_from(self._model_config)
        if load_weights:
            folder = self._folder(hf_path, "to_megatron_provider(load_weights=False)")
            provider.register_pre_wrap_hook(lambda chunks: self._loaded(chunks, folder, ()))
        return provider

    def to_megatron_model(self, load_weights: bool = True, hf_path: str | Path | None = None, *,
                          provider: ModelConfig | None = None, **kwargs: Any) -> list[nn.Module]:
        """Model chunks holding the HF weights: :meth:`to_megatron_provider`, ``finalize()``, then
        ``provide_distributed_model(**kwargs)`` with Megatron-Bridge's keywords and defaults — wrapped in DDP unless
        ``wrap_with_ddp=False``. ``provider`` (this library's addition) builds another config of the same family
        (e.g. other parallel sizes) instead."""
        built = self.to_megatron_provider(load_weights=False) if provider is None else provider_from(provider)
        if load_weights:
            folder = self._folder(hf_path, "to_megatron_model(load_weights=False)")
            built.register_pre_wrap_hook(lambda chunks: self._loaded(chunks, folder, ()))
        built.finalize()
        return built.provide_distributed_model(**kwargs)

    def get_model(self, model_config: ModelConfig | None = None, *, load_weights: bool = True,
                  hf_path: str | Path | None = None, pg_collection: Any = None, **kwargs: Any) -> list[nn.Module]:
        """Megatron-Bridge's ``get_model``: the model of ``model_config`` (default :meth:`get_model_config`) with the
        HF weights (``load_weights``), through ``provide_distributed_model(**kwargs)``."""
        if hf_path is not None and not load_weights:
            raise BridgeError("get_model(hf_path=...) needs load_weights=True")
        kwargs.setdefault("data_parallel_random_init", False)
        return self.to_megatron_model(load_weights, hf_path, provider=model_config or self._model_config,
                                      pg_collection=pg_collection, **kwargs)

    def load_hf_weights(self, model: list[nn.Module] | nn.Module, hf_path: str | Path | None = None,
                        allowed_mismatched_params: list[str] | None = None) -> list[nn.Module] | nn.Module:
        """Copy a HF folder's weights (default: this bridge's folder) into ``model``, one tensor at a time; returns
        ``model``. ``allowed_mismatched_params``: our or HF parameter names (or ``fnmatch`` globs, e.g.
        ``"*.bias"``) that may be missing from the folder or differ in shape — those parameters keep their values
        (logged) instead of being refused."""
        return self._loaded(model, self._folder(hf_path, "hf_path"), tuple(allowed_mismatched_params or ()))

    def _folder(self, hf_path: str | Path | None, instead: str) -> Path:
        folder = Path(hf_path) if hf_path is not None else self.hf_path
        if folder is None:
            raise BridgeError(f"this bridge has no weights (from_hf_config): pass hf_path, or use {instead}")
        return folder

    def _loaded(self, model: Any, folder: Path, allowed: tuple[str, ...]) -> Any:
        """``model`` with the weights of ``folder`` copied in (the provider's pre-wrap hook)."""
        chunks = model if isinstance(model, (list, tuple)) else [model]
        config = _config_of(chunks)
        if config is None:
            raise BridgeError("HF weights load into this library's native model chunks only; for "
                              "model.engine='megatron_core' convert with AutoBridge.import_ckpt and start from "
                              "checkpoint.pretrained_checkpoint")
        weights = HFModelWeights(HFWeightsReader(folder), self.family, config, self.dtype,
                                 allowed_mismatched_params=allowed)
        load_weights_into(chunks, weights, kept=weights.left_out)
        return model

    @cached_property
    def hf_pretrained(self) -> PreTrainedCausalLM:
        """Megatron-Bridge's ``bridge.hf_pretrained``: the folder's ``state`` (weights by HF name), ``config``,
        ``tokenizer`` and ``model``, read lazily (``src/megatron_bridge/bridge/hf_pretrained.py``)."""
        if self.hf_path is None:
            raise BridgeError("bridge.hf_pretrained needs a folder; this bridge was made from a config alone: use "
                              "AutoBridge.from_hf_pretrained(<local folder>)")
        return PreTrainedCausalLM(self.hf_path)

    @property
    def transformer_config(self) -> Any:
        """megatron-core's ``TransformerConfig`` of this model (the megatron-core engine's mapping,
        ``engines/megatron_core/provider.py``; weights initialised on the CPU)."""
        from megatron_bridge.engines.megatron_core.provider import transformer_config

        provider = self.to_megatron_provider(load_weights=False)
        provider.finalize()
        return transformer_config(provider, torch.device("cpu"))

    def get_conversion_tasks(self, megatron_model: list[nn.Module] | nn.Module,
                             hf_path: str | Path | None = None) -> list[WeightConversionTask]:
        """One :class:`~megatron_bridge.bridge.model_files.WeightConversionTask` per parameter of
        ``megatron_model``: our name, ``task.mapping.hf_param`` (the HF name, or the stacked names), the chunk,
        the parameter, its pipeline rank and virtual stage. ``hf_path`` is checked to be a folder of this family."""
        if hf_path is not None and not self.can_handle(hf_path):
            raise BridgeError(f"{str(hf_path)!r} is not a Hugging Face folder of a supported architecture")
        chunks = list(megatron_model) if isinstance(megatron_model, (list, tuple)) else [megatron_model]
        config = _config_of(chunks) or self._model_config
        return conversion_tasks(self.family, config, [unwrap(c) for c in chunks], _pipeline_rank(config))

    # ---------------------------------------------------------------------------------------------- export
    def export_hf_weights(self, model: list[nn.Module] | nn.Module, cpu: bool = False, show_progress: bool = True,
                          conversion_tasks: list[WeightConversionTask] | None = None,
                          merge_adapter_weights: bool = True,
                          weight_dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """``(HF name, tensor)`` pairs of ``model``, one full tensor at a time (DTensors are gathered: call on
        every rank). ``conversion_tasks`` (:meth:`get_conversion_tasks`) limits the export to those parameters.
        ``show_progress`` is accepted (no progress bar here)."""
        from megatron_bridge.bridge.weights import to_hf_tensors

        config = _config_of(model) or self._model_config
        pairs = iter_model_weights(model)
        if conversion_tasks is not None:
            wanted = {task.param_name for task in conversion_tasks}
            pairs = ((name, tensor) for name, tensor in pairs if name in wanted)
        for name, tensor in to_hf_tensors(pairs, self.family, config, partial=conversion_tasks is not None):
            tensor = tensor.to("cpu") if cpu else tensor
            yield name, tensor.to(weight_dtype) if weight_dtype is not None and tensor.is_floating_point() else tensor

    def save_hf_pretrained(self, model: list[nn.Module] | nn.Module, path: str | Path, show_progress: bool = False,
                           source_path: str | Path | None = None, strict: bool = True,
                           merge_adapter_weights: bool = True, distributed_save: bool = False,
                           save_every_n_ranks: int = 1, weight_dtype: torch.dtype | str | None = None, *,
                           max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE, overwrite: bool = False,
                           rope_format: RopeFormat | None = None) -> Path:
        """Write ``model`` as a HF folder: config, generation config, sharded safetensors, tokenizer files (from
        ``source_path``, else this bridge's folder). Collective for DTensor models; rank 0 writes
        (``distributed_save`` is not supported)."""
        if distributed_save:
            raise BridgeError("save_hf_pretrained(distributed_save=True) is not supported: rank 0 writes")
        import torch.distributed as dist

        config = _config_of(model) or self._model_config
        sources = [Path(p) for p in (source_path, self.hf_path) if p is not None]
        pairs = iter_model_weights(model)
        if dist.is_initialized() and dist.get_rank() != 0:
            for _pair in pairs:  # take part in the gathers
                pass
            return Path(path)
        return write_hf_pretrained(path, self.family, config, pairs, weight_dtype=_dtype(weight_dtype),
                                   max_shard_size=max_shard_size, overwrite=overwrite,
                                   rope_format=rope_format or rope_format_of(self.hf_config),
                                   asset_sources=sources)

    def save_hf_weights(self, model: list[nn.Module] | nn.Module, path: str | Path, show_progress: bool = True,
                        strict: bool = True, merge_adapter_weights: bool = True, distributed_save: bool = False,
                        save_every_n_ranks: int = 1, weight_dtype: torch.dtype | str | None = None, *,
                        max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE, overwrite: bool = False) -> None:
        """Write only the HF safetensors weights of ``model`` (sharded with an index when large) into ``path``; no
        config or tokenizer (the folder's other files stay). Weights already in ``path`` are refused (BridgeError)
        unless ``overwrite=True``. Collective for DTensor models; rank 0 writes (``distributed_save`` is refused)."""
        import torch.distributed as dist

        from megatron_bridge.models.llama import params_dtype_of

        if distributed_save:
            raise BridgeError("save_hf_weights(distributed_save=True) is not supported: rank 0 writes")
        config = _config_of(model) or self._model_config
        pairs = iter_model_weights(model)
        if dist.is_initialized() and dist.get_rank() != 0:
            for _pair in pairs:  # take part in the gathers
                pass
            return
        save_hf_safetensors(Path(path), self.family, config, pairs, _dtype(weight_dtype) or params_dtype_of(config),
                            max_shard_size, overwrite)

    def save_megatron_model(self, model: list[nn.Module] | nn.Module, path: str | Path,
                            hf_tokenizer_path: str | Path | None = None, low_memory_save: bool = False,
                            hf_tokenizer_kwargs: dict[str, Any] | None = None, *, overwrite: bool = False) -> None:
        """Save ``model``'s weights (no optimizer state) as a model-only checkpoint at ``path``, the layout
        :meth:`import_ckpt` writes (``pretrain()`` resumes it or starts from it), with the tokenizer files of
        ``hf_tokenizer_path`` (default: this bridge's folder). Collective for DTensor models; rank 0 writes.
        A ``path`` that holds a training run or other files is refused (CheckpointOverwriteError / BridgeError)
        unless ``overwrite=True``, which replaces the folder whole.
        ``low_memory_save`` is accepted (the model is kept either way); ``hf_tokenizer_kwargs`` is refused (the
        tokenizer files are copied as they are)."""
        import torch.distributed as dist

        if hf_tokenizer_kwargs:
            raise BridgeError(f"save_megatron_model(hf_tokenizer_kwargs={hf_tokenizer_kwargs!r}) is not supported: "
                              "the tokenizer files are copied as they are")
        weights = dict(iter_model_weights(model))
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        tokenizer = Path(hf_tokenizer_path) if hf_tokenizer_path is not None else self.hf_path
        save_model_checkpoint(weights, _config_of(model) or self._model_config, Path(path), tokenizer, overwrite)

    def load_megatron_model(self, path: str | Path, *, mp_overrides: dict[str, Any] | None = None,
                            **kwargs: Any) -> list[nn.Module]:
        """The model of one of our checkpoints (its latest step; any format this library writes, either engine's)
        with its weights: built from its ``run_config.yaml`` with ``mp_overrides`` (model-parallel sizes) applied,
        through ``provide_distributed_model(**kwargs)`` — unwrapped unless ``wrap_with_ddp=True``, as
        Megatron-Bridge's loader."""
        ckpt = CheckpointTensors(path)
        run = ckpt.run_config()
        if run is None:
            raise BridgeError(f"{str(path)!r} is a weights file, not a checkpoint folder with run_config.yaml")
        provider = provider_from(run.model)
        apply_mp_overrides(provider, mp_overrides)
        weights = CheckpointWeights(ckpt)

        def load(chunks: list[nn.Module]) -> list[nn.Module]:
            load_weights_into(chunks, weights)
            return chunks

        provider.register_pre_wrap_hook(load)
        provider.finalize()
        kwargs.setdefault("wrap_with_ddp", False)
        return provider.provide_distributed_model(**kwargs)

    # ------------------------------------------------------------------------------------- one-call flows
    @classmethod
    def import_ckpt(cls, hf_model_id: str | Path, megatron_path: str | Path, *, low_memory_save: bool = False,
                    overwrite: bool = False, engine: str = "native", **kwargs: Any) -> Path:
        """Convert a HF folder into one of our checkpoints (step 0, model only) that ``pretrain()`` on either engine
        resumes (``checkpoint.load``) or starts from (``checkpoint.pretrained_checkpoint``); the other engine
        converts it on the fly, exactly.

        ``engine`` picks the format: ``"native"`` (default; the native engine's DCP ``torch_dist``, streamed) or
        ``"megatron_core"`` (megatron-core ``dist_checkpointing`` ``torch_dist``, what Megatron-Bridge's
        ``import_ckpt`` writes and megatron-core's own ``dist_checkpointing.load`` reads; the model is held whole
        while it is written, in one process). The folder's ``config.json``, ``generation_config.json`` and tokenizer
        files are kept in ``iter_0000000/hf_assets/``; its ``run_config.yaml`` names that tokenizer. Returns the
        checkpoint root. (``low_memory_save`` is accepted for Megatron-Bridge scripts: the native import always
        streams.)
        """
        if engine not in ("native", "megatron_core"):
            raise BridgeError(f"import_ckpt(engine={engine!r}): use 'native' (the native engine's checkpoint) or "
                              "'megatron_core' (megatron-core dist_checkpointing, as Megatron-Bridge writes)")
        from megatron_bridge.config.container import ConfigContainer
        from megatron_bridge.config.data import TokenizerConfig

        bridge = cls.from_hf_pretrained(hf_model_id, **kwargs)
        config = bridge.to_megatron_provider()
        weights = HFModelWeights(HFWeightsReader(bridge.hf_path), bridge.family, config, DTYPES[config.params_dtype])
        root = Path(megatron_path)
        assets = root.resolve() / "iter_0000000" / HF_ASSETS_DIRNAME
        cfg = ConfigContainer(model=config)
        cfg.dataset.seq_length = config.seq_length
        cfg.tokenizer = (TokenizerConfig(tokenizer_type="huggingface", tokenizer_file=str(assets / "tokenizer.json"))
                         if (bridge.hf_path / "tokenizer.json").is_file()
                         else TokenizerConfig(tokenizer_type="null", vocab_size=config.vocab_size))
        def assets_into(folder: Path) -> None:
            copy_assets(bridge.hf_path, folder / HF_ASSETS_DIRNAME, with_config=True)

        if engine == "megatron_core":
            from megatron_bridge.bridge.engine_checkpoints import (
                megatron_core_checkpoint_config,
                write_mcore_checkpoint,
            )

            # refuses what that engine cannot build (MoE, ...) before any weight is read
            megatron_core_checkpoint_config(cfg, f"import_ckpt({str(hf_model_id)!r}, engine='megatron_core')")
            write_mcore_checkpoint(dict(weights), cfg, root, overwrite, extra=assets_into)
            logger.info("imported %s (%s) into %s (megatron-core)", hf_model_id, bridge.family.name, root)
            return root
        shapes = {name: (shape, DTYPES[config.params_dtype]) for name, shape in weights.tensor_shapes().items()}
        with staged_output_dir(root, overwrite=overwrite) as tmp:
            write_streaming_checkpoint(tmp, cfg, shapes, weights.__getitem__, extra=assets_into)
        logger.info("imported %s (%s) into %s", hf_model_id, bridge.family.name, root)
        return root

    @_ClassOrInstanceMethod
    def export_ckpt(self_or_cls: Any, megatron_path: str | Path, hf_path: str | Path, show_progress: bool = False,
                    strict: bool = True, source_path: str | Path | None = None, *, step: int | None = None,
                    weight_dtype: torch.dtype | str | None = None, max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
                    overwrite: bool = False, rope_format: RopeFormat | None = None, family: str | None = None,
                    model_config: ModelConfig | None = None) -> Path:
        """Convert one of our checkpoints (any format, backend, world size; or a weights file with
        ``model_config``) into a HF folder, one tensor at a time. Works on the class (model config from the
        checkpoint's ``run_config.yaml``) or on a bridge (its family and source folder are used).

        HF files are carried over from ``source_path``, the checkpoint's ``hf_assets/``, the run's
        ``pretrained_checkpoint`` and its tokenizer, in that order.
        """
        bridge = self_or_cls if isinstance(self_or_cls, AutoBridge) else None
        ckpt = CheckpointTensors(megatron_path, step)
        run = ckpt.run_config()
        config = model_config or (run.model if run is not None else None)
        if config is None:
            raise BridgeError(f"{str(megatron_path)!r} is a weights file: pass model_config (--config run_config.yaml)")
        fam = family_by_name(family) if family else (bridge.family if bridge else family_for_model_config(config))
        sources = [Path(p) for p in (source_path, bridge.hf_path if bridge else None) if p is not None]
        sources += asset_sources_of_run(ckpt.folder, run)
        if not any(has_tokenizer(s) for s in sources):
            logger.warning("no tokenizer files found for %s: the HF folder will have none", megatron_path)
        return write_hf_pretrained(hf_path, fam, config, ckpt.items(), weight_dtype=_dtype(weight_dtype),
                                   max_shard_size=max_shard_size, overwrite=overwrite, rope_format=rope_format,
                                   asset_sources=sources, token_ids=token_ids_of_run(run, config.vocab_size))

    def __repr__(self) -> str:
        return f"AutoBridge(family={self.family.name!r}, path={str(self.hf_path) if self.hf_path else None!r})"


def _config_dict(config: Any) -> dict[str, Any]:
    """A config dict from a dict or a ``transformers`` config object (its ``to_dict()``)."""
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _pipeline_rank(config: ModelConfig) -> int:
    """This process's pipeline rank for ``config`` (0 without a process group)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return 0
    from megatron_bridge.config.container import ConfigContainer
    from megatron_bridge.distributed.init import pipeline_parallel_rank

    return pipeline_parallel_rank(ConfigContainer(model=config), dist.get_rank(), dist.get_world_size())


def _config_of(model: list[nn.Module] | nn.Module) -> ModelConfig | None:
    from megatron_bridge.bridge.model_io import unwrap

    chunks = model if isinstance(model, (list, tuple)) else [model]
    config = getattr(unwrap(chunks[0]), "config", None)
    return config if isinstance(config, ModelConfig) else None
