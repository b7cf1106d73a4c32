"""What the model sees: examples as text and ids, and length statistics of a split."""

import dataclasses
import unicodedata

import numpy as np
import tqdm

from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.token_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

PERCENTILES = (50, 90, 99, 100)


@dataclasses.dataclass
class SplitStatistics:
    pairs: int  # pairs scanned (empty ones already skipped)
    split_pairs: int  # pairs in the split: more than `pairs` when --max_pairs cut the scan
    skipped_empty: int  # pairs with an empty or blank side
    source_lengths: np.ndarray  # tokens per source sentence, EOS included
    target_lengths: np.ndarray
    max_source_length: int
    max_target_length: int
    too_long: str  # what happens to longer pairs: "truncate" or "drop"

    @property
    def over_limit(self) -> int:
        """Pairs with a side longer than its row: cut or dropped in training."""
        return int(np.sum((self.source_lengths > self.max_source_length)
                          | (self.target_lengths > self.max_target_length)))


def split_statistics(split, tokenizer: Tokenizer, data_config,
                     max_pairs: int | None = None) -> SplitStatistics:
    """Token lengths of (up to `max_pairs` of) a loaded split."""
    pairs = split.pairs[:max_pairs]
    source, target = [], []
    for pair in tqdm.tqdm(pairs, desc="scanning", unit="pair", leave=False):
        source.append(len(tokenizer.encode(pair["source"], add_eos=True)))
        target.append(len(tokenizer.encode(pair["target"], add_eos=True)))
    return SplitStatistics(len(pairs), len(split), split.skipped_empty, np.asarray(source),
                           np.asarray(target), data_config.max_source_length,
                           data_config.max_target_length, data_config.too_long)


def format_example(number: int, pair, tokenizer: Tokenizer) -> str:
    lines = [f"example {number}"]
    for side in ("source", "target"):
        ids = tokenizer.encode(pair[side], add_eos=True)
        pieces = " ".join(tokenizer.id_to_piece(i) for i in ids)
        lines += [f"  {side:<7} {_visible(pair[side])}", f"  {'ids':<7} {ids}",
                  f"  {'pieces':<7} {_visible(pieces)}"]
    return "\n".join(lines)


def _visible(text: str) -> str:
    """`text` with its control characters (a tab, a carriage return, an escape) written as
    Python writes them, \\t or \\x1b: in the corpus, not acted on by the terminal."""
    return "".join(repr(c)[1:-1] if unicodedata.category(c) == "Cc" else c for c in text)


def format_statistics(stats: SplitStatistics) -> str:
    header = "  tokens   " + " ".join(f"{f'p{p}':>6}" for p in PERCENTILES) + "    mean"
    counted = f"{stats.split_pairs:,} pairs; {stats.skipped_empty:,} skipped (an empty side)"
    if stats.pairs < stats.split_pairs:
        counted += f"; statistics of the first {stats.pairs:,} (--max_pairs)"
    lines = [counted] + [header] * bool(stats.pairs)
    for name, lengths in (("source", stats.source_lengths), ("target", stats.target_lengths)):
        if len(lengths):
            # A length some sentence has: the least that p % of them do not exceed (NumPy's
            # default interpolates between two, and int() cut 16.6 to 16).
            values = " ".join(f"{int(np.percentile(lengths, p, method='inverted_cdf')):>6}"
                              for p in PERCENTILES)
            lines.append(f"  {name:<8} {values} {lengths.mean():>7.2f}")
    if stats.pairs:
        tokens = (stats.source_lengths.sum() + stats.target_lengths.sum()) / stats.pairs
        share = 100 * stats.over_limit / stats.pairs
        action = "cut to fit" if stats.too_long == "truncate" else "dropped"
        lines += [f"  tokens per pair (both sides): {tokens:.2f}",
                  f"  longer than max_source_length={stats.max_source_length} or "
                  f"max_target_length={stats.max_target_length}: {stats.over_limit:,} "
                  f"({share:.2f}%), {action} in training"]
    return "\n".join(lines)


def format_tokenizer(tokenizer: Tokenizer, path: str) -> str:
    return (f"tokenizer {path}: {tokenizer.vocab_size:,} pieces; ids PAD {PAD_ID}, "
            f"EOS {EOS_ID}, BOS {BOS_ID}, UNK {UNK_ID}")
