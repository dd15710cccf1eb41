"""launch.py without -ng (and without -mr on a CPU machine): the smallest world size the layout allows on this
machine, said in one line; world-size errors name -ng."""

import pytest

from megatron_bridge.errors import LaunchError
from megatron_bridge.perf.args import build_config, build_parser
from megatron_bridge.perf.world import (
    Machine,
    check_machine,
    check_world_size,
    default_world_size,
    resolve_defaults,
    smallest_world_size,
)


CPU2 = Machine(gpus=0, cpu_cores=2)
GPU8 = Machine(gpus=8, cpu_cores=64)


def _args(*argv: str):  # noqa: ANN202
    return build_parser().parse_args(list(argv))


def test_smallest_world_size_is_pp_lcm_tp_cp_ep_etp() -> None:
    """PP × lcm(TP × CP, EP × ETP): EP folds over the TP × CP × DP ranks of a stage (ETP None is TP)."""
    assert smallest_world_size(build_config(_args("-mr", "llama3_8b"))) == 2  # CP=2
    assert smallest_world_size(build_config(_args("--recipe", "tiny_llama", "-tp", "2", "-pp", "2"))) == 4
    assert smallest_world_size(build_config(_args("--recipe", "tiny_moe", "-cp", "2", "-ep", "4"))) == 4
    assert smallest_world_size(build_config(_args("--recipe", "tiny_moe", "-cp", "2", "-ep", "3"))) == 6
    folded = ("--recipe", "tiny_moe", "-tp", "2", "-ep", "2", "-et", "1")
    assert smallest_world_size(build_config(_args(*folded))) == 2  # EP over the two TP ranks
    assert smallest_world_size(build_config(_args(*folded, "-pp", "2"))) == 4
    assert smallest_world_size(build_config(_args("--recipe", "tiny_moe", "-tp", "2", "-ep", "2"))) == 4  # ETP = TP
    assert smallest_world_size(build_config(_args("-mr", "qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config"))) == 8


def test_ng_the_recipe_cannot_run_takes_megatron_bridges_layout_of_exactly_ng_gpus() -> None:
    """Issue 44: ``-mr qwen3_30b_a3b -ng 8`` (its generic layout is EP 16 on 16 GPUs) runs Megatron-Bridge's 8-GPU
    recipe, TP4 PP2 EP4 with EP folded over the TP ranks, said in one line; a world the recipe runs on, or a -g perf
    config, keeps the recipe; without a per-GPU recipe the world-size error stays."""
    args = _args("-mr", "qwen3_30b_a3b", "-ng", "8")
    line = resolve_defaults(args, None)
    assert args.model_recipe_name == "qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config"
    assert line == ("launch.py: recipe qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config: Megatron-Bridge's 8-GPU layout "
                    "of qwen3_30b_a3b (-ng 8; TP×PP×CP×EP×ETP = 4×2×1×4×1)")
    cfg = build_config(args)
    check_world_size(cfg, 8)
    cfg.validate(world_size=8)
    kept = _args("-mr", "qwen3_30b_a3b", "-ng", "16")
    assert resolve_defaults(kept, None) is None and kept.model_recipe_name == "qwen3_30b_a3b"
    with_gpu = _args("-mr", "qwen3_30b_a3b", "-ng", "8", "-g", "h100")
    assert resolve_defaults(with_gpu, None) is None and with_gpu.model_recipe_name == "qwen3_30b_a3b"
    none = _args("-mr", "llama3_8b", "-ng", "3")
    assert resolve_defaults(none, None) is None
    with pytest.raises(LaunchError, match=r"^-ng 3: the world size must be a multiple of 2"):
        check_world_size(build_config(none), 3)


def test_bare_command_on_a_cpu_machine_picks_tiny_llama_on_one_rank() -> None:
    args = _args("--use_megatron_fsdp", "true")
    line = resolve_defaults(args, CPU2)
    assert (args.model_recipe_name, args.num_gpus) == ("tiny_llama", 1)
    assert line is not None and "\n" not in line
    assert "recipe tiny_llama" in line and "world size 1 (-ng 1)" in line and "2 CPU cores" in line


def test_bare_command_on_gpus_keeps_llama3_8b_and_its_cp() -> None:
    args = _args("--use_megatron_fsdp", "true")
    line = resolve_defaults(args, GPU8)
    assert (args.model_recipe_name, args.num_gpus) == (None, 2)
    assert line == ("launch.py: world size 2 (-ng 2), the smallest recipe llama3_8b's layout TP×PP×CP = 1×1×2 "
                    "allows; this machine has 8 GPUs; give -ng N for another")


def test_given_flags_are_kept_and_nothing_is_said() -> None:
    args = _args("-mr", "llama3_8b", "-ng", "8")
    assert resolve_defaults(args, CPU2) is None and args.num_gpus == 8
    per_node = _args("-mr", "llama3_8b", "-gn", "4", "--nnodes", "2")
    assert resolve_defaults(per_node, GPU8) is None and per_node.num_gpus == 8


def test_nodes_without_ng_name_the_flag() -> None:
    with pytest.raises(LaunchError, match=r"--nnodes 2 without -ng: give -ng"):
        resolve_defaults(_args("-mr", "llama3_8b", "--nnodes", "2"), GPU8)


def test_too_few_devices_for_the_layout_name_ng() -> None:
    cfg = build_config(_args("-mr", "llama3_8b", "-tp", "2"))
    with pytest.raises(LaunchError, match=r"needs at least 4 processes; this machine has 2 CPU cores: run -ng 4"):
        default_world_size(cfg, "llama3_8b", CPU2)
    assert default_world_size(cfg, "llama3_8b", None)[0] == 4  # a dry run or a Slurm job: the layout decides


def test_a_world_size_the_layout_cannot_run_names_ng_and_the_nearest_values() -> None:
    cfg = build_config(_args("-mr", "llama3_8b"))
    with pytest.raises(LaunchError, match=r"^-ng 3: the world size must be a multiple of 2 .*give -ng 4 or -ng 2"):
        check_world_size(cfg, 3)
    with pytest.raises(LaunchError, match=r"^-ng 1: .*give -ng 2, or change -tp/-pp/-cp/-ep"):
        check_world_size(cfg, 1)
    check_world_size(cfg, 6)


def test_megatron_fsdp_without_gpus_names_the_cpu_flag() -> None:
    cfg = build_config(_args("--recipe", "tiny_llama", "--use_megatron_fsdp", "true"))
    with pytest.raises(LaunchError, match=r"--use_megatron_fsdp true needs CUDA GPUs.*--use_torch_fsdp2 true"):
        check_machine(cfg, CPU2)
    check_machine(cfg, GPU8)
