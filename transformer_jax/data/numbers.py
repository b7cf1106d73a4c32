"""The built-in offline dataset "numbers": numbers 0..999,999 in German and English words.

A translation task that needs no download and trains in minutes, yet is not a
word-for-word lookup: German puts units before tens and writes a number as one
word, so the model must reorder and split,

    342    "dreihundertzweiundvierzig"  ->  "three hundred and forty-two"
    21005  "einundzwanzigtausendfünf"   ->  "twenty-one thousand and five"

The words come from the num2words library (no hand-written grammar here).

Splits (disjoint, deterministic, independent of machine and process count):
  "full"  (default): train 200,000 / validation 2,000 / test 2,000
  "small" (tests, quick demos): train 4,000 / validation 200 / test 200
Train always holds every number below 1,000, in "full" by their digits (`small_copies`):
each of 0..9 160 times, of 10..99 32 times, of 100..999 16 times, 9.4 % of train; once
each in "small", where they are a quarter. Once each in "full" (0.5 %, version 1.0.0),
`make train`'s model wrote "two thousand and two" for "zwei" and got 458 of them right; 20
times each (1.1.0), 998, but "zwei" came out as "two two two two two two"; by digits, 997
and every digit but "null" right. All other numbers are drawn without replacement from
1,000..999,999 with a fixed seed. Each split of "small" is a subset of the same split of
"full".

    builder = prepare_numbers(data_dir, config="small")  # builds once, array_record
    source = builder.as_data_source(split="train")       # source[i] == {"de": b"...", "en": b"..."}

Records are stored in TFDS's key-hash order, not in numeric order.
"""

import collections
import concurrent.futures
import fcntl
import multiprocessing
import os
import sys
from collections.abc import Mapping

import numpy as np
import tensorflow_datasets as tfds
from num2words import num2words

from transformer_jax.data.parallel_encoding import (follow_calling_process, main_module_hidden,
                                                    usable_cores)

SPLITS = ("train", "validation", "test")
FULL_SIZES = {"train": 200_000, "validation": 2_000, "test": 2_000}
SMALL_SIZES = {"train": 4_000, "validation": 200, "test": 200}
CONFIG_SIZES = {"full": FULL_SIZES, "small": SMALL_SIZES}

MAX_NUMBER = 999_999
ALWAYS_IN_TRAIN = 1_000  # 0..999: the building blocks of every larger number
SMALL_SHARE = 10  # 0..999 repeated to 1 / SMALL_SHARE of train, at least once
# Copies of each number of 1, 2 and 3 digits per copy of one of 3 (`small_copies`).
DIGIT_WEIGHTS = (10, 2, 1)
SEED = 20_240_342

# Splits larger than this are spelled by a pool of processes; smaller ones in-process,
# where starting processes (about a second each) would cost more than it saves.
POOL_MIN_NUMBERS = 20_000
POOL_CHUNK = 5_000


def number_words(n: int) -> dict[str, str]:
    """One example: the number `n` in German and English words, e.g. 21 ->
    {"de": "einundzwanzig", "en": "twenty-one"}."""
    n = int(n)  # num2words rejects numpy integers' types in some languages
    # num2words 0.5.14 writes "einhunderteinstausend" for 101,000..101,999 (and x01,000
    # for every x); "eins" only ends a number, so "einstausend" is always "eintausend".
    german = num2words(n, lang="de").replace("einstausend", "eintausend")
    return {"de": german, "en": num2words(n, lang="en")}


def small_copies(train_size: int) -> np.ndarray:
    """How many times train holds each number n below 1,000 (at index n): DIGIT_WEIGHTS
    times a unit by its count of digits, the unit as large as a tenth of train allows, or
    each once where a tenth has no room for the weights ("small")."""
    digits = np.searchsorted([10, 100], np.arange(ALWAYS_IN_TRAIN), side="right")
    weights = np.asarray(DIGIT_WEIGHTS)[digits]
    unit = train_size // SMALL_SHARE // int(weights.sum())
    return weights * unit if unit else np.ones_like(weights)


def split_numbers(split: str, sizes: Mapping[str, int] = FULL_SIZES) -> np.ndarray:
    """The numbers of one split, sorted (int64); train's below 1,000 `small_copies` times
    each. Pure: nothing is built or read.

    One fixed permutation of 1,000..999,999 is dealt round-robin into three streams,
    one per split; a split takes the first numbers of its stream. So the splits are
    disjoint for any sizes, and a smaller configuration's splits are subsets of a
    larger one's: the small test set is never in the full training set.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if set(sizes) != set(SPLITS):
        raise ValueError(f"sizes must give {', '.join(SPLITS)}, got {sorted(sizes)}")
    if sizes["train"] < ALWAYS_IN_TRAIN:
        raise ValueError(f"train must hold at least the {ALWAYS_IN_TRAIN} numbers below "
                         f"{ALWAYS_IN_TRAIN}, got {sizes['train']}")
    copies = small_copies(sizes["train"])
    drawn_sizes = dict(sizes, train=sizes["train"] - int(copies.sum()))
    rng = np.random.default_rng(SEED)
    pool = rng.permutation(np.arange(ALWAYS_IN_TRAIN, MAX_NUMBER + 1, dtype=np.int64))
    stream = pool[SPLITS.index(split)::len(SPLITS)]
    if not 0 <= drawn_sizes[split] <= len(stream):
        raise ValueError(f"{split} size {sizes[split]} is out of range")
    drawn = stream[:drawn_sizes[split]]
    if split == "train":
        drawn = np.concatenate([np.repeat(np.arange(ALWAYS_IN_TRAIN, dtype=np.int64), copies),
                                drawn])
    return np.sort(drawn)


def _number_words_chunk(numbers: list[int]) -> list[dict[str, str]]:
    """A pool worker's task: a list, so that one pickle carries thousands of examples."""
    return [number_words(n) for n in numbers]


def _spelled(numbers: np.ndarray):
    """Yields number_words(n) for each n, in order; large inputs on every core."""
    numbers = [int(n) for n in numbers]
    if len(numbers) <= POOL_MIN_NUMBERS:
        yield from map(number_words, numbers)
        return
    chunks = [numbers[i:i + POOL_CHUNK] for i in range(0, len(numbers), POOL_CHUNK)]
    # Spawn, not fork: JAX may be imported here, and forking a multithreaded process
    # can deadlock. The workers start with the main module hidden, so that a script
    # without `if __name__ == "__main__":` is not run again in each of them (map starts
    # them as it submits). The map is ordered: the result does not depend on the number
    # of workers.
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=usable_cores(), mp_context=multiprocessing.get_context("spawn"),
        initializer=follow_calling_process)
    try:
        with main_module_hidden():
            spelled = pool.map(_number_words_chunk, chunks)
        for words in spelled:
            yield from words
    finally:  # on an error, drop the queued chunks instead of spelling them all first
        pool.shutdown(cancel_futures=True)


class Numbers(tfds.core.GeneratorBasedBuilder):
    """TFDS builder of the "numbers" dataset; build it with `prepare_numbers`.

    Without TensorFlow only the array_record file format can be written.
    """

    VERSION = tfds.core.Version("1.2.0")
    RELEASE_NOTES = {"1.0.0": "Initial release (num2words 0.5.14, \"einstausend\" corrected).",
                     "1.1.0": "Train holds 0..999 20 times in \"full\" (a tenth of it).",
                     "1.2.0": "Train holds 0..9 160 times, 10..99 32 and 100..999 16 in "
                              "\"full\" (9.4 % of it)."}
    BUILDER_CONFIGS = [  # the first is the default
        tfds.core.BuilderConfig(
            name="full", description="train 200,000 / validation 2,000 / test 2,000"),
        tfds.core.BuilderConfig(
            name="small", description="train 4,000 / validation 200 / test 200"),
    ]

    def _info(self) -> tfds.core.DatasetInfo:
        # Built directly: dataset_info_from_configs() expects a dataset folder with
        # metadata files, and fails for a builder in a plain module.
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__,
            features=tfds.features.Translation(languages=("de", "en")),
            supervised_keys=("de", "en"),
            homepage="https://github.com/savoirfairelinux/num2words",
            citation=None,
        )

    # TFDS prints "Downloading and preparing dataset ..." and "... downloaded and prepared"
    # to stdout, in the middle of a command's output (a benchmark's markdown table), for a
    # dataset that downloads nothing: one line on stderr instead, as TFDS's progress bars.
    def _log_download_bytes(self) -> None:
        sizes = CONFIG_SIZES[self.builder_config.name]
        print(f"building the numbers dataset ({self.builder_config.name}: "
              f"{', '.join(f'{split} {sizes[split]:,}' for split in SPLITS)} pairs, "
              f"spelled here, nothing downloaded) in {self.data_dir}", file=sys.stderr,
              flush=True)

    def _log_download_done(self) -> None:
        pass  # the progress bars and the line above said it

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        sizes = CONFIG_SIZES[self.builder_config.name]
        return {split: self._generate_examples(split_numbers(split, sizes)) for split in SPLITS}

    def _generate_examples(self, numbers: np.ndarray):
        """Yields (key, {"de": ..., "en": ...}), the key unique: the number, plus 1,000,000
        per copy of it before (train repeats the numbers below 1,000). A split without
        copies keeps version 1.0.0's keys, so its records keep their order."""
        copies = collections.Counter()
        for n, words in zip(numbers, _spelled(numbers), strict=True):
            yield int(n) + (MAX_NUMBER + 1) * copies[int(n)], words
            copies[int(n)] += 1


def prepare_numbers(data_dir: str | None = None, config: str = "full") -> tfds.core.DatasetBuilder:
    """The "numbers" builder, built first if needed (array_record; a no-op if prepared).

    Args:
      data_dir: TFDS data directory; None means TFDS's default (~/tensorflow_datasets
        or $TFDS_DATA_DIR).
      config: "full" or "small".

    Returns:
      the prepared builder: `builder.as_data_source(split="train")` reads a split.
    """
    if config not in CONFIG_SIZES:
        raise ValueError(f"unknown numbers config {config!r}; choose one of "
                         f"{', '.join(CONFIG_SIZES)}")
    builder = Numbers(data_dir=data_dir, config=config, file_format="array_record")
    if builder.is_prepared():
        return builder
    # Two first runs at once (two workdirs, one TFDS folder): TFDS builds into a folder of
    # its own and renames it into place, and the second rename failed ("Destination ...
    # already exists"). One builds while the other waits, then reads what it built.
    lock = f"{builder.data_dir}.lock"
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        builder.download_and_prepare(file_format="array_record")  # a no-op if built meanwhile
    return Numbers(data_dir=data_dir, config=config, file_format="array_record")
