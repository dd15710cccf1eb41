#!/usr/bin/env python3
"""Cross-check megatron_bridge.data against megatron-core (not part of CI: mcore cannot share this environment).

Run in a throwaway venv::

    python3 -m venv /tmp/mcorevenv
    /tmp/mcorevenv/bin/pip install torch==2.13.0 numpy megatron-core==0.16.1
    PYTHONPATH=src /tmp/mcorevenv/bin/python scripts/data/check_megatron_core_compat.py

Checks that .bin/.idx files written by both writers are byte-identical and that each library reads the other's;
that GPTDataset document/sample/shuffle indices and every sample equal mcore's; and that blending indices and a
weighted two-file blend equal mcore's. Prints ALL OK and exits 0 when everything matches.
"""

import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch


warnings.filterwarnings("ignore")

from megatron.core.datasets import helpers  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder  # noqa: E402
from megatron.core.datasets.gpt_dataset import GPTDataset as MGPTDataset  # noqa: E402
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig  # noqa: E402
from megatron.core.datasets.indexed_dataset import DType  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDataset as MIndexedDataset  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder as MIndexedDatasetBuilder  # noqa: E402

from megatron_bridge.config.data import DatasetConfig  # noqa: E402
from megatron_bridge.data.blended import build_blending_indices  # noqa: E402
from megatron_bridge.data.gpt_dataset import GPTDataset, split_ranges  # noqa: E402
from megatron_bridge.data.indexed import IndexedDataset, IndexedDatasetBuilder, optimal_dtype  # noqa: E402
from megatron_bridge.data.loaders import build_pretraining_datasets  # noqa: E402
from megatron_bridge.data.tokenizers import NullTokenizer  # noqa: E402


EOD = 60000


class _MTokenizer:
    """The parts of a megatron tokenizer that GPTDatasetConfig reads."""

    vocab_size = EOD + 1
    eod = EOD
    pad = EOD - 1

    @property
    def unique_identifiers(self) -> dict[str, str]:
        return {"name": "check"}


def check_indexed(tmp: str, rng: np.random.Generator) -> bool:
    """Both writers give identical files; each reader reads the other's files."""
    ok = True
    for dtype in (np.uint16, np.int32, np.uint8, np.int64):
        hi = 255 if dtype == np.uint8 else 60000
        docs = [rng.integers(0, hi, size=int(rng.integers(0, 300))) for _ in range(200)]
        ours, theirs = (
            os.path.join(tmp, f"ours_{np.dtype(dtype).name}"),
            os.path.join(tmp, f"mcore_{np.dtype(dtype).name}"),
        )
        builder, mbuilder = IndexedDatasetBuilder(ours + ".bin", dtype), MIndexedDatasetBuilder(theirs + ".bin", dtype)
        seqs: list[np.ndarray] = []
        for i, d in enumerate(docs):
            lengths = [5, len(d) - 5] if i % 7 == 3 and len(d) > 10 else ([len(d)] if len(d) else [])
            builder.add_document(d, lengths)
            mbuilder.add_document(torch.from_numpy(d), lengths)
            seqs.extend(np.split(d, np.cumsum(lengths)[:-1]) if lengths else [])
        builder.finalize(ours + ".idx")
        mbuilder.finalize(theirs + ".idx")
        same_files = all(Path(ours + e).read_bytes() == Path(theirs + e).read_bytes() for e in (".bin", ".idx"))
        m_reads_ours, we_read_theirs = MIndexedDataset(ours), IndexedDataset(theirs)
        reads = all(
            np.array_equal(m_reads_ours[i], s) and np.array_equal(we_read_theirs[i], s) for i, s in enumerate(seqs)
        )
        reads &= len(m_reads_ours) == len(we_read_theirs) == len(seqs)
        docs_ok = np.array_equal(m_reads_ours.document_indices, we_read_theirs.document_indices)
        gets = all(
            np.array_equal(m_reads_ours.get(i, 2, 3), we_read_theirs.get(i, 2, 3))
            for i, s in enumerate(seqs)
            if len(s) >= 5
        )
        print(
            f"indexed {np.dtype(dtype).name}: identical files {same_files}, cross reads {reads}, "
            f"document indices {docs_ok}, get(offset, length) {gets}"
        )
        ok &= same_files and reads and docs_ok and gets
    same = all(optimal_dtype(v) == DType.optimal_dtype(v) for v in (100, 65499, 65500, 200000))
    print(f"optimal_dtype identical {same}")
    return ok and same


def _write_random(prefix: str, rng: np.random.Generator, n: int, max_len: int) -> str:
    builder = IndexedDatasetBuilder(prefix + ".bin", np.uint16)
    for _ in range(n):
        builder.add_document(np.append(rng.integers(0, EOD - 1000, size=int(rng.integers(1, max_len))), EOD))
    builder.finalize(prefix + ".idx")
    return prefix


def _mcore_config(tmp: str, blend: tuple, seed: int, seq: int, split: str, masks: bool) -> GPTDatasetConfig:
    return GPTDatasetConfig(
        random_seed=seed, sequence_length=seq, blend=blend, split=split, tokenizer=_MTokenizer(),
        reset_position_ids=masks, reset_attention_mask=False, eod_mask_loss=masks,
        path_to_cache=tempfile.mkdtemp(dir=tmp), mid_level_dataset_surplus=0.005,
    )  # fmt: skip


def check_gpt(tmp: str, rng: np.random.Generator) -> bool:
    """GPTDataset indices and samples equal mcore's (one and several epochs, several splits)."""
    ok = True
    prefix = _write_random(os.path.join(tmp, "gpt"), rng, 300, 90)
    cases = ((32, 1000, 50, 1234, "90,8,2"), (17, 5000, 300, 7, "80,15,5"), (64, 50, 10, 3, "97,2,1"))
    for seq, n_train, n_valid, seed, split in cases:
        cfg = _mcore_config(tmp, ([prefix], None), seed, seq, split, True)
        mtrain, mvalid, _ = BlendedMegatronDatasetBuilder(MGPTDataset, [n_train, n_valid, 5], lambda: True, cfg).build()
        indexed = IndexedDataset(prefix)
        for si, (mds, n) in enumerate(((mtrain, n_train), (mvalid, n_valid))):
            lo, hi = split_ranges(split, len(indexed))[si]
            ds = GPTDataset(
                indexed,
                np.arange(lo, hi),
                n,
                seq_length=seq,
                random_seed=seed,
                eod=EOD,
                split_name=("train", "valid")[si],
                reset_position_ids=True,
                eod_mask_loss=True,
            )
            same_idx = all(
                np.array_equal(getattr(ds, a), getattr(mds, a))
                for a in ("document_index", "sample_index", "shuffle_index")
            )
            keys = ("tokens", "labels", "loss_mask", "position_ids")
            same = len(ds) == len(mds) and all(torch.equal(ds[i][k], mds[i][k]) for i in range(len(ds)) for k in keys)
            print(
                f"gpt seq={seq} seed={seed} split={split} {ds.split_name}: {len(ds)} samples, "
                f"indices identical {same_idx}, samples identical {same}"
            )
            ok &= same_idx and same
    return ok


def check_blends(tmp: str, rng: np.random.Generator) -> bool:
    """Blending indices and a weighted blend of two files equal mcore's."""
    ok = True
    for w, size in (([0.7, 0.3], 1000), ([0.2, 0.5, 0.3], 12345), ([0.25] * 4, 999), ([1e-3, 1 - 1e-3], 5000)):
        di, dsi = np.zeros(size, dtype=np.int16), np.zeros(size, dtype=np.int64)
        helpers.build_blending_indices(di, dsi, np.array(w, dtype=np.float64), len(w), size, False)
        a, b = build_blending_indices(w, size)
        same = np.array_equal(a, di) and np.array_equal(b, dsi)
        print(f"blending indices weights={w} size={size}: identical {same}")
        ok &= same
    p1 = _write_random(os.path.join(tmp, "blend1"), rng, 300, 90)
    p2 = _write_random(os.path.join(tmp, "blend2"), rng, 150, 200)
    sizes = [700, 64, 16]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)  # mcore's BlendedDataset asks for the rank
    cfg = _mcore_config(tmp, ([p1, p2], [0.7, 0.3]), 99, 24, "90,7,3", False)
    theirs = BlendedMegatronDatasetBuilder(MGPTDataset, sizes, lambda: True, cfg).build()
    ours_cfg = DatasetConfig(
        mock=False, data_path=["0.7", p1, "0.3", p2], split="90,7,3", seq_length=24, random_seed=99
    )
    ours = build_pretraining_datasets(ours_cfg, NullTokenizer(EOD + 1), (sizes[0], sizes[1], sizes[2]))
    for name, a, m in zip(("train", "valid", "test"), ours, theirs):
        same = len(a) == len(m) and all(
            torch.equal(a[i]["tokens"], m[i]["tokens"]) and torch.equal(a[i]["labels"], m[i]["labels"])
            for i in range(len(a))
        )
        print(f"weighted blend {name}: {len(a)} samples, identical {same}")
        ok &= same
    torch.distributed.destroy_process_group()
    return ok


def main() -> int:
    """Run all checks; 0 when everything matches."""
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        ok = check_indexed(tmp, rng) & check_gpt(tmp, rng) & check_blends(tmp, rng)
    print("ALL OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
