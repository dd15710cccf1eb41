"""Batch samplers that cut each global batch into per-data-parallel-rank micro-batches, resumable exactly."""

from collections.abc import Iterator

from megatron_bridge.errors import DataError


class PretrainingSampler:
    """Megatron's ``MegatronPretrainingSampler``: sequential sample indices, ``micro_batch_size`` per rank per step.

    Indices ``consumed_samples, consumed_samples + 1, ...`` are taken ``micro_batch_size * data_parallel_size`` at a
    time; rank ``r`` gets the contiguous slice ``[r * micro_batch_size, (r + 1) * micro_batch_size)`` of each such
    group. Restarting with ``consumed_samples`` = the samples consumed so far (by all ranks together) continues
    exactly where an uninterrupted run would be. The randomness lives in the dataset's shuffle index, not here.

    Use as a DataLoader ``batch_sampler``.

    Args:
        total_samples: the dataset's length.
        consumed_samples: samples already consumed by all ranks together; ``<= total_samples``.
        micro_batch_size: samples per rank per step.
        data_parallel_rank: this rank's data-parallel index.
        data_parallel_size: number of data-parallel ranks.
        drop_last: drop a last incomplete group (else every rank gets its part of it, possibly empty -> skipped).
    """

    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        drop_last: bool = True,
    ) -> None:
        if total_samples <= 0:
            raise DataError(f"the dataset has no samples to consume (total_samples={total_samples})")
        if not 0 <= consumed_samples <= total_samples:
            raise DataError(
                f"consumed_samples={consumed_samples} is outside [0, {total_samples}] (the dataset's size); was the "
                "checkpoint written with a different dataset or sample count?"
            )
        if micro_batch_size <= 0:
            raise DataError(f"micro_batch_size must be positive, got {micro_batch_size}")
        if data_parallel_size <= 0 or not 0 <= data_parallel_rank < data_parallel_size:
            raise DataError(
                f"data_parallel_rank={data_parallel_rank} must be in [0, data_parallel_size={data_parallel_size})"
            )
        self.total_samples = int(total_samples)
        self.consumed_samples = int(consumed_samples)
        self.micro_batch_size = int(micro_batch_size)
        self.data_parallel_rank = int(data_parallel_rank)
        self.data_parallel_size = int(data_parallel_size)
        self.drop_last = drop_last

    @property
    def global_step_samples(self) -> int:
        """Samples consumed by all ranks in one step: ``micro_batch_size * data_parallel_size``."""
        return self.micro_batch_size * self.data_parallel_size

    def __len__(self) -> int:
        """Micro-batches this rank will yield."""
        remaining = self.total_samples - self.consumed_samples
        full, rest = divmod(remaining, self.global_step_samples)
        if not self.drop_last and rest > self.data_parallel_rank * self.micro_batch_size:
            full += 1
        return full

    def __iter__(self) -> Iterator[list[int]]:
        step = self.global_step_samples
        lo = self.data_parallel_rank * self.micro_batch_size
        start = self.consumed_samples
        while start + step <= self.total_samples:
            yield list(range(start + lo, start + lo + self.micro_batch_size))
            start += step
        if not self.drop_last and start < self.total_samples:
            part = list(range(start, self.total_samples))[lo : lo + self.micro_batch_size]
            if part:
                yield part
