"""Weight mapping between a HF folder and our parameter names, one tensor at a time.

Import: :class:`HFModelWeights` is a read-only mapping ``our name → tensor`` over a HF folder, checked up front
(every expected tensor present with its shape, nothing unknown) and read lazily: the vocabulary rows are
zero-padded to the model's ``padded_vocab_size`` and the dtype cast when asked, as each tensor is read.
Export: :func:`to_hf_tensors` turns ``(our name, tensor)`` pairs into ``(HF name, tensor)`` pairs with the padded
vocabulary rows cut back to ``vocab_size``. A family's stacked tensors (MoE experts,
:meth:`ModelFamily.stacked_weights`) are read as the stack of their HF tensors and written back one HF tensor each; its
interleaved tensors (GPT-OSS's gate and up halves, :meth:`ModelFamily.interleaved_weights`) are read as their part of
one HF tensor and written back interleaved into it once all parts have come.
"""

import fnmatch
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import torch

from megatron_bridge.bridge.families.base import InterleavedWeight, ModelFamily, StackedWeight
from megatron_bridge.bridge.hf_reader import HFWeightsReader
from megatron_bridge.bridge.hf_writer import SafetensorsShardWriter, TensorSpec
from megatron_bridge.bridge.memory import track
from megatron_bridge.config.decoder_names import VOCAB_PARAMETERS
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError
from megatron_bridge.utils.logging import get_logger


logger = get_logger(__name__)

VOCAB_PARAMS = VOCAB_PARAMETERS
"""Our parameters whose rows are the (padded) vocabulary."""
_MAX_NAMED = 6


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our parameter shapes for ``config`` (a model built on the meta device: no memory, exact)."""
    from megatron_bridge.models.llama import LlamaModel

    model = LlamaModel(config, device="meta")
    return {name: tuple(p.shape) for name, p in model.state_dict().items()}


def hf_shape(name: str, shape: tuple[int, ...], config: ModelConfig) -> tuple[int, ...]:
    """The HF shape of our parameter ``name``: vocabulary rows unpadded."""
    return (config.vocab_size, *shape[1:]) if name in VOCAB_PARAMS else shape


class HFModelWeights(Mapping[str, torch.Tensor]):
    """The weights of a HF folder under our names for the model ``config`` describes (see the module docstring)."""

    def __init__(self, reader: HFWeightsReader, family: ModelFamily, config: ModelConfig,
                 dtype: torch.dtype | None = None, *, pad_vocab: bool = True,
                 allowed_mismatched_params: Sequence[str] = ()) -> None:
        """``allowed_mismatched_params``: our or HF parameter names (or ``fnmatch`` globs) that may be missing from
        the folder or have another shape there; they are left out (logged) instead of refused, as
        Megatron-Bridge's ``load_hf_weights(allowed_mismatched_params=...)``."""
        self.reader, self.family, self.config, self.dtype = reader, family, config, dtype
        self.pad_vocab = pad_vocab
        self.allowed = tuple(allowed_mismatched_params)
        self._skipped_hf: set[str] = set()
        self.names = family.weight_names(config)
        self.stacked = family.stacked_weights(config)
        self.interleaved = family.interleaved_weights(config)
        self.copies = family.copied_weights(config)
        self.shapes = expected_shapes(config)
        mapped = set(self.names) | set(self.stacked) | set(self.interleaved)
        if mapped != set(self.shapes):
            raise BridgeError(f"the {family.name} mapping and the model disagree on the parameters: "
                              f"{sorted(mapped ^ set(self.shapes))[:_MAX_NAMED]}")
        found = family.read_hf_shapes(reader)
        if self.allowed:
            self._skip_allowed(found)
        self._check(found)

    def _skip_allowed(self, found: dict[str, tuple[int, ...]]) -> None:
        """Leave out the allowed parameters the folder lacks or holds in another shape."""
        def allowed(ours: str, hf: Sequence[str]) -> bool:
            return any(fnmatch.fnmatchcase(n, p) for n in (ours, *hf) for p in self.allowed)

        for ours, hf in list(self.names.items()):
            if allowed(ours, [hf]) and tuple(found.get(hf, ())) != hf_shape(ours, self.shapes[ours], self.config):
                logger.warning("%s: %r left out (allowed_mismatched_params): the folder's %r is %s", self.reader.folder,
                               ours, hf, list(found[hf]) if hf in found else "missing")
                self._skipped_hf.add(hf)
                del self.names[ours]
        for ours, st in list(self.stacked.items()):
            want = _part_shape(self.shapes[ours], st)
            if allowed(ours, st.hf_names) and any(tuple(found.get(h, ())) != want for h in st.hf_names):
                logger.warning("%s: %r left out (allowed_mismatched_params)", self.reader.folder, ours)
                self._skipped_hf.update(st.hf_names)
                del self.stacked[ours]

    def _check(self, found: dict[str, tuple[int, ...]]) -> None:
        where = str(self.reader.folder)
        wanted = set(self.names.values()) | {n for st in self.stacked.values() for n in st.hf_names}
        wanted |= {iw.hf_name for iw in self.interleaved.values()}
        found = {n: shape for n, shape in found.items() if n in wanted or not (
            n in self._skipped_hf or any(fnmatch.fnmatchcase(n, p) for p in self.allowed))}
        missing = sorted(wanted - set(found))
        if missing:
            raise BridgeError(f"{where!r} lacks {len(missing)} tensor(s) the {self.family.name} model needs: "
                              f"{missing[:_MAX_NAMED]}")
        unknown = sorted(n for n in set(found) - wanted - set(self.copies)
                         if not self.family.ignorable_hf_weight(n, self.config))
        if unknown:
            raise BridgeError(f"{where!r} holds {len(unknown)} tensor(s) the {self.family.name} mapping does not "
                              f"know: {unknown[:_MAX_NAMED]}")
        output = VOCAB_PARAMETERS[1]
        if output in found and self.config.share_embeddings_and_output_weights:
            logger.info("%s: ignoring %s (tie_word_embeddings=true: the embedding is the output layer, "
                        "as in transformers)", where, output)
        for ours, hf in self.names.items():
            want = hf_shape(ours, self.shapes[ours], self.config)
            if tuple(found[hf]) != want:
                raise BridgeError(f"{where!r}: tensor {hf!r} has shape {list(found[hf])} but the config says "
                                  f"{list(want)}")
        for ours, iw in self.interleaved.items():
            want = _whole_shape(self.shapes[ours], iw)
            if tuple(found[iw.hf_name]) != want:
                raise BridgeError(f"{where!r}: tensor {iw.hf_name!r} has shape {list(found[iw.hf_name])} but the "
                                  f"config says {list(want)}")
        for ours, stacked in self.stacked.items():
            want = _part_shape(self.shapes[ours], stacked)
            for hf in stacked.hf_names:
                if tuple(found[hf]) != want:
                    raise BridgeError(f"{where!r}: tensor {hf!r} has shape {list(found[hf])} but the config says "
                                      f"{list(want)}")

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self.stacked:
            stacked = self.stacked[name]
            parts = [self.family.read_hf_tensor(self.reader, hf) for hf in stacked.hf_names]
            tensor = track(torch.stack([p.transpose(-1, -2) if stacked.transpose else p for p in parts]))
            return tensor.to(self.dtype) if self.dtype is not None else tensor
        if name in self.interleaved:
            iw = self.interleaved[name]
            tensor = track(self.family.read_hf_tensor(self.reader, iw.hf_name)[..., iw.index::iw.parts].contiguous())
            return tensor.to(self.dtype) if self.dtype is not None else tensor
        if name not in self.names:
            raise KeyError(name)
        tensor = self.family.read_hf_tensor(self.reader, self.names[name])
        self._compare_copies(name, tensor)
        if self.dtype is not None and tensor.dtype != self.dtype:
            tensor = track(tensor.to(self.dtype))
        rows = self.shapes[name][0]
        if self.pad_vocab and name in VOCAB_PARAMS and tensor.shape[0] < rows:
            padded = tensor.new_zeros((rows, *tensor.shape[1:]))
            padded[: tensor.shape[0]] = tensor
            tensor = track(padded)
        return tensor

    def _compare_copies(self, name: str, tensor: torch.Tensor) -> None:
        """Warn about a stored copy of ``name`` (:meth:`ModelFamily.copied_weights`) that differs from it: the model
        keeps one tensor, so an export writes the copy equal to it."""
        for copy in (hf for hf, ours in self.copies.items() if ours == name and hf in self.reader.weight_map):
            if not torch.equal(self.family.read_hf_tensor(self.reader, copy), tensor):
                logger.warning("%s: %r differs from %r, which the model shares (%r); an export writes it equal",
                               self.reader.folder, copy, self.names[name], name)

    def __iter__(self) -> Iterator[str]:
        back: dict[str, list[str]] = {hf: [ours] for ours, hf in self.names.items()}
        back.update({st.hf_names[0]: [ours] for ours, st in self.stacked.items()})  # a stack where its first part is
        for ours, iw in self.interleaved.items():
            back.setdefault(iw.hf_name, []).append(ours)
        order = self.reader.order(list(back))
        return iter([ours for hf in order for ours in back[hf]])

    def __len__(self) -> int:
        return len(self.names) + len(self.stacked) + len(self.interleaved)

    @property
    def left_out(self) -> list[str]:
        """Our parameters left out under ``allowed_mismatched_params`` (the model keeps its own values)."""
        return sorted(set(self.shapes) - set(self.names) - set(self.stacked) - set(self.interleaved))

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Our shape of every tensor (vocabulary rows padded unless ``pad_vocab=False``)."""
        if self.pad_vocab:
            return dict(self.shapes)
        return {name: hf_shape(name, shape, self.config) for name, shape in self.shapes.items()}


def _part_shape(shape: tuple[int, ...], stacked: StackedWeight) -> tuple[int, ...]:
    """HF shape of one part of a stacked tensor of our ``shape``."""
    part = shape[1:]
    return (*part[:-2], part[-1], part[-2]) if stacked.transpose else part


def _whole_shape(shape: tuple[int, ...], part: InterleavedWeight) -> tuple[int, ...]:
    """HF shape of the tensor our interleaved part of ``shape`` belongs to."""
    return (*shape[:-1], shape[-1] * part.parts)


def hf_tensor_shapes(family: ModelFamily, config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF name → HF shape of every tensor an export of ``config`` writes, in our parameters' order (known before
    any tensor exists: the streaming writer lays out its shards from it)."""
    names, stacks = family.weight_names(config), family.stacked_weights(config)
    interleaved = family.interleaved_weights(config)
    copies = family.copied_weights(config)
    out: dict[str, tuple[int, ...]] = {}
    for ours, shape in expected_shapes(config).items():
        if ours in interleaved:
            out.setdefault(interleaved[ours].hf_name, _whole_shape(shape, interleaved[ours]))
        elif ours in stacks:
            out.update(dict.fromkeys(stacks[ours].hf_names, _part_shape(shape, stacks[ours])))
        elif ours in names:
            out[names[ours]] = hf_shape(ours, shape, config)
            out.update(dict.fromkeys((hf for hf, of in copies.items() if of == ours), out[names[ours]]))
    return out


def to_hf_tensors(pairs: Iterable[tuple[str, torch.Tensor]], family: ModelFamily,
                  config: ModelConfig, *, partial: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """``(our name, tensor)`` → ``(HF name, tensor)``, vocabulary rows cut to ``config.vocab_size``, stacked
    tensors split into their HF parts; BridgeError for a parameter the mapping does not know or (unless
    ``partial``: a chosen subset) one it expects but never sees."""
    names: dict[str, str] = family.weight_names(config)
    stacks = family.stacked_weights(config)
    interleaved = family.interleaved_weights(config)
    copies = family.copied_weights(config)
    pending: dict[str, dict[int, torch.Tensor]] = {}
    seen = set()
    for name, tensor in pairs:
        if name in interleaved:
            seen.add(name)
            iw = interleaved[name]
            parts = pending.setdefault(iw.hf_name, {})
            parts[iw.index] = tensor
            if len(parts) == iw.parts:  # all parts here: interleave them on the last dimension
                whole = torch.stack([parts[i] for i in range(iw.parts)], dim=-1)
                yield iw.hf_name, whole.reshape(*whole.shape[:-2], -1).contiguous()
                del pending[iw.hf_name]
            continue
        if name in stacks:
            seen.add(name)
            stacked = stacks[name]
            for hf, part in zip(stacked.hf_names, tensor, strict=True):
                yield hf, (part.transpose(-1, -2) if stacked.transpose else part).contiguous()
            continue
        if name not in names:
            raise BridgeError(f"parameter {name!r} has no {family.name} Hugging Face name (the model and the "
                              f"{family.name} mapping disagree)")
        seen.add(name)
        if name in VOCAB_PARAMS:
            tensor = tensor[: config.vocab_size]
        yield names[name], tensor
        for copy in (hf for hf, of in copies.items() if of == name):
            yield copy, tensor
    missing = sorted((set(names) | set(stacks) | set(interleaved)) - seen)
    if missing and not partial:
        raise BridgeError(f"the model has no {len(missing)} parameter(s) the {family.name} mapping needs: "
                          f"{missing[:_MAX_NAMED]}")


def write_hf_weights(folder: Path, pairs: Iterable[tuple[str, torch.Tensor]], family: ModelFamily,
                     config: ModelConfig, dtype: torch.dtype, max_shard_size: int | str) -> list[str]:
    """Write ``pairs`` (our names) into ``folder`` as the family's HF safetensors shards in ``dtype``, one tensor at a
    time; returns the names of the files written (shards and index)."""
    specs = [TensorSpec(name, shape, dtype) for name, shape in hf_tensor_shapes(family, config).items()]
    writer = SafetensorsShardWriter(folder, specs, max_shard_size)
    try:
        for name, tensor in to_hf_tensors(pairs, family, config):
            writer.add(name, tensor)
        return writer.finish()
    finally:
        writer.close()
