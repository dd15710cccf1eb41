"""The project's exception types.

User mistakes (a bad config value, a bad file) raise a subclass of :class:`MegatronBridgeError`, which is a
``ValueError``: the message names the config path, the bad value and the fix.
"""


class MegatronBridgeError(ValueError):
    """Base class of every error this library raises for something a user can fix."""


class ConfigValidationError(MegatronBridgeError):
    """A config field or a combination of fields is invalid.

    Attributes:
        paths: the dotted config paths involved, e.g. ``("dist.use_megatron_fsdp", "checkpoint.ckpt_format")``.
    """

    def __init__(self, message: str, paths: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.paths = paths


class ConfigOverrideError(MegatronBridgeError):
    """A YAML file or a ``key=value`` override names an unknown key or has a value of the wrong type."""


class OverridesError(ConfigOverrideError):
    """A Hydra-style override cannot be applied (Megatron-Bridge's ``omegaconf_utils.OverridesError``): an unknown
    key, a value that does not parse, or the ``+``/``~`` forms this library does not take."""


class MissingDependencyError(MegatronBridgeError, ImportError):
    """A config asks for an optional package (transformer-engine, nvidia-modelopt, megatron-core) that is missing."""


class CheckpointError(MegatronBridgeError):
    """A checkpoint folder is missing, truncated, corrupt, or does not fit the model it is loaded into."""


class BridgeError(CheckpointError):
    """A Hugging Face folder or config cannot be converted exactly: an unknown architecture, an unsupported config
    value (e.g. an unknown rope_type), missing or unexpected weights, or a config that does not match the model."""


class RunFolderLockedError(CheckpointError):
    """Another live job holds the lock of the ``checkpoint.save`` folder."""


class CheckpointOverwriteError(CheckpointError):
    """Saving would overwrite checkpoints this run did not resume from (see ``checkpoint.overwrite``)."""


class DiskFullError(CheckpointError):
    """Not enough free space to write a checkpoint (the previous checkpoint stays intact)."""


class LaunchError(MegatronBridgeError):
    """A launch flag is invalid (node count, node rank, rendezvous endpoint, restart budget), or the nodes of one job
    cannot meet (nobody answers at the rendezvous endpoint, a node runs another config)."""


class PathError(MegatronBridgeError):
    """A path given for an output or an input cannot be used: under a regular file, in a kernel file system
    (``/proc``), a file where a folder is needed (or the reverse), missing or unreadable."""


class DataError(MegatronBridgeError):
    """A dataset file is missing or malformed, or a data config does not fit the files."""


class ForwardStepError(MegatronBridgeError):
    """A ``forward_step_func`` given to ``pretrain()`` cannot be called in any of Megatron-Bridge's forward-step forms
    (``(data_iterator, model)``, ``(data_iterator, model, return_schedule_plan)``, ``(state, data_iterator, model)``,
    ``(state, data_iterator, model, return_schedule_plan)``)."""


class CallbackError(MegatronBridgeError):
    """A callback given to ``pretrain()`` names no event Megatron-Bridge fires (a misspelled ``on_...`` method or
    ``CallbackManager.register`` event), or is not a callback at all."""


class TrainingError(RuntimeError):
    """Training cannot go on, e.g. the loss became NaN or Inf."""


class SlurmError(MegatronBridgeError):
    """A Slurm job cannot be written, submitted or followed: a launcher flag that does not fit (``-ng``/``-gn``,
    ``--preempt_time``/``-t``), Slurm's clients missing, or ``sbatch`` refusing the job (its message quoted)."""
