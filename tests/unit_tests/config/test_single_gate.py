"""validate() is the single gate: outside ``config/`` no code raises a config error that restates a rule; library code
calls the rule (``enforce``). The raise sites left are runtime facts that no config rule can know (tokenizer files,
checkpoints, teacher models, batch contents, the model or mesh that was built, script and recipe arguments): this
test reads every ``raise`` with ``ast`` and compares them with that allow-list, so a new hand-written re-check fails
here."""

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
CONFIG_ERRORS = {"ConfigValidationError", "PipelineLayoutError"}

ALLOWED: dict[str, str] = {
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
    "models/moe.py::_num_experts": "an MoE layer built by hand from a dense ModelConfig",
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
}
"""Raise sites of config errors outside config/ (``file::function``) and the runtime fact each one checks."""


class _RaiseSites(ast.NodeVisitor):
    """Collects ``file::Class.function`` of each ``raise <config error>(...)`` of one module."""

    def __init__(self, rel: str) -> None:
        self.rel, self.scope, self.sites = rel, [], set()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc
        if isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) and exc.func.id in CONFIG_ERRORS:
            self.sites.add(f"{self.rel}::{'.'.join(self.scope)}")


def config_error_raise_sites() -> set[str]:
    """``file::Class.function`` of every ``raise ConfigValidationError(...)`` (or subclass) outside config/."""
    sites: set[str] = set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if not rel.startswith("config/"):
            visitor = _RaiseSites(rel)
            visitor.visit(ast.parse(path.read_text()))
            sites |= visitor.sites
    return sites


def test_config_errors_outside_config_are_runtime_facts_only() -> None:
    sites = config_error_raise_sites()
    assert sites - ALLOWED.keys() == set(), ("raise sites of config errors outside config/ that are not runtime facts: "
                                              "make the check a rule and call enforce(cfg, rule_id) there")
    assert ALLOWED.keys() - sites == set(), "allow-list entries with no raise left: remove them"


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
