"""Our side of a conversion: reading one tensor at a time from any of our checkpoints, and writing an imported
model as a step-0 ``torch_dist`` checkpoint without holding it whole.

Reading: a DCP folder (``torch_dist``/``fsdp_dtensor``, any backend, world size and TP/FSDP sharding — DCP stores
global tensors by name) is read tensor by tensor with ``dcp.load`` of a one-entry state dict; a ``torch`` folder or
a weights file is opened with ``torch.load(mmap=True, weights_only=True)``.

Writing: DCP's save planner is handed meta tensors (shapes only) and fetches each tensor from the HF folder when
the writer asks for it (:class:`StreamingSavePlanner`); one file per tensor, so a written tensor is freed at once.
"""

import copy
import io
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.planner import WriteItem

from megatron_bridge.bridge.assets import HF_ASSETS_DIRNAME, copy_assets
from megatron_bridge.bridge.memory import track
from megatron_bridge.bridge.model_files import checkpoint_run_config
from megatron_bridge.bridge.output import staged_output_dir
from megatron_bridge.checkpoint import files
from megatron_bridge.checkpoint.load import resolve_checkpoint_folder
from megatron_bridge.checkpoint.mcore_reader import is_mcore_checkpoint
from megatron_bridge.checkpoint.reader import (
    DCP_ERRORS,
    SafeFileSystemReader,
    SafeLoadPlanner,
    check_dcp_storage,
    dcp_error_message,
    load_torch_file,
    read_dcp_metadata,
)
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError, CheckpointError, CheckpointOverwriteError


class CheckpointTensors:
    """Names, shapes and tensors (full, our names) of one of our checkpoints or weights files."""

    def __init__(self, path: str | Path, step: int | None = None) -> None:
        path = Path(path)
        self.folder: Path | None = None
        self._dcp_shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        self._dcp_chunk: dict[str, str] = {}
        self._tensors: dict[str, torch.Tensor] = {}
        if path.is_file():
            self._tensors = _weights_of(load_torch_mmap(path), path)
            return
        self.folder = resolve_checkpoint_folder(path, step)
        if is_mcore_checkpoint(self.folder):  # the megatron-core engine's: read through a TP=1 GPTModel
            from megatron_bridge.bridge.engine_checkpoints import model_config_of, read_mcore_weights

            self._tensors = read_mcore_weights(self.folder, model_config_of(self.folder, None))
            return
        manifest = files.verify_manifest(self.folder)
        if manifest.get("format") == "torch" or (self.folder / files.TORCH_FILENAME).is_file():
            self._tensors = _weights_of(load_torch_mmap(self.folder / files.TORCH_FILENAME), self.folder)
            return
        metadata = read_dcp_metadata(self.folder)
        check_dcp_storage(self.folder, metadata)
        for key, item in metadata.state_dict_metadata.items():
            if key.startswith("model") and isinstance(item, TensorStorageMetadata):
                chunk, _, name = key.partition(".")
                if name in self._dcp_chunk:
                    raise CheckpointError(f"{str(self.folder)!r}: {name!r} is stored by two model chunks")
                self._dcp_shapes[name] = (tuple(item.size), item.properties.dtype)
                self._dcp_chunk[name] = chunk
        if not self._dcp_shapes:
            raise CheckpointError(f"DCP checkpoint {str(self.folder)!r} holds no model tensors")

    def names(self) -> list[str]:
        """Parameter names, in checkpoint order."""
        return list(self._dcp_shapes or self._tensors)

    def get(self, name: str) -> torch.Tensor:
        """One full tensor."""
        if self._tensors:
            return track(self._tensors[name])
        shape, dtype = self._dcp_shapes[name]
        chunk = self._dcp_chunk[name]
        target = {chunk: {name: track(torch.empty(shape, dtype=dtype))}}
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load(target, storage_reader=SafeFileSystemReader(self.folder), planner=SafeLoadPlanner(),
                         no_dist=True)
        except CheckpointError:
            raise
        except DCP_ERRORS as exc:
            message = dcp_error_message(exc)
            raise CheckpointError(f"reading {name!r} from {str(self.folder)!r} failed: {message}") from exc
        return target[chunk][name]

    def items(self) -> Any:
        """``(name, tensor)`` pairs, one tensor read at a time."""
        for name in self.names():
            yield name, self.get(name)

    def run_config(self) -> ConfigContainer | None:
        """The checkpoint's ``run_config.yaml`` (None for a weights file)."""
        if self.folder is None:
            return None
        path = self.folder / files.RUN_CONFIG_FILENAME
        if not path.is_file():
            raise CheckpointError(f"{str(path)!r} does not exist: the checkpoint does not say its model config")
        try:
            return ConfigContainer.from_yaml(path)
        except ValueError as exc:
            raise CheckpointError(f"{str(path)!r} is not a valid run config: {exc}") from exc


def load_torch_mmap(path: Path) -> Any:
    """``torch.load(path, weights_only=True, mmap=True)`` with a named error."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return load_torch_file(path, "weights")  # not a zip file (old format): read normally, or name the error


def _weights_of(content: Any, where: Path) -> dict[str, torch.Tensor]:
    weights = content.get("model", content) if isinstance(content, dict) else None
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise CheckpointError(f"{str(where)!r} holds no {{name: tensor}} model weights")
    return weights


# ------------------------------------------------------------------------------------------------ writing
class StreamingSavePlanner(DefaultSavePlanner):
    """DCP save planner whose state dict holds meta tensors; each tensor is fetched when DCP writes it."""

    def __init__(self, fetch: Callable[[str], torch.Tensor], prefix: str = "model") -> None:
        super().__init__()
        self.fetch = fetch
        self.prefix = prefix + "."

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        """The real tensor of ``write_item`` (read now from the source)."""
        fqn = write_item.index.fqn
        if fqn.startswith(self.prefix):
            return self.fetch(fqn[len(self.prefix):])
        return super().resolve_data(write_item)


def write_streaming_checkpoint(root: Path, cfg: ConfigContainer, shapes: dict[str, tuple[tuple[int, ...],
                               torch.dtype]], fetch: Callable[[str], torch.Tensor],
                               extra: Callable[[Path], None] | None = None) -> Path:
    """Write ``root/iter_0000000`` (``torch_dist``, model only, step 0) plus trackers; ``extra(folder)`` may add
    files before the commit. Returns the committed folder."""
    from megatron_bridge.checkpoint.save import serialize
    from megatron_bridge.checkpoint.train_state import TrainState

    root.mkdir(parents=True, exist_ok=True)
    tmp = files.temporary_dir(root, 0, files.new_save_id())
    tmp.mkdir()
    state = {"model": {name: torch.empty(shape, dtype=dtype, device="meta") for name, (shape, dtype) in shapes.items()}}
    writer = FileSystemWriter(tmp, single_file_per_rank=False, sync_files=True, overwrite=False)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(state, storage_writer=writer, planner=StreamingSavePlanner(fetch), no_dist=True)
    except DCP_ERRORS as exc:
        if isinstance(exc, BridgeError):
            raise
        cause = exc.failures.get(0, (None,))[0] if hasattr(exc, "failures") else None
        if isinstance(cause, BridgeError):
            raise cause from exc
        raise CheckpointError(f"writing {str(tmp)!r} failed: {dcp_error_message(exc)}") from exc
    train_state = serialize(TrainState().state_dict())
    (tmp / files.TRAIN_STATE_FILENAME).write_bytes(train_state)
    (tmp / files.RUN_CONFIG_FILENAME).write_text(cfg.to_yaml())
    if extra is not None:
        extra(tmp)
    final = files.iteration_dir(root, 0)
    files.commit(tmp, final, {"step": 0, "format": "torch_dist", "backend": "bridge_import", "world_size": 1,
                               "has_optimizer": False, "has_rng": False})
    files.write_trackers(root, 0, train_state)
    return final


def write_native_checkpoint(weights: dict[str, torch.Tensor], cfg: "ConfigContainer", root: str | Path,
                            overwrite: bool = False) -> Path:
    """Write native-named ``weights`` as the native engine's checkpoint (``torch_dist`` DCP, step 0, model only;
    the Bridge's writer), its run config with ``model.engine='native'``. Returns ``root``."""
    out_cfg = copy.deepcopy(cfg)
    out_cfg.model.engine = "native"
    shapes = {name: (tuple(t.shape), t.dtype) for name, t in weights.items()}
    with staged_output_dir(root, overwrite=overwrite) as tmp:
        write_streaming_checkpoint(tmp, out_cfg, shapes, weights.__getitem__)
    return Path(root)


def save_model_checkpoint(weights: Mapping[str, torch.Tensor], config: ModelConfig, root: Path,
                          tokenizer_folder: Path | None, overwrite: bool = False) -> Path:
    """Write ``weights`` (full tensors, our names) as a model-only checkpoint at ``root`` (``iter_0000000``, the
    layout ``import_ckpt`` writes: ``pretrain()`` resumes it or starts from it), the tokenizer files of
    ``tokenizer_folder`` in ``hf_assets/``. The folder appears whole or not at all; a ``root`` that holds anything
    (a training run above all: its trackers would be rewound to step 0 and its newer checkpoints deleted by the
    next resume) is refused unless ``overwrite``, which replaces it whole. Returns the committed folder."""
    refuse_run_folder(root, overwrite, "save_megatron_model")
    assets = root.resolve() / "iter_0000000" / HF_ASSETS_DIRNAME
    cfg = checkpoint_run_config(config, tokenizer_folder, assets)
    shapes = {name: (tuple(t.shape), t.dtype) for name, t in weights.items()}

    def extra(folder: Path) -> None:
        if tokenizer_folder is not None:
            copy_assets(tokenizer_folder, folder / HF_ASSETS_DIRNAME, with_config=True)

    with staged_output_dir(root, overwrite=overwrite) as tmp:
        write_streaming_checkpoint(tmp, cfg, shapes, weights.__getitem__, extra=extra)
    return files.iteration_dir(root, 0)


def refuse_run_folder(root: Path, overwrite: bool, call: str) -> None:
    """CheckpointOverwriteError when ``root`` holds a training run (a tracker or committed steps) and not
    ``overwrite``: writing a step-0 checkpoint there would rewind the run. Other non-empty folders are refused by
    :func:`staged_output_dir`."""
    if overwrite or not root.is_dir():
        return
    steps = files.list_checkpoints(root)
    tracker = root / files.TRACKER_FILENAME
    if not steps and not tracker.exists():
        return
    latest = tracker.read_bytes()[:20].decode("utf-8", "replace").strip() if tracker.is_file() else "none"
    raise CheckpointOverwriteError(
        f"{call}: {str(root)!r} holds a training run (latest step {latest}, committed steps {steps[-5:]}); writing "
        "a step-0 checkpoint there would rewind its trackers and the next resume would delete its newer "
        "checkpoints. Fix: choose a new path, or pass overwrite=True to replace the whole folder")


class CheckpointWeights(Mapping[str, torch.Tensor]):
    """A checkpoint's tensors as a mapping, one tensor read per lookup (for ``load_weights_into``)."""

    def __init__(self, ckpt: CheckpointTensors) -> None:
        self.ckpt = ckpt
        self._names = ckpt.names()

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._names:
            raise KeyError(name)
        return self.ckpt.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
