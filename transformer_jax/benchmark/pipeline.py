"""The `pipeline` suite: how fast prepared token ids become training batches.

Three groups of rows:

- numbers: the default run's data (configs/default.py: the built-in numbers
  dataset, a 512-piece vocabulary, 64 rows of 16 + 32 tokens), prepared once,
  read by `train_dataset` with 0, 1 and 2 grain worker processes; and bucketed
  (`bucketed_dataset`) within the same budget, 64 x 32 tokens.
- grain first-fit / best-fit: grain's own packers over the same prepared split
  at the same sizes, one example per grain element, for comparison.
- wmt-like: a generated corpus of WMT14 EN-DE's size (4.5 M pairs, `corpus.py`),
  prepared with a 32k vocabulary: the time to prepare it, to the first batch,
  to the first batch of a resume, the memory the reading takes, and the rate
  at the GPU step's batch, 96 rows of 256 + 256 tokens, packed; and bucketed
  within the paper's budget of 25,000 tokens (8 buckets).

Examples are the sentence pairs packed into the rows (counted from the target
segment ids); tokens are the non-padding source and target tokens; fill is the
share of a row's tokens that are not padding.
"""

import collections
import functools
import os
import resource
import shutil
import sys
import tempfile
import time

import grain
import numpy as np

from transformer_jax.benchmark import report
from transformer_jax.benchmark.corpus import write_wmt_like_corpus
from transformer_jax.data import (
    PreparedSplit,
    bucketed_dataset,
    get_tokenizer,
    prepare,
    train_dataset,
)
from transformer_jax.data.parallel_encoding import usable_cores
from transformer_jax.data.prepared import prepared_dir
from transformer_jax.data.prepared_writer import worker_processes
from transformer_jax.run_config import data_fields

WMT_PAIRS = 4_500_000  # WMT14 EN-DE's training pairs
WMT_QUICK_PAIRS = 3_000
GRAIN_PACKERS = {"grain first-fit": grain.experimental.FirstFitPackIterDataset,
                 "grain best-fit": grain.experimental.BestFitPackIterDataset}

# One rate row: which data, how many rows of which lengths, how many grain workers; and
# `tokens`: 0 packs `rows` rows, > 0 buckets within that budget.
Case = collections.namedtuple("Case", "data rows source_length target_length workers tokens",
                              defaults=(0,))
BUDGET = 25_000  # §5.1's tokens per side and batch


def cases(quick: bool) -> list[Case]:
    """The rate rows of our packer: the default run's batch at 0-2 workers, then the GPU
    step's batch on the WMT-like corpus at 0-2 workers, and up to 16 on hosts of 8 cores
    or more (quick: one of each, no workers)."""
    if quick:
        return [Case("numbers", 64, 16, 32, 0), Case("numbers", 0, 16, 32, 0, 64 * 32),
                Case("wmt", 96, 256, 256, 0), Case("wmt", 0, 256, 256, 0, BUDGET)]
    cores = os.cpu_count() or 1
    many = [w for w in (4, 8, 16) if w <= cores] if cores >= 8 else []
    return ([Case("numbers", 64, 16, 32, w) for w in (0, 1, 2)]
            + [Case("numbers", 0, 16, 32, 0, 64 * 32)]
            + [Case("wmt", 96, 256, 256, w) for w in [0, 1, 2] + many]
            + [Case("wmt", 0, 256, 256, w, BUDGET) for w in (0, 2)])


def _counts(batch: dict, segments: str = "_segmentation") -> tuple[int, ...]:
    """(examples, source tokens, target tokens, source slots, target slots) in one batch,
    packed (`segments`: the suffix of the segment-id keys; grain's packers write
    "_segment_ids") or padded (no segment ids: a row per example, PAD_ID is 0)."""
    if "targets" + segments in batch:
        examples = int(batch["targets" + segments].max(axis=1).sum())
        source, target = batch["inputs" + segments], batch["targets" + segments]
    else:
        source, target = batch["inputs"], batch["targets"]
        examples = int(np.count_nonzero(target.any(axis=1)))
    return (examples, int(np.count_nonzero(source)), int(np.count_nonzero(target)),
            source.size, target.size)


def time_batches(batches, num_batches: int, warmup: int, segments: str = "_segmentation") -> dict:
    """Reads `warmup` batches from the iterator `batches` (workers start, buffers fill), then
    times `num_batches`: batches, examples and tokens per second, and the fill of the rows."""
    for _ in range(warmup):
        next(batches)
    counts = np.zeros(5, np.int64)
    start = time.perf_counter()
    for _ in range(num_batches):
        counts += _counts(next(batches), segments)
    seconds = time.perf_counter() - start
    examples, source, target, source_slots, target_slots = counts.tolist()
    return {"batches_per_sec": num_batches / seconds, "examples_per_sec": examples / seconds,
            "tokens_per_sec": (source + target) / seconds,
            "target_tokens_per_sec": target / seconds,
            "source_fill": source / source_slots, "target_fill": target / target_slots}


def _rate_row(data: str, packer: str, case: Case, figures: dict) -> dict:
    stage = f"bucket, {case.tokens} tokens" if case.tokens else f"pack ({packer})"
    return {"data": data, "stage": stage, "rows": case.rows or "budget",
            "row_tokens": f"{case.source_length}+{case.target_length}",
            "workers": case.workers, **figures}


def _batches(split: PreparedSplit, case: Case):
    """An iterator of our batches for `case`: packed, or bucketed (8 buckets)."""
    lengths = dict(max_source_length=case.source_length, max_target_length=case.target_length,
                   num_workers=case.workers)
    if case.tokens:
        return iter(bucketed_dataset(split, tokens_per_batch=case.tokens, **lengths))
    return iter(train_dataset(split, batch_size=case.rows, **lengths))


def _prepare_train(data, workdir: str, processes: int | None = None) -> PreparedSplit:
    """The training split of `data`, prepared in `workdir` (its tokenizer trained first) by
    `processes` worker processes (`prepare`'s argument)."""
    _, splits = prepare(data, workdir, splits=("train",), log=lambda line: None,
                        processes=processes)
    return splits["train"]


def numbers_rows(quick: bool, workdir: str) -> list[dict]:
    """The default run's data: our packer at 0-2 workers, then grain's two packers."""
    data = data_fields(numbers_size="small" if quick else "full", max_source_length=16,
                       max_target_length=32)
    stage("preparing the numbers dataset", quick)
    split = _prepare_train(data, workdir)
    name, rows = f"numbers ({data.numbers_size})", []
    for case in (c for c in cases(quick) if c.data == "numbers"):
        stage(f"reading numbers batches at {case.workers} workers", quick)
        batches = _batches(split, case)
        figures = time_batches(batches, 10 if quick else 2000, warmup=2 if quick else 50)
        batches.close()
        rows.append(report.measured(_rate_row(name, "transformer_jax", case, figures)))
    for packer, workers in [(p, w) for p in GRAIN_PACKERS for w in ((0,) if quick else (0, 2))]:
        case = Case("numbers", 64, 16, 32, workers)
        stage(f"reading grain's {packer} batches at {workers} workers", quick)
        batches = _grain_batches(packer, split, case)
        figures = time_batches(batches, 3 if quick else 40 * (1 + workers),
                               warmup=1 if quick else 4, segments="_segment_ids")
        batches.close()
        rows.append(report.measured(_rate_row(name, packer, case, figures)))
    return rows


def cut_to_row_lengths(example: dict, lengths: dict) -> dict:
    """An example's ids cut to its rows' lengths (grain's packers take no longer ones)."""
    return {key: example[key][:length] for key, length in lengths.items()}


def _grain_batches(packer: str, split: PreparedSplit, case: Case):
    """An iterator of grain's packer `packer` over `split`, shuffled and endless, in
    `case.workers` grain worker processes (0: in this one)."""
    lengths = {"inputs": case.source_length, "targets": case.target_length}
    examples = (grain.MapDataset.source(split).seed(0).shuffle().repeat()
                .map(functools.partial(cut_to_row_lengths, lengths=lengths)).to_iter_dataset())
    packed = GRAIN_PACKERS[packer](examples, length_struct=lengths,
                                   num_packing_bins=case.rows).batch(case.rows)
    if case.workers:
        packed = packed.mp_prefetch(grain.MultiprocessingOptions(num_workers=case.workers))
    return iter(packed)


def wmt_data(folder: str, quick: bool):
    """The config.data of the WMT-like corpus in `folder`: a 32k vocabulary trained on 1 M
    sentences, rows of 256 + 256 (quick: 1000 pieces, for its 3,000 pairs)."""
    return data_fields(dataset=f"folder:{folder}", source_lang="en", target_lang="de",
                       vocab_size=1000 if quick else 32000, tokenizer_sentences=1_000_000,
                       max_source_length=256, max_target_length=256)


def prepare_wmt(pairs: int, quick: bool, tmp: str) -> tuple[dict, object, str]:
    """Generates the corpus, trains its tokenizer, prepares its training split with
    sentencepiece's threads, then again with one worker process per core: the seconds of
    each and the preparations' pairs/s; then its config.data and workdir."""
    start = time.perf_counter()
    stage(f"generating a WMT-like corpus of {pairs:,} pairs", quick)
    data = wmt_data(write_wmt_like_corpus(os.path.join(tmp, "corpus"), pairs), quick)
    generated = time.perf_counter()
    workdir = os.path.join(tmp, "wmt")
    stage("training its tokenizer", quick)
    get_tokenizer(data, workdir)
    trained = time.perf_counter()
    stage("preparing its ids on sentencepiece's threads", quick)
    _prepare_train(data, workdir, processes=0)
    threads = time.perf_counter() - trained
    shutil.rmtree(prepared_dir(workdir))
    processes = worker_processes(pairs)
    stage(f"preparing its ids again in {processes} worker processes", quick)
    started = time.perf_counter()
    _prepare_train(data, workdir)  # prepare's default: worker processes at this size
    seconds, cores = time.perf_counter() - started, usable_cores()
    return {"pairs": pairs, "generate_s": generated - start, "tokenizer_s": trained - generated,
            "prepare_s": seconds, "pairs_per_sec": pairs / seconds,
            "pairs_per_sec_per_core": pairs / seconds / cores, "processes": processes,
            "threads_prepare_s": threads, "threads_pairs_per_sec": pairs / threads,
            # None with no worker processes: both preparations ran on the threads
            "processes_over_threads": threads / seconds if processes else None}, data, workdir


def stage(text: str, quiet) -> None:
    """A line on stderr as a long stage of the suite starts (none with `quiet`)."""
    if not quiet:
        print(f"pipeline: {text}", file=sys.stderr, flush=True)


def _memory_mb() -> dict[str, float]:
    """This process's peak and current resident memory, and its anonymous part (not pages
    of mapped files), in MiB, from /proc/self/status (Linux); ru_maxrss elsewhere."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        return {key: int(fields[key].split()[0]) / 1024 for key in ("VmHWM", "VmRSS", "RssAnon")}
    except (OSError, KeyError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return {"VmHWM": peak, "VmRSS": peak, "RssAnon": peak}


def _reset_peak_memory() -> float:
    """Sets the peak resident memory to the current one where Linux allows, and returns
    what later peaks are measured from: the memory now, else the earlier peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _memory_mb()["VmRSS"]
    except OSError:
        return _memory_mb()["VmHWM"]


def read_wmt(data, workdir: str, case: Case, resume_after: int, num_batches: int) -> dict:
    """From a run's start on a prepared workdir (`prepare` loads the tokenizer, checks and
    opens the split) to the first batch; then the rate after `resume_after` batches; the
    memory growth of this process meanwhile; and the seconds from opening again to the
    first batch after `set_state` to the state saved then."""
    baseline, anon = _reset_peak_memory(), _memory_mb()["RssAnon"]
    start = time.perf_counter()
    batches = _batches(_prepare_train(data, workdir), case)
    next(batches)
    first = time.perf_counter() - start
    for _ in range(resume_after - 1):
        next(batches)
    state, expected = batches.get_state(), next(batches)
    figures = time_batches(batches, num_batches, warmup=0)
    after = _memory_mb()
    batches.close()
    start = time.perf_counter()
    resumed = _batches(_prepare_train(data, workdir), case)
    resumed.set_state(state)
    batch = next(resumed)
    resume = time.perf_counter() - start
    resumed.close()
    return {**figures, "first_batch_s": first, "resume_s": resume,
            "resumed_exactly": all(np.array_equal(batch[k], expected[k]) for k in expected),
            "peak_rss_mb": max(after["VmHWM"] - baseline, 0.0),
            "anon_mb": after["RssAnon"] - anon}


def wmt_rows(quick: bool, tmp: str) -> list[dict]:
    """The WMT-like corpus: its preparation, then reading it at each worker count."""
    pairs = WMT_QUICK_PAIRS if quick else WMT_PAIRS
    prepared, data, workdir = prepare_wmt(pairs, quick, tmp)
    name = f"wmt-like ({pairs:,})"
    rows = []
    for case in (c for c in cases(quick) if c.data == "wmt"):
        stage(f"reading its batches at {case.workers} workers"
              + (f", a budget of {case.tokens:,} tokens" if case.tokens else ""), quick)
        rows.append(report.measured(_rate_row(
            name, "transformer_jax", case, read_wmt(data, workdir, case,
                                                    resume_after=5 if quick else 50,
                                                    num_batches=5 if quick else 300))))
    return rows + [report.measured({"data": name, "stage": "prepare", **prepared})]


def run(quick: bool = False) -> tuple[list[dict], list[str]]:
    """(rows, notes): the input pipeline's stages on the numbers dataset, then on the
    WMT-like corpus (`corpus.py`), written to a temporary folder."""
    with tempfile.TemporaryDirectory() as tmp:
        rows = numbers_rows(quick, os.path.join(tmp, "numbers")) + wmt_rows(quick, tmp)
    return rows, [
        "examples: sentence pairs packed into the rows; tokens: non-padding source + target "
        "tokens",
        "source_fill / target_fill: non-padding tokens / (rows x row length), per side",
        "bucket rows: bucketed_dataset, pairs of similar length padded, 8 buckets, as many "
        "rows as the budget holds on each side (rows x bucket length <= tokens)",
        "grain first-fit / best-fit: grain.experimental's packers (64 bins), one example per "
        "grain element, over the same prepared split (workers: grain worker processes)",
        "wmt-like: a generated corpus shaped like WMT14 EN-DE (not real language; "
        "benchmark/corpus.py)",
        "first_batch_s: prepare() on the prepared workdir (loads the tokenizer, checks and "
        "opens the split) + train_dataset to the first batch; resume_s: "
        "the same, then set_state to the state after 50 batches (quick: 5); resumed_exactly: "
        "that batch is the one read the first time",
        "peak_rss_mb: this process's peak resident memory growth while reading (mapped id "
        "pages included; workers' not); anon_mb: its anonymous memory growth",
        "prepare row: generate_s writes the corpus; tokenizer_s reads it and trains the "
        "tokenizer; prepare_s reads it again, tokenizes and writes the ids as prepare does "
        "by default (in `processes` worker processes; 0: in process, when the corpus is "
        "small), at pairs_per_sec (and per core); threads_prepare_s and "
        "threads_pairs_per_sec: the same before, in this process on sentencepiece's "
        "threads (one per core); processes_over_threads: the ratio of their rates",
    ]
