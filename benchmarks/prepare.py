"""`bertrain prepare` throughput and memory against bare tokenizers encoding, in one run.

Not part of the test suite. Builds a corpus of --mb MB of real English prose (pydoc_data.topics
paragraphs, shuffled into distinct documents, as JSON lines), then measures:

1. prepare with tokenizer training (what a user runs first): MB/s of input, peak RSS;
2. prepare with --tokenizer (the tokenizer from 1; reading, cleaning, splitting, dedup, sharding,
   tokenizing, writing): MB/s, peak RSS;
3. the reference: bare `tokenizers` Tokenizer.encode_batch over the same sentences (streamed from a
   file in batches of 4096) with the same number of threads as prepare has workers: MB/s.

Peak RSS is the largest sum of resident memory over the prepare process and its workers, sampled
every 50 ms (psutil), so worker processes count.

    python benchmarks/prepare.py --mb 100
    python benchmarks/prepare.py --mb 1000 --skip-training-run --skip-reference   # memory at 1 GB
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run_measured(command: list[str], env: dict) -> tuple[float, int]:
    """Run a command; return (seconds, peak summed RSS of the process tree in bytes). Its closing
    table's time row (seconds per stage) is printed."""
    import psutil

    start = time.perf_counter()
    env = dict(env, COLUMNS="200")
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        parent = psutil.Process(process.pid)
        while not done.is_set():
            try:
                tree = [parent] + parent.children(recursive=True)
                total = 0
                for member in tree:
                    try:
                        total += member.memory_info().rss
                    except psutil.Error:
                        pass
                peak[0] = max(peak[0], total)
            except psutil.Error:
                pass
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = process.communicate()
    seconds = time.perf_counter() - start
    for line in out.decode().splitlines():
        if "│ time " in line:
            print("  prepare's own timing:", " ".join(line.strip("│ ").split()))
    done.set()
    sampler.join()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{err.decode()[-3000:]}")
    return seconds, peak[0]


def write_sentences(corpus_dir: Path, path: Path) -> int:
    """The sentences prepare tokenizes (same cleaning and splitter, duplicates removed): chars written."""
    from bertrain.data.sources.normalize import document_hash, normalize_document

    seen, chars = set(), 0
    with open(path, "w", encoding="utf-8") as out:
        for file in sorted(corpus_dir.glob("*.jsonl")):
            for line in open(file, encoding="utf-8"):
                sentences = normalize_document("text", json.loads(line)["text"], 1, 10**6, Counter())
                digest = document_hash(sentences)
                if not sentences or digest in seen:
                    continue
                seen.add(digest)
                for sentence in sentences:
                    out.write(sentence + "\n")
                    chars += len(sentence) + 1
    return chars


def bare_encode(tokenizer_dir: Path, sentences_path: Path, threads: int) -> tuple[float, int]:
    """Seconds and tokens for encode_batch over the sentence file with `threads` threads."""
    code = f"""
import time, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file({str(tokenizer_dir / 'tokenizer.json')!r})
batch, tokens = [], 0
start = time.perf_counter()
for line in open({str(sentences_path)!r}, encoding="utf-8"):
    batch.append(line[:-1])
    if len(batch) == 4096:
        tokens += sum(len(e.ids) for e in tok.encode_batch(batch, add_special_tokens=False))
        batch = []
if batch:
    tokens += sum(len(e.ids) for e in tok.encode_batch(batch, add_special_tokens=False))
print(time.perf_counter() - start, tokens)
"""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), RAYON_RS_NUM_CPUS=str(threads),
               TOKENIZERS_PARALLELISM="true")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    seconds, tokens = out.stdout.split()
    return float(seconds), int(tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=100, help="Corpus size in MB.")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--num-shards", type=int, default=8)
    parser.add_argument("--kind", default="wordpiece", choices=["wordpiece", "unigram"])
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--dir", default=None, help="Working directory (default: a temporary one, removed).")
    parser.add_argument("--skip-training-run", action="store_true",
                        help="Skip run 1; train the tokenizer for run 2 on a 50 MB sample instead.")
    parser.add_argument("--skip-reference", action="store_true", help="Skip the bare encode_batch reference.")
    args = parser.parse_args()

    from bertrain.data.sources.pydoc import write_pydoc_corpus

    root = Path(args.dir or tempfile.mkdtemp(prefix="bertrain-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        corpus_dir = root / "corpus"
        if not corpus_dir.is_dir():
            write_pydoc_corpus(corpus_dir, size_mb=args.mb, seed=0)
        corpus_bytes = sum(p.stat().st_size for p in corpus_dir.glob("*.jsonl"))
        mb = corpus_bytes / 1e6
        print(f"corpus: {mb:,.1f} MB of JSON lines in {corpus_dir}")
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        base = [sys.executable, "-m", "bertrain", "prepare", "--source", str(corpus_dir), "--workers",
                str(args.workers), "--num-shards", str(args.num_shards), "--tokenizer-kind", args.kind,
                "--vocab-size", str(args.vocab_size), "--set", "prepare.validation_fraction=0.005"]
        for name in ("data_full", "data_tok"):
            shutil.rmtree(root / name, ignore_errors=True)
        tokenizer_dir = root / "tokenizer"
        shutil.rmtree(tokenizer_dir, ignore_errors=True)
        rows = []
        if not args.skip_training_run:
            full_seconds, full_rss = run_measured(base + ["--out", str(root / "data_full")], env)
            shutil.copytree(root / "data_full" / "tokenizer", tokenizer_dir)
            rows.append(("prepare (incl. tokenizer training)", full_seconds, mb / full_seconds, full_rss))
        else:
            subprocess.run([sys.executable, "-m", "bertrain", "tokenizer", "train", "--source", str(corpus_dir),
                            "--kind", args.kind, "--vocab-size", str(args.vocab_size), "--set",
                            "tokenizer.max_bytes=50000000", "--out", str(tokenizer_dir)],
                           env=env, check=True, stdout=subprocess.DEVNULL)
        tok_seconds, tok_rss = run_measured(base + ["--out", str(root / "data_tok"), "--tokenizer",
                                                    str(tokenizer_dir)], env)
        manifest = json.loads((root / "data_tok" / "manifest.json").read_text())
        tokens = manifest["splits"]["train"]["tokens"] + manifest["splits"]["validation"]["tokens"]
        rows.append(("prepare --tokenizer (no training)", tok_seconds, mb / tok_seconds, tok_rss))
        if not args.skip_reference:
            sentences_path = root / "sentences.txt"
            sentence_chars = write_sentences(corpus_dir, sentences_path)
            bare_seconds, bare_tokens = bare_encode(tokenizer_dir, sentences_path, args.workers)
            sentences_path.unlink()
            rows.append((f"bare encode_batch, {args.workers} threads", bare_seconds, mb / bare_seconds, None))
        print(f"\n{'':44s} {'seconds':>8s} {'MB/s':>7s} {'peak RSS':>10s}")
        for name, seconds, rate, rss in rows:
            print(f"{name:44s} {seconds:8.1f} {rate:7.2f} {'' if rss is None else f'{rss / 2**20:8.0f} MB':>10s}")
        if not args.skip_reference:
            print(f"\ntokens: prepare {tokens:,}, bare {bare_tokens:,} "
                  f"({sentence_chars / 1e6:,.1f} M chars of sentences)")
            ratios = f"{bare_seconds / tok_seconds:.2f} (--tokenizer)"
            if not args.skip_training_run:
                ratios += f", {bare_seconds / full_seconds:.2f} (with training)"
            print(f"ratio prepare/bare throughput: {ratios}; target >= 0.5")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
