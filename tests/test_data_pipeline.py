"""Batches: packed rows equal their pairs run alone, exact resume, sharding, eval batches.

The data is a small folder corpus (numbers in words), prepared once per module.
"""

import collections
import itertools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from num2words import num2words

from transformer_jax.data.pipeline import eval_batches, train_dataset
from transformer_jax.data.prepared import prepare
from transformer_jax.data.sources import DataError
from transformer_jax.model import Transformer
from transformer_jax.model_config import get_model_config
from transformer_jax.run_config import data_fields


def number_pairs(numbers):
    return [{"source": num2words(n, lang="de"), "target": num2words(n, lang="en")}
            for n in numbers]


PAIRS = number_pairs(range(0, 3000, 7))  # the training split: 429 pairs
VALIDATION = number_pairs(range(3, 3000, 75))  # 40 pairs, none of them in PAIRS
LENGTHS = dict(max_source_length=24, max_target_length=20)  # rows of several pairs


def write_corpus(folder, splits):
    """The `folder:` layout of `splits`, with a test split of 5 validation pairs unless
    `splits` names one (without it, preparing warns that evaluate.py will need one)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, pairs in {"test": VALIDATION[:5], **splits}.items():
        for lang, side in (("de", "source"), ("en", "target")):
            (folder / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs))
    return data_fields(dataset=f"folder:{folder}", vocab_size=400)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """(tokenizer, {"train": 429 pairs, "validation": 40 pairs}), prepared once."""
    root = tmp_path_factory.mktemp("pipeline")
    config = write_corpus(root / "corpus", {"train": PAIRS, "validation": VALIDATION})
    return prepare(config, str(root / "run"), log=lambda line: None)


@pytest.fixture(scope="module")
def tokenizer(prepared):
    return prepared[0]


@pytest.fixture(scope="module")
def train(prepared):
    return prepared[1]["train"]


def batches(source, n, *, seed=0, batch_size=4, **kwargs):
    ds = train_dataset(source, batch_size=batch_size, seed=seed, **{**LENGTHS, **kwargs})
    return list(itertools.islice(iter(ds), n))


def segments(batch, side):
    """(row, segment id) -> that segment's token ids, from a packed batch."""
    out = {}
    for row in range(batch[side].shape[0]):
        ids_T, seg_T = batch[side][row], batch[f"{side}_segmentation"][row]
        for s in sorted(set(seg_T.tolist()) - {0}):
            out[row, s] = ids_T[seg_T == s].tolist()
    return out


def encoded(tokenizer, pair, lengths=LENGTHS):
    """The pair's ids, EOS-terminated and cut to the rows: computed here, not read from disk."""
    source = tokenizer.encode(pair["source"], add_eos=True)[:lengths["max_source_length"]]
    target = tokenizer.encode(pair["target"], add_eos=True)[:lengths["max_target_length"]]
    return tuple(source), tuple(target)


def test_no_pair_that_fits_is_an_error_not_a_hang(tmp_path, train, tokenizer):
    """too_long="drop" with every pair too long for the rows, or an empty split: DataError."""
    with pytest.raises(DataError, match=f"all {len(PAIRS)} training pairs were dropped"):
        train_dataset(train, batch_size=4, max_source_length=1,  # EOS alone
                      max_target_length=1, too_long="drop")
    with pytest.raises(ValueError, match="too_long must be one of"):
        train_dataset(train, batch_size=4, too_long="cut", **LENGTHS)
    config = write_corpus(tmp_path / "corpus", {"train": PAIRS[:30], "validation": []})
    _, splits = prepare(config, str(tmp_path / "run"), log=lambda line: None)
    assert len(splits["validation"]) == 0
    with pytest.raises(DataError, match="the training split is empty"):
        train_dataset(splits["validation"], batch_size=4, **LENGTHS)


def test_drop_leaves_out_exactly_the_pairs_that_do_not_fit(train, tokenizer):
    """With rows of 6 + 9 tokens, "drop" yields whole pairs only, and every one that fits."""
    lengths = dict(max_source_length=6, max_target_length=9)
    full = [encoded(tokenizer, p, dict(max_source_length=99, max_target_length=99))
            for p in PAIRS]
    fits = {pair for pair in full if len(pair[0]) <= 6 and len(pair[1]) <= 9}
    assert 50 < len(fits) < len(PAIRS) - 50  # both kinds, many of each
    seen = collections.Counter()
    for batch in batches(train, 200, batch_size=2, too_long="drop", **lengths):
        sources, targets = segments(batch, "inputs"), segments(batch, "targets")
        seen.update((tuple(sources[k]), tuple(targets[k])) for k in sources)
    assert set(seen) == fits  # 200 batches are more than an epoch of them
    assert min(seen.values()) >= 1


def test_packed_rows_hold_whole_pairs_with_restarting_positions(train, tokenizer):
    """Every segment is one tokenized pair, the same segment id on both sides; positions restart."""
    expected = {encoded(tokenizer, p) for p in PAIRS}
    batch = batches(train, 1)[0]
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
        "inputs": ((4, 24), np.int32), "inputs_segmentation": ((4, 24), np.int32),
        "inputs_positions": ((4, 24), np.int32), "targets": ((4, 20), np.int32),
        "targets_segmentation": ((4, 20), np.int32), "targets_positions": ((4, 20), np.int32)}
    sources, targets = segments(batch, "inputs"), segments(batch, "targets")
    assert sources.keys() == targets.keys() and len(sources) > 4  # several pairs per row
    for key in sources:
        assert (tuple(sources[key]), tuple(targets[key])) in expected
    for side in ("inputs", "targets"):
        seg, pos = batch[f"{side}_segmentation"], batch[f"{side}_positions"]
        for row in range(4):
            for s in set(seg[row].tolist()) - {0}:
                np.testing.assert_array_equal(pos[row][seg[row] == s],
                                              np.arange(np.sum(seg[row] == s)))
        assert np.all(batch[side][seg == 0] == 0)


def test_packed_row_logits_equal_each_pair_alone(train, tokenizer):
    """The model's logits on a packed row equal those of each pair run alone (1e-5)."""
    batch = jax.tree.map(jnp.asarray, batches(train, 1)[0])
    config = get_model_config("tiny", vocab_size=tokenizer.vocab_size)
    model = Transformer(config)
    variables = jax.jit(model.init)(jax.random.key(0), batch["inputs"][:1], batch["targets"][:1])
    packed_BTV = jax.jit(model.apply)(
        variables, batch["inputs"], batch["targets"],
        inputs_segmentation=batch["inputs_segmentation"],
        targets_segmentation=batch["targets_segmentation"],
        inputs_positions=batch["inputs_positions"], targets_positions=batch["targets_positions"])
    sources, targets = segments(batch, "inputs"), segments(batch, "targets")
    alone = jax.jit(model.apply)  # each pair alone, padded to the row's lengths: one compile
    for (row, s), target in targets.items():
        source_1S = np.zeros((1, 24), np.int32)
        source_1S[0, : len(sources[row, s])] = sources[row, s]
        target_1T = np.zeros((1, 20), np.int32)
        target_1T[0, : len(target)] = target
        alone_1TV = alone(variables, source_1S, target_1T)
        in_row = np.asarray(batch["targets_segmentation"][row] == s)
        np.testing.assert_allclose(packed_BTV[row][in_row], alone_1TV[0, : len(target)],
                                   atol=1e-5, rtol=1e-5)


def test_order_is_fixed_by_the_seed(train):
    a, b, c = (batches(train, 3, seed=s) for s in (0, 0, 1))
    for x, y in zip(a, b):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
    assert any(not np.array_equal(x["targets"], z["targets"]) for x, z in zip(a, c))


def test_epochs_cover_every_pair_and_reshuffle(prepared, tokenizer):
    """Epoch after epoch every pair comes back once, each epoch in a new order.

    One row per batch, so the segments in row order are the stream's order.
    """
    validation = prepared[1]["validation"]
    rows = batches(validation, 100, batch_size=1)
    targets = [segments(b, "targets")[0, s]
               for b in rows for s in range(1, 1 + int(b["targets_segmentation"].max()))]
    assert len(targets) >= 120  # 3 epochs of 40 pairs
    targets = [tuple(t) for t in targets]
    expected = sorted(encoded(tokenizer, p)[1] for p in VALIDATION)
    epochs = [targets[k:k + 40] for k in (0, 40, 80)]
    for epoch in epochs:
        assert sorted(epoch) == expected
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]


@pytest.mark.parametrize("skip", [5, 200])  # inside the first chunk; past it
def test_iterator_state_resumes_exactly(train, skip):
    """Save the state after k batches, restore it in a new pipeline: the same next batches."""
    def make():
        return iter(train_dataset(train, batch_size=4, seed=3, **LENGTHS))

    first = make()
    for _ in range(skip):
        next(first)
    state = json.loads(json.dumps(first.get_state()))  # it must survive a checkpoint
    assert state["offset"] != 0  # mid-chunk: the packer's own offset is what resumes
    expected = [next(first) for _ in range(3)]
    resumed = make()
    resumed.set_state(state)
    for want in expected:
        got = next(resumed)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    if skip > 100:  # 200 batches of about 7 pairs are past the first 1024-index chunk
        start = iter(train_dataset(train, batch_size=4, **LENGTHS)).get_state()
        assert state["chunks"] != start["chunks"]


def test_shards_train_on_disjoint_pairs(train, tokenizer):
    """Shard k of 3 packs only the pairs k::3, and every one of them."""
    everything = [encoded(tokenizer, p) for p in PAIRS]
    for k in range(3):
        mine = everything[k::3]
        seen = set()
        for batch in batches(train, 40, shard_index=k, shard_count=3):
            sources, targets = segments(batch, "inputs"), segments(batch, "targets")
            seen |= {(tuple(sources[key]), tuple(targets[key])) for key in sources}
        assert seen == set(mine)  # 40 batches of about 7 pairs are more than 143


def test_shards_drop_only_their_own_pairs_that_do_not_fit(train, tokenizer):
    """With too_long="drop", shard k of 3 packs the pairs k::3 that fit the rows (6 + 9
    tokens), and every one of them: the shards are cut first, as without dropping."""
    everything = [encoded(tokenizer, p, dict(max_source_length=99, max_target_length=99))
                  for p in PAIRS]
    lengths = dict(max_source_length=6, max_target_length=9)
    for k in range(3):
        fits = {pair for pair in everything[k::3] if len(pair[0]) <= 6 and len(pair[1]) <= 9}
        seen = set()
        for batch in batches(train, 60, batch_size=2, too_long="drop", shard_index=k,
                             shard_count=3, **lengths):
            sources, targets = segments(batch, "inputs"), segments(batch, "targets")
            seen |= {(tuple(sources[key]), tuple(targets[key])) for key in sources}
        assert seen == fits


@pytest.mark.parametrize("shard_count", [1, 2, 3])
def test_eval_batches_hold_every_example_once(prepared, tokenizer, shard_count):
    """Padded, unpacked, each example exactly once across shards, padding rows marked."""
    validation = prepared[1]["validation"]
    lengths = dict(max_source_length=24, max_target_length=8)  # some targets are cut
    per_shard = [list(eval_batches(validation, batch_size=5, shard_index=k,
                                   shard_count=shard_count, **lengths))
                 for k in range(shard_count)]
    assert len({len(b) for b in per_shard}) == 1  # every process runs the same number
    assert len(per_shard[0]) == math.ceil(math.ceil(40 / shard_count) / 5)
    seen, cut = [], 0
    for k, shard in enumerate(per_shard):
        for batch in shard:
            assert batch["inputs"].shape == (5, 24) and batch["targets"].shape == (5, 8)
            assert batch["inputs"].dtype == batch["targets"].dtype == np.int32
            for row in range(5):
                if not batch["example_mask"][row]:
                    assert batch["index"][row] == -1 and not batch["targets"][row].any()
                    continue
                i = int(batch["index"][row])
                assert i % shard_count == k
                seen.append(i)
                source, target = encoded(tokenizer, VALIDATION[i], lengths)
                cut += len(tokenizer.encode(VALIDATION[i]["target"])) >= 8
                assert batch["inputs"][row].tolist() == list(source) + [0] * (24 - len(source))
                assert batch["targets"][row].tolist() == list(target) + [0] * (8 - len(target))
    assert sorted(seen) == list(range(40))
    assert cut > 0


def test_eval_batches_of_one_row_end_with_padding_alone_where_a_shard_is_shorter(prepared):
    """40 pairs in 3 shards of 14, 13 and 13 pairs, one row per batch: every shard runs 14
    batches (the longest shard's), each pair in one; shards 1 and 2 end on a batch that
    is padding alone, its row masked out."""
    validation = prepared[1]["validation"]
    for k in range(3):
        shard = list(eval_batches(validation, batch_size=1, shard_index=k, shard_count=3,
                                  **LENGTHS))
        mine = list(range(k, 40, 3))
        assert len(shard) == 14
        assert [int(b["index"][0]) for b in shard] == mine + [-1] * (14 - len(mine))
        assert [bool(b["example_mask"][0]) for b in shard] == [True] * len(mine) + [False] * (
            14 - len(mine))
        for batch in shard[len(mine):]:
            assert not batch["inputs"].any() and not batch["targets"].any()
