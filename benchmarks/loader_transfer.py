"""The training process's time per micro-batch, made in-process against received from loader workers: a worker's
batch sent tensor by tensor (each tensor a shared-memory storage of its own: the loader before batch_buffer.py),
as one new buffer a batch (PackedBatch: one storage, whose file descriptor the training process fetches from the
worker: the loader before WorkerSlots), and through the slots (the loader now: each worker writes its batches into
shared buffers it keeps, sent once). Between two batches the training process sleeps for --step-ms, as
while the device runs a step, so the workers are ahead and each figure is the cost of taking a ready batch.
On CUDA the batches are page-locked (one buffer: by the thread that takes it, in the time taken; tensor by tensor:
by DataLoader's pin thread, as the loader before did), the table adds the host's time to queue
the copy to the device (to_device), and a fourth row pins and copies an in-process batch tensor by tensor, as
before. Not part of the test suite.

    python benchmarks/loader_transfer.py                       # a prepared pydoc corpus made on the spot
    python benchmarks/loader_transfer.py --data DATA_DIR --rows 128,256 --workers 4 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bertrain.batch_buffer import PackedBatch, to_device  # noqa: E402
from bertrain.batch_layout import map_tensors  # noqa: E402
from bertrain.config import DataConfig  # noqa: E402
from bertrain.data.format import open_prepared  # noqa: E402
from bertrain.data.loader import RunDataset, ignore_ctrl_c, iterate_micro_batches, num_micro_batches  # noqa: E402
from tests.helpers import make_prepared_dir  # noqa: E402

VARIANTS = ("in-process", "workers, tensor by tensor", "workers, new buffer a batch", "workers, slots")
PINNED_ALONE = "in-process, tensor by tensor"  # CUDA only: each tensor page-locked and copied alone (before)


def batches(variant: str, dataset: RunDataset, length: int, workers: int, pin: bool):
    """The variant's iterator over the `length` micro-batches of epoch 0, again and again."""
    keys = ((0, m % length) for m in range(10**9))
    if variant == PINNED_ALONE:
        return (map_tensors(dataset[key], lambda tensor: tensor.pin_memory()) for key in keys)
    if variant == "workers, tensor by tensor":  # the dataset's batches as they are, each tensor sent alone
        from torch.utils.data import DataLoader

        return iter(DataLoader(dataset, batch_size=None, sampler=keys, num_workers=workers, persistent_workers=True,
                               pin_memory=pin, prefetch_factor=4, worker_init_fn=ignore_ctrl_c))
    if variant == "workers, new buffer a batch":  # each batch packed into a shared buffer of its own
        from torch.utils.data import DataLoader

        loader = DataLoader(NewBuffers(dataset), batch_size=None, sampler=keys, num_workers=workers,
                            persistent_workers=True, prefetch_factor=4, worker_init_fn=ignore_ctrl_c)
        return ((packed.pin_memory() if pin else packed).unpack() for packed in loader)
    return iterate_micro_batches(dataset, keys, workers if variant != "in-process" else 0, pin)


class NewBuffers:
    """dataset[key] packed by the worker into a new buffer (the loader before WorkerSlots)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __getitem__(self, key) -> PackedBatch:
        return PackedBatch.pack(self.dataset[key])


def time_variant(variant, dataset, length: int, workers: int, device: torch.device, steps: int,
                 step_s: float) -> tuple:
    """(median ms to take a batch, median ms to queue its copy to the device) over `steps` batches after a
    warm-up."""
    iterator = batches(variant, dataset, length, workers, device.type == "cuda")
    take, copy = [], []
    for step in range(steps + 10):
        time.sleep(step_s)
        started = time.perf_counter()
        batch = next(iterator)
        taken = time.perf_counter()
        to_device(batch, device, non_blocking=True)
        if step >= 10:
            take.append(taken - started)
            copy.append(time.perf_counter() - taken)
    del iterator  # its workers stop
    return 1e3 * statistics.median(take), 1e3 * statistics.median(copy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="a prepared DATA_DIR (default: a small pydoc corpus made on the spot)")
    parser.add_argument("--rows", default="128,256", help="micro-batch sizes (sequences), comma-separated")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60, help="timed batches per variant and round")
    parser.add_argument("--step-ms", type=float, default=20.0, help="the device step the process sleeps through")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the variants, alternated")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the training process's own threads are the model's; one is enough here
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or make_prepared_dir(Path(tmp) / "data", num_documents=300, num_shards=4)
        prepared = open_prepared(data)
        print(f"training process's ms per micro-batch (median of {args.rounds} rounds of {args.steps}), NSP, "
              f"seq {args.seq}, {args.workers} workers, {args.step_ms:g} ms between batches, device {device}")
        print(f"{'rows':>5}  {'variant':28s}{'take ms':>9}{'copy ms':>9}{'total ms':>10}{'vs in-process':>15}")
        for rows in [int(x) for x in args.rows.split(",")]:
            config = DataConfig(objective="nsp", max_seq_length=args.seq, masking="token")
            dataset = RunDataset(prepared, config, seed=0, micro_batch_size=rows, rank=0, world_size=1)
            length = num_micro_batches(prepared, config, seed=0, epoch=0, micro_batch_size=rows, world_size=1)
            variants = (PINNED_ALONE, *VARIANTS) if device.type == "cuda" else VARIANTS
            results = {variant: [] for variant in variants}
            for round_ in range(args.rounds):
                for variant in variants if round_ % 2 == 0 else variants[::-1]:
                    results[variant].append(time_variant(variant, dataset, length, args.workers, device,
                                                         args.steps, args.step_ms / 1e3))
            totals = {variant: [sum(pair) for pair in pairs] for variant, pairs in results.items()}
            reference = statistics.median(totals["in-process"])
            for variant, pairs in results.items():
                take, copy = (statistics.median(values) for values in zip(*pairs))
                total = statistics.median(totals[variant])
                print(f"{rows:>5}  {variant:28s}{take:9.3f}{copy:9.3f}{total:10.3f}{total / reference:14.2f}x")


if __name__ == "__main__":
    main()
