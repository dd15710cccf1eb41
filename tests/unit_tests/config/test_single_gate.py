"""validate() is the single gate: outside ``config/`` no code raises an error that restates a config rule; library
code calls the rule (``enforce``). This test reads every ``raise`` outside ``config/`` with ``ast``, of every exception
type: the types that by their meaning report runtime facts (checkpoints, data files, launch flags, ...) are listed
once (``RUNTIME_TYPES``); every other raise — ``ConfigValidationError``, ``ValueError``, ``MegatronBridgeError``,
``TypeError``, a re-raised object, a new type — is compared site by site with an allow-list of the runtime facts no
config rule can know (tokenizer files, checkpoints, teacher models, batch contents, the model or mesh that was built,
installed packages, script and recipe arguments), so a new hand-written re-check fails here."""

import ast
from pathlib import Path

import pytest

from megatron_bridge.config.data import DatasetConfig, TokenizerConfig
from megatron_bridge.data.gpt_dataset import parse_split
from megatron_bridge.data.loaders import build_pretraining_datasets, parse_data_path
from megatron_bridge.data.tokenizers import ByteTokenizer, build_tokenizer
from megatron_bridge.distributed.init import resolve_backend
from megatron_bridge.errors import ConfigValidationError


SRC = Path(__file__).resolve().parents[3] / "src" / "megatron_bridge"

RUNTIME_TYPES: dict[str, str] = {
    "CheckpointError": "a checkpoint folder: missing, truncated, corrupt, or not fitting the model",
    "BridgeError": "a conversion's source or target (a Hugging Face folder, weights files)",
    "RunFolderLockedError": "another job holds the run folder",
    "CheckpointOverwriteError": "a run folder holds checkpoints this run did not resume from",
    "DiskFullError": "the disk filled while saving",
    "PrecisionMismatchError": "the saved run's precision against the config's",
    "DataError": "dataset files: missing, malformed, or too small for the samples asked for",
    "PathError": "a path given on the command line or in the config cannot be used (filesystem facts)",
    "LaunchError": "launcher flags (-ng, --nnodes, ...) and the nodes of a job",
    "ConfigMismatchError": "the nodes of a job run different configs",
    "SlurmError": "Slurm flags, sbatch and the job's state",
    "TrainingError": "what happened during training (NaN loss, a failed rank)",
    "ForwardStepError": "what the caller's forward_step returned",
    "CallbackError": "the callbacks the caller registers (their event names), not config fields",
    "MissingDependencyError": "an optional package is not installed",
    "MegatronCoreNeedsCudaError": "megatron-core without CUDA (the machine)",
    "BackendNotAvailableError": "a backend this build cannot run",
    "UnpicklingError": "a pickle in a checkpoint holds disallowed objects",
    "ArgumentTypeError": "argparse's type conversion of a command-line argument",
    "IndexError": "an index out of range (sequence protocol)",
    "KeyError": "a missing key (mapping protocol)",
    "AttributeError": "a missing attribute (attribute protocol, PEP 562 __getattr__)",
}
"""Exception types whose every raise outside config/ reports a runtime fact, by the type's own meaning. Any other
type (``ConfigValidationError``, ``ValueError``, ``MegatronBridgeError``, ``TypeError``, a re-raised object, a type
new to the library) is read site by site against :data:`ALLOWED`."""
CONFIG_TYPES = frozenset({"ConfigValidationError", "PipelineLayoutError", "ConfigOverrideError", "OverridesError",
                          "ValueError", "MegatronBridgeError"})
"""Types a config check raises: never in :data:`RUNTIME_TYPES`."""

GUARD = "an argument guard of a direct call; in a run, validate() refuses the config value first (rule {})"
ALLOWED: dict[str, str] = {
    # config errors: runtime facts no config rule can know
    "data/corpus.py::_tokenizer_tag": "run_recipe.py --corpus: the tokenizer the shipped corpus is tokenized with",
    "data/preprocess.py::preprocess_jsonl": "preprocess_data.py's --workers/--json-keys arguments, not config fields",
    "data/tokenizers.py::HuggingFaceTokenizer.__init__": "the tokenizer file has no BOS token (tokenizer.add_bos)",
    "data/zigzag.py::_chunk_len": "batch contents: a batch's sequence length under CP",
    "distributed/context_parallel.py::apply_context_parallel": "the mesh built and the model's attention modules",
    "distributed/cp_attention.py::ContextParallelAttention.__call__": "batch contents: segment ids under ring "
                                                                      "attention",
    "distributed/pipeline.py::PipelineRunner.__init__": "the backend built has no pipeline group",
    "distributed/tensor_parallel.py::llama_tp_plan": "the model built lacks the Llama modules",
    "distributed/tensor_parallel.py::apply_tensor_parallel": "the mesh built differs from the config",
    "models/experts.py::num_experts_of": "an MoE layer built by hand from a dense ModelConfig",
    "optimization/distillation.py::Distiller._hook": "the teacher model lacks a module of the layer pairs",
    "optimization/distillation.py::_replicated": "the teacher model's parameters",
    "optimization/distillation.py::teacher_model_config": "the teacher checkpoint (missing, or no run_config.yaml)",
    "perf/args.py::recipe_name": "launch.py's -m/-mr/--recipe arguments",
    "perf/args.py::_set_recompute": "launch.py's --recompute_modules argument",
    "perf/estimate.py::gpu_key": "launch.py's -g/--gpu argument (profiling.estimate_gpu is rule profiling_settings)",
    "recipes/__init__.py::get_recipe": "an unknown recipe name",
    "recipes/base.py::apply_common_overrides": "an unknown recipe keyword",
    "recipes/perf_configs.py::precision_config": "launch.py's --compute_dtype argument",
    "training/pretrain.py::_build_tokenizer_and_check_vocab": "the tokenizer file's vocabulary vs model.vocab_size",
    "training/pretrain.py::setup": "the checkpoint's step vs train.train_iters",
    "engines/native/engine.py::NativeEngine.check_forward_step": "the forward_step function the caller passes",
    "bridge/provider.py::_refuse": "provide_distributed_model's keyword arguments (Megatron-Bridge's), not config "
                                   "fields",
    # ValueError / MegatronBridgeError / TypeError: arguments of library functions, the model or mesh built, packages
    "data/blended.py::BlendedDataset.__init__": "BlendedDataset's datasets, weights and size (computed blends)",
    "data/gpt_dataset.py::GPTDataset.__init__": GUARD.format("positive_sizes: dataset.seq_length"),
    "data/indexed.py::IndexedDataset.__getitem__": "an index of the sequence protocol (a slice's step, its type)",
    "data/loaders.py::build_pretraining_datasets": "split sizes computed from train/eval iterations",
    "data/loaders.py::build_pretraining_data_loaders": GUARD.format("positive_sizes: train.micro_batch_size") +
                                                       "; the data-parallel and CP ranks of the process groups",
    "data/mock.py::MockGPTDataset.__init__": GUARD.format("positive_sizes: dataset.seq_length, "
                                                          "dataset.mock_num_samples") + "; the split name",
    "data/zigzag.py::zigzag_chunk_ids": "the CP rank of the process group",
    "data/zigzag.py::attention_work": "the layout name of the CP work model (a library constant)",
    "distributed/activation_checkpointing.py::normalize_mode": GUARD.format("field_types: model.recompute_granularity,"
                                                                            " ddp/fsdp2.activation_checkpointing"),
    "distributed/cp_attention.py::ContextParallelAttention.__init__": GUARD.format("field_types: model.cp_comm_type"),
    "models/float8.py::convert_chunk": GUARD.format("fp8_requirements: mixed_precision.fp8_recipe"),
    "distributed/megatron_fsdp.py::MetaInitReplay.__init__": "a built module with meta parameters and no "
                                                             "reset_parameters()",
    "distributed/megatron_fsdp.py::materialize_meta_buffers": "a built module still holding meta tensors",
    "distributed/megatron_fsdp.py::MegatronFSDPBackend.wrap": "the number of model chunks built (rule "
                                                              "pipeline_megatron_fsdp is enforced before)",
    "distributed/megatron_fsdp_tp.py::check_same_groups": "the process groups built",
    "distributed/megatron_fsdp_tp.py::fsdp_mesh_shape": GUARD.format("world_size_divisible"),
    "distributed/megatron_fsdp_tp.py::local_tensor_parallel_params": "the placements the TP plan gave the parameters",
    "distributed/megatron_fsdp.py::MegatronFSDPBackend._chunk": "the backend used before wrap()",
    "distributed/megatron_fsdp.py::_retarget_params": "the optimizer the caller built",
    "distributed/megatron_fsdp_compat.py::require_cuda": "the machine has no CUDA",
    "distributed/megatron_fsdp_compat.py::require_policy_api": "the installed megatron-fsdp's API",
    "distributed/megatron_fsdp_compat.py::check_accepted": "the installed megatron-fsdp's arguments",
    "distributed/megatron_fsdp_compat.py::check_ddp_config_compatible": "the installed megatron-fsdp and megatron-core",
    "distributed/megatron_fsdp_compat.py::resolve_unit_modules": "the model built and the classes that import "
                                                                 "([] is rule megatron_fsdp_unit_modules)",
    "distributed/megatron_fsdp_compat.py::apply_communication_unit_size": "the installed megatron-fsdp's attributes",
    "engines/megatron_core/ddp.py::MegatronCoreDDPBackend.clip_grad_norm": "a call the backend does not serve",
    "engines/megatron_core/ddp.py::MegatronCoreDDPBackend.model_state_dict": "a call the backend does not serve",
    "engines/megatron_core/megatron_fsdp.py::unit_module_classes": "the model built and the classes that import "
                                                                   "([] is rule megatron_fsdp_unit_modules)",
    "engines/megatron_core/parallel_state.py::initialize": "megatron-core's parallel state left by an earlier run",
    "models/llama.py::LlamaModel.forward": "the shapes of the batch passed in",
    "perf/measure.py::running_sum_stats": "the marks a measurement recorded",
    "recipes/llama/llama3.py::llama3_8b_low_precision": "the recipe function's preset argument",
    "recipes/perf_configs.py::perf_config_key": "a perf recipe function's name (a library table)",
    "engines/native/moe_stats.py::MoETracker.__init__": "the MoE layers of the model built",
    "training/losses.py::masked_next_token_loss": "the function's keyword check_for_spiky_loss (Megatron-Bridge's "
                                                  "signature), not a config field",
    "bridge/families/base.py::family_by_name": "the class a family's registration names (library code)",
    # the override layer (YAML, Hydra-style overrides) that config/serialization.py also holds
    "training/utils/omegaconf_utils.py::create_omegaconf_dict_config": "Megatron-Bridge's override utilities: the "
                                                                       "argument is not a config dataclass",
    "training/utils/omegaconf_utils.py::_check_keys_exist": "Megatron-Bridge's override utilities: an override's "
                                                            "unknown key (the override layer, not a rule)",
    "training/utils/omegaconf_utils.py::_checked_overrides": "Megatron-Bridge's override utilities: an override "
                                                             "string's form (+/~) or value",
    # re-raised exception objects, built where the fact is known
    "training/callbacks.py::_check_event": "raises the CallbackError _unknown_event_error builds",
    "training/callbacks.py::_overridden_events": "raises the CallbackError _unknown_event_error builds",
    "bridge/checkpoints.py::write_streaming_checkpoint": "re-raises the writer thread's error",
    "bridge/cross_engine.py::convert_for_engine": "re-raises a CheckpointError built for the source",
    "checkpoint/comm.py::run_on_rank0": "re-raises rank 0's error on every rank, as its CheckpointError class",
    "checkpoint/foreign.py::converted_source": "raises the CheckpointError _refusal built",
    "checkpoint/load.py::full_state_of": "raises the CheckpointError built for a source without a converter",
}
"""Raise sites outside config/ (``file::function``) of every type not in :data:`RUNTIME_TYPES`, and the runtime fact
each one checks (or, for argument guards, the rule that refuses the config value first)."""


def _type_name(exc: ast.expr) -> str:
    """``X`` of ``raise X(...)``, ``raise X`` or ``raise mod.X(...)``; ``<Call>``-style for other expressions."""
    node = exc.func if isinstance(exc, ast.Call) else exc
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else f"<{type(node).__name__}>"


class _RaiseSites(ast.NodeVisitor):
    """Collects ``(type, file::Class.function)`` of each ``raise`` (not bare re-raises) of one module."""

    def __init__(self, rel: str) -> None:
        self.rel, self.scope, self.sites = rel, [], set()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Raise(self, node: ast.Raise) -> None:
        if node.exc is not None:
            self.sites.add((_type_name(node.exc), f"{self.rel}::{'.'.join(self.scope)}"))


def raise_sites() -> set[tuple[str, str]]:
    """``(exception type, file::Class.function)`` of every raise outside config/."""
    sites: set[tuple[str, str]] = set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if not rel.startswith("config/"):
            visitor = _RaiseSites(rel)
            visitor.visit(ast.parse(path.read_text()))
            sites |= visitor.sites
    return sites


def test_every_raise_outside_config_is_a_runtime_fact() -> None:
    """Every exception type is read: a type of :data:`RUNTIME_TYPES`, or a site of :data:`ALLOWED`."""
    sites = raise_sites()
    gated = {site for kind, site in sites if kind not in RUNTIME_TYPES}
    unlisted = sorted(f"{kind} at {site}" for kind, site in sites if kind not in RUNTIME_TYPES and site not in ALLOWED)
    assert not unlisted, ("raises outside config/ that are neither a runtime type nor an allowed site: if it checks "
                          f"the config, make it a rule and call enforce(cfg, rule_id) there; else list it: {unlisted}")
    assert ALLOWED.keys() - gated == set(), "allow-list entries with no such raise left: remove them"
    assert RUNTIME_TYPES.keys() - {kind for kind, _ in sites} == set(), "runtime types no longer raised: remove them"


def test_config_error_types_are_never_runtime_types() -> None:
    assert not CONFIG_TYPES & RUNTIME_TYPES.keys()


def test_the_reader_sees_every_form_of_raise() -> None:
    source = ("def f():\n    raise ValueError('x')\nclass C:\n    def g(self):\n        raise errors.DataError('y')\n"
              "def h(e):\n    raise e\ndef i():\n    try:\n        pass\n    except OSError:\n        raise\n")
    visitor = _RaiseSites("m.py")
    visitor.visit(ast.parse(source))
    assert visitor.sites == {("ValueError", "m.py::f"), ("DataError", "m.py::C.g"), ("e", "m.py::h")}


@pytest.mark.parametrize(("call", "rule_id", "path"), [
    (lambda: build_tokenizer(TokenizerConfig(tokenizer_type="null", vocab_size=1)), "tokenizer_settings",
     "tokenizer.vocab_size"),
    (lambda: ByteTokenizer(["<eod>"]), "tokenizer_settings", "tokenizer.extra_special_tokens"),
    (lambda: build_tokenizer(TokenizerConfig(add_bos=True)), "tokenizer_settings", "tokenizer.add_bos"),
    (lambda: parse_split("0,0,0"), "dataset_split", "dataset.split"),
    (lambda: parse_data_path(["1", "a", "-1", "b"]), "dataset_data_path", "dataset.data_path"),
    (lambda: build_pretraining_datasets(DatasetConfig(num_workers=-1), None, (1, 0, 0)),  # type: ignore[arg-type]
     "nonnegative_values", "dataset.num_workers"),
    (lambda: resolve_backend("mpi"), "field_types", "dist.distributed_backend"),
])
def test_library_entry_points_raise_the_rule(call: object, rule_id: str, path: str) -> None:
    """The data and set-up code that used to restate a check now reports the rule itself: same message, rule id."""
    with pytest.raises(ConfigValidationError) as info:
        call()  # type: ignore[operator]
    assert f"[rule {rule_id}]" in str(info.value) and path in info.value.paths
