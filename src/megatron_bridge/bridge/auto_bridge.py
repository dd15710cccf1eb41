"""``AutoBridge``: Hugging Face folders in and out, with Megatron-Bridge's names.

>>> bridge = AutoBridge.from_hf_pretrained("path/to/hf_folder")      # doctest: +SKIP
>>> model_config = bridge.to_megatron_provider()                      # our ModelConfig; set TP etc. here
>>> chunks = bridge.to_megatron_model(wrap_with_ddp=False)            # model chunks holding the HF weights
>>> bridge.save_hf_pretrained(chunks, "out/hf")                       # and back
>>> AutoBridge.import_ckpt("path/to/hf_folder", "ckpts/imported")     # HF folder -> our checkpoint (step 0)
>>> AutoBridge.export_ckpt("runs/x/checkpoints", "out/hf")            # any of our checkpoints -> HF folder

Differences from Megatron-Bridge (documented in docs/training/hf-conversion.md): ``from_hf_pretrained`` reads a
local folder only (no Hub download, ``trust_remote_code`` is refused); ``to_megatron_provider`` returns our
:class:`ModelConfig` (assign it to ``cfg.model``; weights come with ``to_megatron_model`` or
``checkpoint.pretrained_checkpoint``); ``export_ckpt`` also works on the class, reading the model config from
the checkpoint's ``run_config.yaml``.
"""

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from megatron_bridge.bridge.assets import HF_ASSETS_DIRNAME, copy_assets, has_tokenizer
from megatron_bridge.bridge.checkpoints import CheckpointTensors, write_streaming_checkpoint
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
from megatron_bridge.bridge.hf_reader import CONFIG_FILENAME, HFWeightsReader, is_hf_folder, read_json
from megatron_bridge.bridge.hf_writer import DEFAULT_MAX_SHARD_SIZE
from megatron_bridge.bridge.model_io import build_model, iter_model_weights, load_weights_into
from megatron_bridge.bridge.output import staged_output_dir
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
        if dtype is not None:
            self._model_config.params_dtype = {v: k for k, v in DTYPES.items()}[dtype]  # type: ignore[assignment]

    # ------------------------------------------------------------------------------------------ construction
    @classmethod
    def from_hf_pretrained(cls, path: str | Path, **kwargs: Any) -> "AutoBridge":
        """A bridge for a local HF folder (single or sharded safetensors, or ``pytorch_model.bin``).

        Keyword arguments: ``torch_dtype``/``dtype`` (the dtype weights are loaded in and the model's
        ``params_dtype``; ``"auto"``: the folder's; default float32 master weights); ``trust_remote_code=True``
        is refused (nothing in a folder is executed); ``device_map``, ``attn_implementation`` and ``revision`` are
        accepted and ignored.
        """
        path = Path(path)
        if kwargs.get("trust_remote_code"):
            raise BridgeError("trust_remote_code=True is not supported: the Bridge never runs code from a folder")
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
    def to_megatron_provider(self, load_weights: bool = True, hf_path: str | Path | None = None) -> ModelConfig:
        """A fresh :class:`ModelConfig` of the HF model; set parallel sizes, ``seq_length`` etc. before building.
        (``load_weights``/``hf_path`` are accepted for Megatron-Bridge compatibility: weights are loaded by
        :meth:`to_megatron_model` or by ``checkpoint.pretrained_checkpoint``.)"""
        return dataclasses.replace(self._model_config)

    def to_megatron_model(self, load_weights: bool = True, hf_path: str | Path | None = None, *,
                          wrap_with_ddp: bool = False, provider: ModelConfig | None = None,
                          device: torch.device | str = "cpu", use_cpu_initialization: bool = True) -> list[nn.Module]:
        """Model chunks built from ``provider`` (default: :meth:`to_megatron_provider`) holding the HF weights.

        With ``wrap_with_ddp`` the chunks are wrapped by ``ddp_wrap`` (a one-process group is created when none
        exists) with the default distributed config, and the wrapped chunks are returned. The model is built on
        ``device`` (``use_cpu_initialization`` is accepted for Megatron-Bridge scripts: weights are always read on
        the CPU).
        """
        config = provider if provider is not None else self.to_megatron_provider()
        chunks = [build_model(config, device, init=not load_weights)]
        if load_weights:
            self.load_hf_weights(chunks, hf_path)
        if not wrap_with_ddp:
            return chunks
        from megatron_bridge.config.container import ConfigContainer
        from megatron_bridge.engines.ddp_wrap import ddp_wrap

        return list(ddp_wrap(chunks, ConfigContainer(model=config), torch.device(device)).chunks)

    def load_hf_weights(self, model: list[nn.Module] | nn.Module, hf_path: str | Path | None = None) -> None:
        """Copy a HF folder's weights (default: this bridge's folder) into ``model``, one tensor at a time."""
        folder = Path(hf_path) if hf_path is not None else self.hf_path
        if folder is None:
            raise BridgeError("this bridge has no folder (from_hf_config): pass hf_path")
        config = _config_of(model) or self._model_config
        load_weights_into(model, HFModelWeights(HFWeightsReader(folder), self.family, config, self.dtype))

    # ---------------------------------------------------------------------------------------------- export
    def export_hf_weights(self, model: list[nn.Module] | nn.Module, cpu: bool = True, show_progress: bool = False,
                          conversion_tasks: None = None, merge_adapter_weights: bool = True,
                          weight_dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """``(HF name, tensor)`` pairs of ``model``, one full tensor at a time (DTensors are gathered: call on
        every rank). ``conversion_tasks`` (Megatron-Bridge's precomputed plans) must be None: no adapters here."""
        from megatron_bridge.bridge.weights import to_hf_tensors

        if conversion_tasks is not None:
            raise BridgeError("export_hf_weights(conversion_tasks=...) is not supported: pass the model only")

        config = _config_of(model) or self._model_config
        for name, tensor in to_hf_tensors(iter_model_weights(model), self.family, config):
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

    # ------------------------------------------------------------------------------------- one-call flows
    @classmethod
    def import_ckpt(cls, hf_model_id: str | Path, megatron_path: str | Path, *, low_memory_save: bool = False,
                    overwrite: bool = False, **kwargs: Any) -> Path:
        """Convert a HF folder into one of our checkpoints (``torch_dist``, step 0, model only, streamed) that
        ``pretrain()`` resumes (``checkpoint.load``) or starts from (``checkpoint.pretrained_checkpoint``).

        The folder's ``config.json``, ``generation_config.json`` and tokenizer files are kept in
        ``iter_0000000/hf_assets/``; its ``run_config.yaml`` names that tokenizer. Returns the checkpoint root.
        (``low_memory_save`` is accepted for Megatron-Bridge scripts: the import always streams.)
        """
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
        shapes = {name: (shape, DTYPES[config.params_dtype]) for name, shape in weights.tensor_shapes().items()}
        with staged_output_dir(root, overwrite=overwrite) as tmp:
            write_streaming_checkpoint(tmp, cfg, shapes, weights.__getitem__,
                                       extra=lambda folder: copy_assets(bridge.hf_path, folder / HF_ASSETS_DIRNAME,
                                                                        with_config=True))
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


def _config_of(model: list[nn.Module] | nn.Module) -> ModelConfig | None:
    from megatron_bridge.bridge.model_io import unwrap

    chunks = model if isinstance(model, (list, tuple)) else [model]
    config = getattr(unwrap(chunks[0]), "config", None)
    return config if isinstance(config, ModelConfig) else None
