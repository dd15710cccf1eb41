"""Loading checkpoint weights into a plain (not yet wrapped) model: the weights a quantized run calibrates on, the
modelopt state it resumes from, and a distillation teacher. Reuses the checkpoint package's resolution, verification
(manifest, shapes) and readers; every rank reads the folder itself (as checkpoint loading does)."""

from pathlib import Path
from typing import Any

from torch import nn

from megatron_bridge.bridge.converter import PretrainedConverter
from megatron_bridge.checkpoint import comm
from megatron_bridge.checkpoint import load as loading
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.errors import CheckpointError
from megatron_bridge.optimization.state import is_quantizer_key, read_modelopt_state, without_quantizer_keys
from megatron_bridge.utils.logging import get_logger, log_rank_0


logger = get_logger(__name__)


def resolve_start_source(cfg: ConfigContainer) -> loading.LoadSource | None:
    """What ``cfg.checkpoint`` will load at set-up (rank 0 decides, every rank gets the answer); None: fresh start."""
    c = cfg.checkpoint
    if not (c.load or c.pretrained_checkpoint):
        return None
    with comm.checkpoint_group() as group:
        return comm.run_on_rank0(lambda: loading.resolve_source(c, PretrainedConverter()), group)


def modelopt_state_to_resume(cfg: ConfigContainer) -> tuple[str, dict[str, Any]] | None:
    """(folder, content) of the modelopt state of the checkpoint the run starts from; None when it has none."""
    source = resolve_start_source(cfg)
    if source is None or source.kind not in ("dcp", "torch"):
        return None
    content = read_modelopt_state(source.path)
    return (source.path, content) if content is not None else None


def load_weights_into(module: nn.Module, source: loading.LoadSource) -> None:
    """Fill the plain ``module``'s weights from ``source`` (collective for DCP folders: call on every rank).

    Quantizer buffers, if any, are left as they are; a megatron-core checkpoint is read through an exact native copy
    (the Bridge's on-the-fly conversion). Raises CheckpointError when keys or shapes differ.
    """
    if source.kind in loading.MCORE_KINDS:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="megatron_bridge_converted-") as tmp:
            config = getattr(module, "config")  # noqa: B009 (the model's ModelConfig)
            path, kind = PretrainedConverter().convert_for_engine(source.path, source.kind, config, "native", Path(tmp))
            load_weights_into(module, loading.LoadSource(path, kind, 0, True))
        return
    state = {"model": without_quantizer_keys(module.state_dict())}
    if source.kind == "dcp":
        with comm.checkpoint_group() as group:
            loading.load_dcp(source, state, group)
    else:
        config = getattr(module, "config", None)
        loading.load_full(source, state, getattr(config, "padded_vocab_size", None), converter=PretrainedConverter())
    result = module.load_state_dict(state["model"], strict=False)
    missing = [k for k in result.missing_keys if not is_quantizer_key(k)]
    if missing or result.unexpected_keys:
        raise CheckpointError(
            f"loading {source.path!r}: missing {missing[:8]}, unexpected {result.unexpected_keys[:8]}"
        )


def load_start_weights(cfg: ConfigContainer, module: nn.Module) -> None:
    """Load the weights the run starts from (resume folder or ``pretrained_checkpoint``) into the plain module."""
    source = resolve_start_source(cfg)
    if source is None:
        return
    load_weights_into(module, source)
    log_rank_0(logger, "loaded the starting weights of %s before quantizing", source.path)


def resolve_checkpoint_folder(path: str, what: str) -> loading.LoadSource:
    """A committed, verified checkpoint folder (a root's latest ``iter_*`` or the folder itself), as weights only."""

    def resolve() -> loading.LoadSource:
        folder = loading.resolve_folder(Path(path), None) if Path(path).is_dir() else None
        if folder is None:
            raise CheckpointError(f"{what}={path!r} holds no checkpoint of this library (an iter_* folder or a "
                                  "checkpoint root)")
        return loading.inspect_folder(folder, weights_only=True)

    with comm.checkpoint_group() as group:
        return comm.run_on_rank0(resolve, group)
