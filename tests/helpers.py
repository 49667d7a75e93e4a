"""Helpers shared by the tests (and a few benchmarks): running `bertrain pretrain` in a subprocess, the kernel
settings of cross-path comparisons, a small prepared DATA_DIR built without `bertrain prepare`, and checks on
what `bertrain prepare` wrote.

    from tests.helpers import TINY, make_prepared_dir, run_pretrain, write_config
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import yaml
from safetensors.torch import load_file

from bertrain.data.format import open_prepared, token_dtype_for, write_manifest, write_shard
from bertrain.data.masking import word_tables
from bertrain.data.word_units import word_starts_for
from bertrain.data.prepare.documents import unaccounted_documents

ROOT = Path(__file__).resolve().parent.parent

TINY = {
    "data": {"objective": "nsp", "max_seq_length": 64, "eval_batches": 2},
    "model": {"type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 64, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.0,
              "max_position_embeddings": 64},
    "optim": {"lr": 1.0e-3, "warmup_steps": 2},
    "train": {"batch_size": 8, "max_steps": 6, "save_every": 3, "eval_every": 3, "log_every": 1,
              "deterministic": True, "keep_last": 5},
}


def write_config(path: Path, base: dict = TINY, **sections: dict) -> Path:
    """A config YAML: `base` with per-section updates (e.g. train={"max_steps": 4})."""
    tree = {k: dict(v) for k, v in base.items()}
    for section, values in sections.items():
        tree.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(tree))
    return path


def default_ctrl_c() -> None:
    """Popen preexec_fn: Ctrl-C at its default in the child, as a terminal's shell starts a command. A test run in the
    background of a non-interactive shell (`pytest &`) inherits SIGINT ignored, and Python then keeps ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_file(path: Path, process: subprocess.Popen | None = None, timeout: float = 300) -> str:
    """The text of `path` once another process has written it (a marker or a pid: polled until it exists and is not
    empty, since its writer creates it before writing); fail when `process` ends first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not path.exists() or not (text := path.read_text()):
        assert process is None or process.poll() is None, f"the process ended first: {process.communicate()}"
        assert time.monotonic() < deadline, f"{path} never appeared (or stayed empty)"
        time.sleep(0.05)
    return text


def pretrain_env(**extra: str) -> dict:
    """The environment of a pretrain subprocess: offline, one thread, no test hooks unless given."""
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
               TOKENIZERS_PARALLELISM="false", COLUMNS="250")
    for key in [k for k in env if k.startswith("BERTRAIN_TEST_")]:
        del env[key]
    env.update(extra)
    return env


# Every comparison of two different computations of one result (accumulation vs one micro-batch, packed vs padded,
# 2 processes vs 1) runs under both: the machine's own kernels (ATen's widest vector code, 1 thread) and portable
# ones (ATen's plain code, 2 threads). They round differently, so a tolerance that holds only for one CPU's kernels
# fails on the machine that runs the suite first, not on the next one. oneDNN stays below AMX there: on a CPU with
# AMX, torch 2.13's bf16 attention packs its operands for AMX, which ATen's plain code cannot ("pack_vnni2 is only
# supported when avx512 is supported"); a ceiling, so it changes nothing on a CPU without AMX.
KERNELS = {"own-kernels": {}, "portable-kernels": {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2",
                                                   "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}}


def kernel_env(kernels: str, nproc: int = 1, **extra: str) -> dict:
    """pretrain_env under one of KERNELS; with several processes, one thread each (not more threads than cores)."""
    env = pretrain_env(**KERNELS[kernels], **extra)
    if nproc > 1:
        env["OMP_NUM_THREADS"] = "1"
    return env


def rounding_rtol(reduction_length: int, steps: int = 1, dtype: torch.dtype = torch.float32) -> float:
    """The relative tolerance between two computations of one result that differ only in rounding (summation order,
    kernels, fused or separate operations): a real difference of the maths shows far above it.

    K = `reduction_length` terms summed in two orders differ by about sqrt(K)·eps relative to the terms (each
    addition rounds by at most eps/2 and the errors add like a random walk: Higham, "Accuracy and Stability of
    Numerical Algorithms", chapters 2 and 4), K being the longest reduction. Each of `steps` stages that carry the
    earlier error forward (layers, optimizer steps) adds one such error, and each comes twice (a forward and a
    backward, or the two sides of the comparison):  rtol = 2 · sqrt(K) · eps · steps.
    """
    return 2 * math.sqrt(reduction_length) * torch.finfo(dtype).eps * steps


def assert_rounding_close(actual, expected, reduction_length: int, steps: int = 1, dtype: torch.dtype = torch.float32,
                          name: str = "") -> None:
    """`actual` equals `expected` within rounding_rtol of expected's largest magnitude (an element that cancels to
    near zero still carries the rounding of the terms it summed)."""
    actual, expected = (torch.as_tensor(x).detach().double() for x in (actual, expected))
    assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
    error = float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30))
    rtol = rounding_rtol(reduction_length, steps, dtype)
    assert error <= rtol, f"{name}: relative error {error:.3g} > rounding_rtol {rtol:.3g}"


def run_interpreted_tests(test_file: str, passed: int) -> None:
    """Run `test_file`'s tests named *interpreted* in a process where Triton's interpreter runs the GPU kernels on the
    CPU (it must be chosen before Triton is imported), and check that all `passed` of them pass."""
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file, "-k",
                             "interpreted"], cwd=root, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)})
    assert result.returncode == 0 and f"{passed} passed" in result.stdout, (result.stdout[-3000:]
                                                                            + result.stderr[-3000:])


def run_pretrain(config: Path, data: Path, run_dir: Path, *args: str, nproc: int = 1, env: dict | None = None,
                 timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m bertrain pretrain ...` (or torchrun with `nproc` processes) in a subprocess."""
    from bertrain.cli.launch_commands import torchrun_command

    command = ["pretrain", "--config", str(config), "--data", str(data), "--run-dir", str(run_dir), *args]
    # torchrun as `bertrain launch --nproc` starts it: on a free port (tests run in parallel, under pytest-xdist)
    command = [sys.executable, "-m", "bertrain", *command] if nproc == 1 else torchrun_command(nproc, command)
    return subprocess.run(command, env=env or pretrain_env(), capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def config_help(key: str) -> str:
    """The schema's help of a config key: tests check where it is shown, never its wording."""
    from bertrain.config import Config
    from bertrain.config.reference import iter_docs

    return next(help_text for dotted, _, _, help_text in iter_docs(Config) if dotted == key)


def squeezed(text: str) -> str:
    """`text` without whitespace and table borders: what is left of a help however a table folds it."""
    return re.sub(r"[\s│┃|]", "", text)


def train_losses(run_dir: Path) -> dict[int, float]:
    """step → loss of the train records in RUN_DIR/metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def final_weights(run_dir: Path, step: int) -> dict:
    """The model weights of RUN_DIR's checkpoint at `step`."""
    return load_file(str(run_dir / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))


def assert_same_weights(a: dict, b: dict) -> None:
    """Bitwise equality of two state dicts."""
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def explain(result: subprocess.CompletedProcess) -> str:
    """Exit code and the tails of stdout/stderr, for assertion messages."""
    return f"exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"


class OneProcess:
    """What train_step uses of an Accelerator, for one CPU process (tests/test_sync_free.py,
    benchmarks/loop_overhead.py): Accelerate adds nothing per step there."""

    num_processes, device, scaler = 1, torch.device("cpu"), None

    def no_sync(self, model):
        return contextlib.nullcontext()

    def backward(self, loss):
        loss.backward()

    def clip_grad_norm_(self, parameters, max_norm):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)


# ---------------------------------------------------------------------------------------------
# A small, real prepared DATA_DIR, independent of `bertrain prepare`: prose from CPython's `pydoc_data.topics`,
# split into paragraphs → documents and sentences, tokenized with a tiny tokenizer trained here (WordPiece `##` or
# Unigram `▁`, special tokens at ids 0-4 as the shared contract says), written with bertrain.data.format.
# ---------------------------------------------------------------------------------------------

SPECIAL_STRINGS = {
    "wordpiece": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
    "unigram": {"pad": "<pad>", "unk": "<unk>", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
}
WORD_MARKERS = {"wordpiece": "##", "unigram": "▁"}
_SENTENCE_END = re.compile(r"(?<=[.!?:])\s+")


@lru_cache(maxsize=1)
def pydoc_paragraphs() -> tuple[str, ...]:
    """Non-empty paragraphs of Python's reference topics, in a fixed order."""
    from pydoc_data.topics import topics

    paragraphs = []
    for key in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[key]):
            text = " ".join(block.split())
            if text:
                paragraphs.append(text)
    return tuple(paragraphs)


def split_sentences(paragraph: str) -> list[str]:
    """Sentences of a paragraph (a simple punctuation rule is enough for tests)."""
    return [s for s in _SENTENCE_END.split(paragraph) if s.strip()]


@lru_cache(maxsize=4)
def train_tokenizer(kind: str = "wordpiece", vocab_size: int = 1200):
    """A tiny tokenizers.Tokenizer trained on the pydoc prose, once per process (neither kind's training is
    deterministic across processes here, so decode a DATA_DIR with its own tokenizer/tokenizer.json)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = list(SPECIAL_STRINGS[kind].values())
    text = list(pydoc_paragraphs())
    if kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, min_frequency=2)
    elif kind == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        # Splitting punctuation and digits before Metaspace avoids a Unigram trainer crash on prose.
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
            pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.Metaspace()])
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>")
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    tokenizer.train_from_iterator(text, trainer=trainer)
    for index, token in enumerate(specials):
        assert tokenizer.token_to_id(token) == index, (kind, token, tokenizer.token_to_id(token))
    return tokenizer


def make_prepared_dir(path: str | Path, kind: str = "wordpiece", num_documents: int = 200, seed: int = 0,
                      num_shards: int = 2, validation_documents: int = 8, vocab_size: int = 1200,
                      max_paragraphs: int | None = None) -> Path:
    """Write a prepared DATA_DIR (train split in `num_shards` shards, one validation shard) and return it.

    Documents are runs of consecutive pydoc paragraphs (num_documents of them in total; `seed`
    shuffles which go to which shard and which are held out for validation).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(kind, vocab_size)
    paragraphs = pydoc_paragraphs()[:max_paragraphs]
    groups = np.array_split(np.arange(len(paragraphs)), num_documents)
    documents = [[s for p in group for s in split_sentences(paragraphs[p])] for group in groups]
    documents = [d for d in documents if d]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(documents))
    validation = [documents[i] for i in order[:validation_documents]]
    train = [documents[i] for i in order[validation_documents:]]

    tokenizer_dir = path / "tokenizer"
    tokenizer_dir.mkdir(exist_ok=True)
    tokenizer.save(str(tokenizer_dir / "tokenizer.json"))
    strings = SPECIAL_STRINGS[kind]
    (tokenizer_dir / "special_tokens_map.json").write_text(json.dumps(
        {f"{name}_token": value for name, value in strings.items()}, indent=2))
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512,
         **{f"{name}_token": value for name, value in strings.items()}}, indent=2))
    dtype = token_dtype_for(tokenizer.get_vocab_size())
    tables = word_tables(str(tokenizer_dir / "tokenizer.json"), kind, WORD_MARKERS[kind], tokenizer.get_vocab_size())

    splits = {}
    for split_name, docs, shard_count in (("train", train, num_shards), ("validation", validation, 1)):
        records = []
        for shard_number, shard_docs in enumerate(np.array_split(np.arange(len(docs)), shard_count)):
            sentences = [s for d in shard_docs for s in docs[d]]
            encoded = tokenizer.encode_batch(sentences, add_special_tokens=False) if sentences else []
            lengths = np.array([len(e.ids) for e in encoded], dtype=np.int64)
            tokens = np.array([t for e in encoded for t in e.ids], dtype=dtype)
            sentence_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            per_doc = np.array([len(docs[d]) for d in shard_docs], dtype=np.int64)
            document_offsets = np.concatenate([[0], np.cumsum(per_doc)]).astype(np.int64)
            starts, _ = word_starts_for(sentences, [None] * len(sentences), tokens.astype(np.int64), lengths, {},
                                        tables, None)   # prepare's rule, for spaced text
            records.append(write_shard(path / split_name, f"shard-{shard_number:05d}", tokens,
                                       sentence_offsets, document_offsets, starts))
        splits[split_name] = {"shards": records, **{k: sum(r[k] for r in records)
                                                    for k in ("documents", "sentences", "tokens")}}
    tokenizer_bytes = (tokenizer_dir / "tokenizer.json").read_bytes()
    write_manifest(path, {
        "tokenizer": {"kind": kind, "word_marker": WORD_MARKERS[kind], "vocab_size": tokenizer.get_vocab_size(),
                      "sha256": hashlib.sha256(tokenizer_bytes).hexdigest(),
                      "special_tokens": {name: i for i, name in enumerate(strings)},
                      "special_token_strings": strings},
        "token_dtype": str(np.dtype(dtype)),
        "splits": splits,
        "sources": [{"path": "pydoc_data.topics", "generated_by": "tests/helpers.py"}],
        "counts": {"documents": len(documents)},
        "settings": {"num_documents": num_documents, "seed": seed, "num_shards": num_shards},
    })
    return path


# ---------------------------------------------------------------------------------------------
# Checks on what `bertrain prepare` wrote
# ---------------------------------------------------------------------------------------------


def stored_documents(data_dir):
    """Every document of both splits as a tuple of sentences' token-id tuples."""
    prepared = open_prepared(data_dir)
    out = []
    for split in ("train", "validation"):
        for shard in prepared.split(split).shards:
            s, d = np.asarray(shard.sentence_offsets), np.asarray(shard.document_offsets)
            for j in range(len(d) - 1):
                out.append(tuple(tuple(shard.tokens[s[i]:s[i + 1]].tolist()) for i in range(d[j], d[j + 1])))
    return out


def check_identity(counts):
    """Every document read was written or counted under one of the skip reasons."""
    assert unaccounted_documents(counts) == 0
