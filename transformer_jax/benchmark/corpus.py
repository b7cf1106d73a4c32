"""A generated parallel corpus the size and shape of WMT14 English-German.

    write_wmt_like_corpus("/tmp/wmt_like", 4_500_000)   # train.en/train.de, validation.*, test.*
    data = data_fields(dataset="folder:/tmp/wmt_like", source_lang="en", target_lang="de")

or from a shell, then train the base model on it as on WMT14:

    python -m transformer_jax.benchmark.corpus /tmp/wmt_like [--pairs=4500000]
    python train.py --config=configs/wmt14_ende_base.py --workdir=runs/wmt_like \
        --config.data.dataset=folder:/tmp/wmt_like

It imitates what the input pipeline's cost depends on, not language: WMT14
EN-DE's 4.5 M training pairs, sentences of about 25 ± 12 words (log-normal, so
skewed to the right like real text, cut to 1..120), a target about as long as
its source (×1.05, ±10 %), and words drawn with Zipf frequencies from a fixed
vocabulary per language of 200,000 made-up lowercase words built from
syllables, short words the frequent ones. The vocabulary is larger than a
32k-piece tokenizer, as WMT's is, so rare words are cut into subwords and
frequent ones are whole pieces. The text means nothing; translating it teaches
nothing.

Written with vectorised NumPy in blocks of `BLOCK_PAIRS` pairs, on one core:
1 M pairs (290 MB) took 7.5 s on a busy 2-core CPU, so 4.5 M take well under a
minute.
"""

import contextlib
import functools
import os

import numpy as np

from transformer_jax.atomic_file import atomic_write
from transformer_jax.commands import interrupt_in_one_line

MEAN_WORDS, STD_WORDS, MAX_WORDS = 25.0, 12.0, 120
TARGET_RATIO, TARGET_NOISE = 1.05, 0.10  # target words ≈ source words × ratio × e^N(0, noise)
VOCABULARY_TYPES = 200_000  # made-up word types per language
ZIPF_SHIFT = 2.7  # the frequency of the word of rank r is ∝ 1 / (r + shift): Zipf-Mandelbrot
EVAL_PAIRS = 1000  # pairs of validation and of test
BLOCK_PAIRS = 200_000  # pairs generated and written at a time
LANGUAGES = {"en": 0, "de": 1}  # language -> the seed of its vocabulary

_ONSETS = ["", "b", "br", "ch", "d", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "r", "s",
           "sch", "st", "t", "th", "tr", "v", "w", "z"]
_VOWELS = ["a", "e", "i", "o", "u", "ei", "au", "ie", "ou", "y"]
_CODAS = ["", "", "", "n", "r", "s", "t", "ng", "ch", "l", "m", "nd", "st"]


@functools.lru_cache(maxsize=None)
def vocabulary(language_seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A language's words, most frequent first, as (bytes of each word and a space, end to
    end; each word's start; each word's length, its space included), int32 offsets."""
    syllables = [o + v + c for o in _ONSETS for v in _VOWELS for c in _CODAS]
    rng = np.random.default_rng([language_seed, 7])
    drawn = VOCABULARY_TYPES * 5 // 4  # some words come out twice: drawn, then made unique
    counts = rng.choice([1, 2, 3, 4, 5], size=drawn, p=[0.08, 0.3, 0.34, 0.2, 0.08])
    picks = rng.integers(len(syllables), size=(drawn, 5))
    words = dict.fromkeys("".join(syllables[i] for i in row[:n])
                          for row, n in zip(picks.tolist(), counts))
    words = list(words)[:VOCABULARY_TYPES]
    lengths = np.fromiter(map(len, words), np.int32, len(words)) + 1
    # Short words are the frequent ones, loosely: "the" and "of" rather than "a" and "e".
    order = np.argsort(lengths + rng.uniform(0, 4, len(words)), kind="stable")
    text = np.frombuffer(" ".join(words[i] for i in order).encode("ascii") + b" ", np.uint8)
    lengths = lengths[order]
    return text, np.cumsum(lengths, dtype=np.int32) - lengths, lengths


def zipf_ranks(rng: np.random.Generator, count: int, types: int) -> np.ndarray:
    """`count` word ranks in [0, types): P(rank r) ∝ 1 / (r + ZIPF_SHIFT), drawn by inverting
    the continuous distribution's CDF (no search over `types` probabilities)."""
    u = rng.random(count, dtype=np.float32)
    span = np.float32(np.log((types + ZIPF_SHIFT) / ZIPF_SHIFT))
    ranks = (np.float32(ZIPF_SHIFT) * np.exp(u * span) - np.float32(ZIPF_SHIFT)).astype(np.int32)
    return np.minimum(ranks, types - 1, out=ranks)


def sentence_lengths(rng: np.random.Generator, pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) sentence lengths in words: log-normal of mean 25 and deviation 12,
    the target the source's × 1.05 with 10 % noise, both cut to 1..120."""
    sigma = np.sqrt(np.log1p((STD_WORDS / MEAN_WORDS) ** 2))
    mu = np.log(MEAN_WORDS) - sigma ** 2 / 2
    source = rng.lognormal(mu, sigma, pairs)
    target = source * TARGET_RATIO * np.exp(rng.normal(0.0, TARGET_NOISE, pairs))
    return tuple(np.clip(np.rint(x), 1, MAX_WORDS).astype(np.int64) for x in (source, target))


def sentences(rng: np.random.Generator, language_seed: int, words: np.ndarray) -> bytes:
    """Sentences of `words[k]` Zipf-drawn words each, one per line, as UTF-8 bytes."""
    text, starts, lengths = vocabulary(language_seed)
    ids = zipf_ranks(rng, int(words.sum()), len(starts))
    sizes, first = lengths[ids], starts[ids]
    ends = np.cumsum(sizes, dtype=np.int64)  # where each word ends in the output
    # The output's k-th byte is text[where[k]]: where steps by 1 within a word and jumps
    # to the next word's start after its space, so it is the cumsum of these steps.
    steps = np.ones(int(ends[-1]), np.int32)
    steps[0] = first[0]
    steps[ends[:-1]] = first[1:] - (first[:-1] + sizes[:-1] - 1)
    out = text[np.cumsum(steps, dtype=np.int32)]
    out[ends[np.cumsum(words) - 1] - 1] = ord("\n")  # each sentence's last space
    return out.tobytes()


def write_split(folder: str, split: str, pairs: int, rng: np.random.Generator) -> None:
    """`folder/{split}.en` and `folder/{split}.de`, `pairs` aligned lines each, written
    whole or not at all (`atomic_write`): a stopped run leaves no short file."""
    with contextlib.ExitStack() as stack:
        files = {lang: stack.enter_context(atomic_write(os.path.join(folder, f"{split}.{lang}")))
                 for lang in LANGUAGES}
        for start in range(0, pairs, BLOCK_PAIRS):
            lengths = sentence_lengths(rng, min(BLOCK_PAIRS, pairs - start))
            for (lang, language_seed), words in zip(LANGUAGES.items(), lengths):
                files[lang].write(sentences(rng, language_seed, words))


def write_wmt_like_corpus(folder: str, pairs: int, *, seed: int = 0) -> str:
    """Writes train.{en,de} (`pairs` lines) and validation.* and test.* (1000 lines each)
    into `folder`, source English and target German; the same seed, the same files.
    Returns `folder`, for `data_fields(dataset=f"folder:{folder}")`."""
    os.makedirs(folder, exist_ok=True)
    for k, (split, size) in enumerate((("train", pairs), ("validation", EVAL_PAIRS),
                                       ("test", EVAL_PAIRS))):
        write_split(folder, split, size, np.random.default_rng([seed, k]))
    return folder


def main(argv=None) -> None:
    import argparse
    import time

    parser = argparse.ArgumentParser(prog="python -m transformer_jax.benchmark.corpus",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="where train.{en,de}, validation.* and test.* go")
    parser.add_argument("--pairs", type=int, default=4_500_000,
                        help="training pairs (default: WMT14 EN-DE's 4.5 M)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs must be positive, got {args.pairs}")
    if os.path.exists(os.path.join(args.folder, "test.en")):  # the last file written
        parser.error(f"{args.folder} already holds a corpus (test.en); choose a new folder")
    start = time.perf_counter()
    try:
        write_wmt_like_corpus(args.folder, args.pairs, seed=args.seed)
    except OSError as error:
        raise SystemExit(f"error: cannot write the corpus: {error}") from None
    print(f"wrote {args.pairs:,} training pairs and {EVAL_PAIRS:,} each of validation and "
          f"test to {args.folder} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    with interrupt_in_one_line():
        main()
