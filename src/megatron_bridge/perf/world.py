"""The defaults of a launch without ``-ng`` (and without ``-mr`` on a machine without GPUs), and the world-size
check that names the flag.

Without ``-ng`` the launcher runs the smallest world size the recipe's layout allows: PP × lcm(TP × CP, EP × ETP)
(expert parallelism folds over the TP × CP × DP ranks of a stage, ETP None meaning TP), provided the machine at hand
has that many GPUs (or, without CUDA, CPU cores). With ``-ng N`` (and no ``-g``) that the recipe's layout cannot run
on, Megatron-Bridge's per-GPU recipe of that model for exactly N H100s is used where one exists
(``qwen3_30b_a3b`` at ``-ng 8``: ``qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config``, TP4 PP2 EP4), as its launcher
picks the perf config of exactly ``-ng`` GPUs. Without ``-mr`` on a machine without GPUs the recipe is ``tiny_llama``:
Megatron-Bridge's default, llama3_8b, needs GPUs. Both choices are said in one line (:func:`resolve_defaults`).
"""

import argparse
import math
import os
from dataclasses import dataclass

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.rules_moe import expert_tensor_parallel_size
from megatron_bridge.errors import LaunchError


GPU_DEFAULT_RECIPE = "llama3_8b"
"""The recipe without ``-mr`` (Megatron-Bridge's)."""
CPU_DEFAULT_RECIPE = "tiny_llama"
"""The recipe without ``-mr`` on a machine without CUDA GPUs."""


@dataclass(frozen=True)
class Machine:
    """What the machine at hand can run processes on."""

    gpus: int
    """CUDA devices (0: none)."""
    cpu_cores: int
    """CPU cores (the processes of a run without GPUs)."""

    @property
    def devices(self) -> int:
        """Processes one run can place here: one per GPU, else one per CPU core."""
        return self.gpus or self.cpu_cores

    def describe(self) -> str:
        """``"8 GPUs"``, ``"2 CPU cores"``."""
        n, what = (self.gpus, "GPU") if self.gpus else (self.cpu_cores, "CPU core")
        return f"{n} {what}{'' if n == 1 else 's'}"


def this_machine() -> Machine:
    """The GPUs (torch's view of CUDA) and CPU cores of this machine."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return Machine(gpus=gpus, cpu_cores=os.cpu_count() or 1)


def smallest_world_size(cfg: ConfigContainer) -> int:
    """PP × lcm(TP × CP, EP × ETP): the fewest processes the config's layout runs on (1 for sizes that are not
    positive; ``validate()`` names those). ETP None is TP (Megatron's default)."""
    m = cfg.model
    sizes = (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size,
             m.expert_model_parallel_size, expert_tensor_parallel_size(cfg))
    if not all(isinstance(s, int) and s > 0 for s in sizes):
        return 1
    tp, pp, cp, ep, etp = sizes
    return pp * math.lcm(tp * cp, ep * etp if m.is_moe else 1)


def layout_text(cfg: ConfigContainer) -> str:
    """``TP×PP×CP = 1×1×2`` (``×EP`` and ``×ETP`` added when EP > 1)."""
    m = cfg.model
    names, sizes = "TP×PP×CP", [m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size]
    if m.expert_model_parallel_size != 1:
        names, sizes = names + "×EP×ETP", [*sizes, m.expert_model_parallel_size, expert_tensor_parallel_size(cfg)]
    return f"{names} = {'×'.join(str(s) for s in sizes)}"


def per_gpu_recipe(recipe: str, num_gpus: int) -> str | None:
    """Megatron-Bridge's per-GPU recipe of ``recipe`` for exactly ``num_gpus`` H100s
    (``<recipe>_pretrain_<N>gpu_h100_bf16_config``, exported by :mod:`megatron_bridge.recipes`), None without one."""
    import megatron_bridge.recipes as recipes

    name = f"{recipe.removesuffix('_pretrain_config')}_pretrain_{num_gpus}gpu_h100_bf16_config"
    return name if callable(getattr(recipes, name, None)) else None


def check_world_size(cfg: ConfigContainer, num_gpus: int) -> None:
    """Refuse ``-ng`` values the layout cannot run on, naming the flag and the nearest values that work."""
    need = smallest_world_size(cfg)
    if num_gpus % need == 0:
        return
    lower = need * (num_gpus // need)
    fix = f"-ng {need * (num_gpus // need + 1)}" + (f" or -ng {lower}" if lower else "")
    raise LaunchError(f"-ng {num_gpus}: the world size must be a multiple of {need} ({layout_text(cfg)}; PP × "
                      f"lcm(TP × CP, EP × ETP)): give {fix}, or change -tp/-pp/-cp/-ep/-et")


def default_world_size(cfg: ConfigContainer, recipe: str, machine: Machine | None) -> tuple[int, str]:
    """The world size without ``-ng`` and the line that says so; ``machine`` None (a dry run, a Slurm job): the
    layout alone decides. Raises :class:`LaunchError` naming ``-ng`` when the machine has too few devices."""
    need = smallest_world_size(cfg)
    where = "" if machine is None else f"; this machine has {machine.describe()}"
    if machine is not None and need > machine.devices:
        unit = "GPUs" if machine.gpus else "CPU cores"
        raise LaunchError(f"no -ng given: recipe {recipe}'s layout {layout_text(cfg)} needs at least {need} "
                          f"processes{where}: run -ng {need} where there are {need} {unit} (or over nodes: -ng {need} "
                          f"-gn G --nnodes {need}/G, or Slurm -a/-p), or lower -tp/-pp/-cp/-ep")
    return need, (f"world size {need} (-ng {need}), the smallest recipe {recipe}'s layout {layout_text(cfg)} allows"
                  f"{where}; give -ng N for another")


def check_machine(cfg: ConfigContainer, machine: Machine) -> None:
    """Refuse, before anything starts, a backend the machine cannot run, naming the flag and the fix."""
    if cfg.dist.use_megatron_fsdp and not machine.gpus:
        raise LaunchError(f"--use_megatron_fsdp true needs CUDA GPUs and this machine has {machine.describe()} only: "
                          "megatron-fsdp has no CPU code path (docs/training/megatron-fsdp.md, \"The CPU story\"); "
                          "here, shard with PyTorch's FSDP2 instead: --use_torch_fsdp2 true")


def resolve_defaults(args: argparse.Namespace, machine: Machine | None) -> str | None:
    """Fill ``args.model_recipe_name`` (no ``-mr``/``--recipe``/``-m`` and no GPU on ``machine``; or Megatron-Bridge's
    per-GPU recipe of exactly ``-ng`` GPUs when the recipe's layout cannot run on ``-ng`` and there is no ``-g``) and
    ``args.num_gpus`` (no ``-ng``) in place; return the one line that says what was chosen (None: nothing was).
    With ``-gn`` and no ``-ng`` the job is ``-gn`` × ``--nnodes`` processes, as given."""
    from megatron_bridge.perf.args import build_config, recipe_name

    said = []
    if (machine is not None and not machine.gpus and args.model_recipe_name is None and args.recipe is None
            and args.model_family_name is None):
        args.model_recipe_name = CPU_DEFAULT_RECIPE
        said.append(f"no -mr and no GPU here: recipe {CPU_DEFAULT_RECIPE} ({GPU_DEFAULT_RECIPE} needs GPUs)")
    if args.num_gpus is None and args.gpus_per_node is not None:
        args.num_gpus = args.gpus_per_node * args.nnodes
    elif args.num_gpus is None and args.nnodes > 1:
        raise LaunchError(f"--nnodes {args.nnodes} without -ng: give -ng, the processes of the whole job (e.g. -ng "
                          f"{2 * args.nnodes} for 2 per node), or -gn, the processes per node")
    elif args.num_gpus is None:
        args.num_gpus, line = default_world_size(build_config(args), recipe_name(args), machine)
        said.append(line)
    elif args.gpu is None and args.num_gpus % smallest_world_size(build_config(args)):
        recipe = recipe_name(args)
        per_gpu = per_gpu_recipe(recipe, args.num_gpus)
        if per_gpu is not None:
            args.model_recipe_name, args.recipe = per_gpu, None
            said.append(f"recipe {per_gpu}: Megatron-Bridge's {args.num_gpus}-GPU layout of {recipe} (-ng "
                        f"{args.num_gpus}; {layout_text(build_config(args))})")
    return "launch.py: " + "; ".join(said) if said else None
