"""Data-side speed, each against a reference measured in the same run. Not part of the test suite.

1. Collate throughput (sequences/s) at seq 128, batch 256: our dataset + collator (assembly from the
   memory-mapped shards + keyed masking, token / whole_word / ngram) against transformers'
   DataCollatorForLanguageModeling on the same pre-tokenized sequences. One torch thread for both
   (what a dataloader worker gets).
2. Collating a micro-batch of the tiny configs (tiny_bert, tiny_albert: 32 x 128) against one training
   step (forward, backward, AdamW) of that model, built with bertrain.model.build_model, both with
   torch's default threads (collation runs in the training process when data.num_workers is 0).
3. Building an epoch plan for 10 million sentences (synthetic offsets), time and peak memory.

    python benchmarks/collate.py
    python benchmarks/collate.py --sentences 2000000 --rounds 3 --only collate,plan
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bertrain.config import DataConfig, load_config  # noqa: E402
from bertrain.data.format import open_prepared  # noqa: E402
from bertrain.data.loader import MicroBatchDataset, epoch_plan, masking_settings  # noqa: E402
from bertrain.data.pairs import build_plan  # noqa: E402
from bertrain.data.split_index import SplitIndex  # noqa: E402
from bertrain.tokenizer_file import load_tokenizer  # noqa: E402
from tests.helpers import SPECIAL_STRINGS, make_prepared_dir  # noqa: E402

SEQ, BATCH = 128, 256


def median_seconds(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def dataset_for(prepared, data_config, micro_batch_size: int, epoch: int = 0) -> MicroBatchDataset:
    plan = epoch_plan(prepared, data_config, seed=0, epoch=epoch)
    return MicroBatchDataset(prepared, data_config, plan, masking_settings(prepared, data_config), split="train",
                             seed=0, epoch=epoch, micro_batch_size=micro_batch_size, rank=0, world_size=1)


def collate_throughput(prepared, rounds: int) -> None:
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

    names = SPECIAL_STRINGS["wordpiece"]
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=load_tokenizer(prepared.tokenizer_dir), pad_token=names["pad"],
        unk_token=names["unk"], cls_token=names["cls"], sep_token=names["sep"], mask_token=names["mask"],
        model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    hf_collator = DataCollatorForLanguageModeling(hf_tokenizer, mlm=True, mlm_probability=0.15, pad_to_multiple_of=8)

    datasets = {mode: dataset_for(prepared, DataConfig(objective="nsp", max_seq_length=SEQ, masking=mode), BATCH)
                for mode in ("token", "whole_word", "ngram")}
    token = datasets["token"]
    batches = len(token)
    # The same sequences, pre-tokenized, as transformers' collator takes them.
    examples = []
    for m in range(batches):
        assembled = token.assemble(token.positions(m))
        length = assembled.attention_mask.sum(axis=1)
        examples.append([{"input_ids": assembled.input_ids[i, :length[i]].tolist(),
                          "token_type_ids": assembled.token_type_ids[i, :length[i]].tolist(),
                          "next_sentence_label": int(assembled.sentence_label[i])} for i in range(BATCH)])
    results = {name: [] for name in ("hf", *datasets)}
    for _ in range(rounds):                       # alternate the contenders; medians over rounds
        for mode, dataset in datasets.items():
            results[mode].append(median_seconds(lambda: [dataset[m] for m in range(batches)], 1) / batches)
        results["hf"].append(median_seconds(lambda: [hf_collator(e) for e in examples], 1) / batches)
    hf = statistics.median(results["hf"])
    print(f"\n1. Collate throughput, seq {SEQ}, batch {BATCH}, torch threads {torch.get_num_threads()}, "
          f"{batches} batches x {rounds} rounds")
    print(f"   {'transformers DataCollatorForLanguageModeling (token)':58s} {BATCH / hf:10,.0f} seq/s  (1.0x)")
    for mode in datasets:
        ours = statistics.median(results[mode])
        print(f"   {'bertrain dataset + collator (' + mode + ')':58s} {BATCH / ours:10,.0f} seq/s  "
              f"({hf / ours:.1f}x)")


def step_versus_collate(prepared, rounds: int) -> None:
    from bertrain.model import build_model

    print("\n2. Collating a micro-batch vs a training step (forward + backward + AdamW), tiny configs, "
          f"torch threads {torch.get_num_threads()}")
    for name in ("tiny_bert", "tiny_albert"):
        config = load_config(name)
        micro = config.train.batch_size // config.train.gradient_accumulation_steps
        dataset = dataset_for(prepared, config.data, micro)
        collate = median_seconds(lambda: [dataset[m] for m in range(10)], rounds) / 10
        for vocab in (prepared.vocab_size, 30522):
            config.model.vocab_size = vocab
            torch.manual_seed(0)
            model = build_model(config.model)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
            batch = dataset[0]

            def step():
                model(**batch).loss.backward()  # with the collator's BatchLayout, as in training
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            median_seconds(step, 3)
            train = median_seconds(step, max(rounds, 10))
            print(f"   {name:12s} batch {micro}x{config.data.max_seq_length} {config.data.masking:6s} model vocab "
                  f"{vocab:6d}: step {train * 1e3:7.1f} ms, collate {collate * 1e3:5.2f} ms "
                  f"= {100 * collate / train:4.1f}% of a step")


def synthetic_index(num_sentences: int, seed: int = 0) -> SplitIndex:
    """Offsets of a Wikipedia-like corpus: 5-45 token sentences, ~40-sentence documents, a few books,
    80% of sentences ending on . ! ? (NSP negatives match that)."""
    rng = np.random.default_rng(seed)
    length = rng.integers(5, 46, num_sentences)
    sizes = rng.geometric(1 / 40, num_sentences // 20)
    sizes = np.concatenate([[20_000] * 10, sizes])                  # ten book-length documents
    bounds = np.cumsum(sizes)
    bounds = bounds[bounds < num_sentences]
    document_first = np.concatenate([[0], bounds, [num_sentences]]).astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(length)]).astype(np.int64)
    return SplitIndex(cum, document_first, np.array([0, cum[-1]], dtype=np.int64), rng.random(num_sentences) < 0.8)


def plan_building(num_sentences: int) -> None:
    index = synthetic_index(num_sentences)
    print(f"\n3. Epoch plan for {num_sentences:,} sentences, {index.num_documents:,} documents, "
          f"{int(index.sentence_cum[-1]):,} tokens (synthetic offsets; offsets alone take "
          f"{(index.sentence_cum.nbytes + index.document_first.nbytes) / 2**20:.0f} MiB)")
    for objective, max_seq_length in (("nsp", 128), ("sop", 128), ("none", 128), ("sop", 512)):
        started = time.perf_counter()
        plan = build_plan(index, objective=objective, max_seq_length=max_seq_length, short_seq_prob=0.1, seed=0,
                          epoch=0)
        seconds = time.perf_counter() - started
        print(f"   {objective:4s} max_seq {max_seq_length}: {seconds:5.2f} s, {len(plan):,} instances")
    tracemalloc.start()
    plan = build_plan(index, objective="nsp", max_seq_length=128, short_seq_prob=0.1, seed=0, epoch=0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    kept = sum(v.nbytes for v in vars(plan).values() if isinstance(v, np.ndarray))
    print(f"   nsp 128 peak allocation while building {peak / 2**20:.0f} MiB; the plan keeps {kept / 2**20:.0f} MiB "
          f"({kept / len(plan):.0f} bytes per instance)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=10_000_000)
    parser.add_argument("--only", default="collate,step,plan", help="Sections to run: collate, step, plan.")
    args = parser.parse_args()
    sections = set(args.only.split(","))
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        prepared = open_prepared(make_prepared_dir(Path(tmp) / "data", kind="wordpiece", num_documents=300,
                                                   vocab_size=4000))
        print(f"Data: pydoc prose, {prepared.split('train').num_tokens:,} train tokens, vocab {prepared.vocab_size} "
              f"(the pydoc demo recipe's size)")
        if "collate" in sections:
            torch.set_num_threads(1)
            collate_throughput(prepared, args.rounds)
            torch.set_num_threads(threads)
        if "step" in sections:
            step_versus_collate(prepared, args.rounds)
    if "plan" in sections:
        plan_building(args.sentences)


if __name__ == "__main__":
    main()
