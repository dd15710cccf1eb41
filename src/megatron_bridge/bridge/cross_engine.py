"""One engine's checkpoint (or a Hugging Face folder) loaded by the other engine: converted on the fly, exactly.

The two engines store different parameter names and shardings (native DCP vs megatron-core ``dist_checkpointing``).
When ``checkpoint.pretrained_checkpoint`` or ``checkpoint.load`` names a source of the other engine's format, the
loader (``checkpoint/converter.py``) asks :func:`convert_for_engine` for a copy in this engine's format and loads
that as usual:

* for the native engine, a megatron-core ``torch_dist`` checkpoint becomes a weights file (``{"model": ...}``,
  native names) through :func:`megatron_bridge.bridge.engine_checkpoints.read_mcore_weights`, and a Megatron FSDP
  ``fsdp_dtensor`` checkpoint through :func:`megatron_bridge.bridge.engine_checkpoints.read_fsdp_dtensor_weights`
  (model weights only; a DCP folder read in one process without megatron-core, so it converts in place, never in a
  child);
* for the megatron-core engine, a native checkpoint (DCP or ``torch``), a weights file or a Hugging Face folder (checked
  against ``cfg.model``) becomes a megatron-core ``torch_dist`` checkpoint through
  :func:`megatron_bridge.bridge.engine_checkpoints.write_mcore_checkpoint`, its vocabulary rows padded for the model.

These are the conversions of ``scripts/checkpoint/convert.py --to megatron_core`` / ``--to megatron`` (exact: the
tensors are copied, never recomputed). megatron-core's side needs a one-process group and TP=PP=1 parallel state of
its own, which a training job of several processes (or one that already set megatron-core's parallel state up)
cannot create in its processes. There the conversion runs in a fresh child interpreter (``python -c``: it imports
nothing of the training script; CPU only; no launcher variables, no process group inherited), the request passed as
JSON on its stdin, the answer written as JSON into the output folder. A single process without either converts in
place. Errors come back as a :class:`CheckpointError`.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from megatron_bridge.checkpoint.load import MCORE_FSDP_DTENSOR
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError, CheckpointError, MegatronBridgeError


MCORE_DIST = "mcore_dist"
"""The loader's kind of a megatron-core ``torch_dist`` folder (``checkpoint/load.py``)."""
MCORE_KINDS_TO_NATIVE = (MCORE_DIST, MCORE_FSDP_DTENSOR)
"""The loader's source kinds of the megatron-core engine the native engine gets converted."""
NATIVE_KINDS = ("dcp", "torch", "weights", "hf")
"""The loader's source kinds the megatron-core engine gets converted."""


def convert_for_engine(path: str, kind: str, model: ModelConfig, engine: str, out_dir: Path) -> tuple[str, str]:
    """Write the source at ``path`` (loader kind ``kind``) in ``engine``'s format under ``out_dir`` (created);
    returns ``(path, kind)`` of the copy for the loader. Runs in a child process (module docstring).

    Raises:
        CheckpointError: the source cannot be converted for ``engine`` or does not fit ``model``.
    """
    if engine == "native" and kind not in MCORE_KINDS_TO_NATIVE:
        raise CheckpointError(f"{path!r} ({kind}) cannot be converted for the native engine: only megatron-core "
                              "torch_dist and Megatron FSDP fsdp_dtensor checkpoints are")
    if engine == "megatron_core" and kind not in NATIVE_KINDS:
        raise CheckpointError(f"{path!r} ({kind}) is not a native-engine source the megatron-core engine converts")
    in_place = kind == MCORE_FSDP_DTENSOR or _can_convert_here()  # fsdp_dtensor: no megatron-core state needed
    outcome = (_convert(path, kind, model, engine, str(out_dir)) if in_place
               else _convert_in_child(path, kind, model, engine, out_dir))
    if outcome[0] == "error":
        error = BridgeError if outcome[1] == "BridgeError" else CheckpointError
        raise error(outcome[2])
    return outcome[1], outcome[2]


def _can_convert_here() -> bool:
    """True in a single process whose megatron-core parallel state is not set up (the conversion sets up its own)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    return not ps.model_parallel_is_initialized() and not (dist.is_initialized() and dist.get_world_size() > 1)


_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                       "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
_ANSWER_FILENAME = ".answer.json"
_CHILD = "from megatron_bridge.bridge.cross_engine import child_main; child_main()"


def _convert_in_child(path: str, kind: str, model: ModelConfig, engine: str, out_dir: Path) -> tuple[str, str, str]:
    """:func:`_convert` in a fresh interpreter (module docstring)."""
    from megatron_bridge.config.container import ConfigContainer

    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding megatron_bridge/
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env["CUDA_VISIBLE_DEVICES"] = ""
    request = {"path": path, "kind": kind, "engine": engine, "out_dir": str(out_dir),
               "config": ConfigContainer(model=model).to_dict()}
    done = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(request), capture_output=True, text=True,
                          env=env, check=False)
    answer_file = out_dir / _ANSWER_FILENAME
    if done.returncode != 0 or not answer_file.is_file():
        return "error", "CheckpointError", (f"converting {path!r} for the {engine} engine failed in its child process "
                                            f"(exit code {done.returncode}): {done.stderr.strip()[-2000:]}")
    answer = json.loads(answer_file.read_text())
    return answer[0], answer[1], answer[2]


def child_main() -> None:
    """The child interpreter's entry: a JSON request on stdin, the answer of :func:`_convert` as JSON into
    ``<out_dir>/.answer.json``."""
    from megatron_bridge.config.container import ConfigContainer

    request = json.loads(sys.stdin.read())
    model = ConfigContainer.from_dict(request["config"]).model
    outcome = _convert(request["path"], request["kind"], model, request["engine"], request["out_dir"])
    out_dir = Path(request["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / _ANSWER_FILENAME).write_text(json.dumps(outcome))


def _convert(path: str, kind: str, model: ModelConfig, engine: str, out_dir: str) -> tuple[str, str, str]:
    """The child's work: ``("ok", path, kind)`` of the copy, or ``("error", exception class name, message)``."""
    try:
        copy = (_to_native(path, kind, model, Path(out_dir)) if engine == "native"
                else _to_mcore(path, kind, model, Path(out_dir)))
    except MegatronBridgeError as exc:
        return "error", type(exc).__name__, str(exc)
    return "ok", copy[0], copy[1]


def _to_native(path: str, kind: str, model: ModelConfig, out_dir: Path) -> tuple[str, str]:
    from megatron_bridge.bridge.convert import write_torch_weights
    from megatron_bridge.bridge.engine_checkpoints import read_fsdp_dtensor_weights, read_mcore_weights

    read = read_fsdp_dtensor_weights if kind == MCORE_FSDP_DTENSOR else read_mcore_weights
    weights = read(path, model)
    return str(write_torch_weights(weights, out_dir / "weights.pt")), "weights"


def _to_mcore(path: str, kind: str, model: ModelConfig, out_dir: Path) -> tuple[str, str]:
    from megatron_bridge.bridge.engine_checkpoints import write_mcore_checkpoint
    from megatron_bridge.bridge.pretrained import hf_weights_for_model
    from megatron_bridge.checkpoint.reader import pad_vocab, read_native_weights, read_weights_file
    from megatron_bridge.config.container import ConfigContainer

    if kind == "hf":
        weights = dict(hf_weights_for_model(path, model))
    elif kind == "weights":
        weights = read_weights_file(path)
    else:
        weights = read_native_weights(path)
    cfg = ConfigContainer(model=model)
    cfg.dataset.seq_length = model.seq_length
    folder = write_mcore_checkpoint(pad_vocab(weights, model.padded_vocab_size), cfg, out_dir / "mcore")
    return str(folder), MCORE_DIST
