"""Batches: packed rows equal their pairs run alone, exact resume, sharding, eval batches."""

import collections
import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from num2words import num2words

from transformer_jax.data.pipeline import Tokenize, eval_batches, train_dataset
from transformer_jax.data.sources import DataError
from transformer_jax.data.tokenizer import train_tokenizer
from transformer_jax.token_ids import EOS_ID
from transformer_jax.model import Transformer
from transformer_jax.model_config import get_model_config

PAIRS = [{"source": num2words(n, lang="de"), "target": num2words(n, lang="en")}
         for n in range(0, 3000, 7)]
LENGTHS = dict(max_source_length=24, max_target_length=20)  # rows of several pairs


@pytest.fixture(scope="module")
def tokenizer():
    sentences = [p["source"] for p in PAIRS] + [p["target"] for p in PAIRS]
    return train_tokenizer(sentences, vocab_size=400)


def batches(tokenizer, n, *, seed=0, pairs=PAIRS, batch_size=4):
    ds = train_dataset(pairs, tokenizer, batch_size=batch_size, seed=seed, num_threads=1,
                       **LENGTHS)
    return list(itertools.islice(iter(ds), n))


def segments(batch, side):
    """(row, segment id) -> that segment's token ids, from a packed batch."""
    out = {}
    for row in range(batch[side].shape[0]):
        ids_T, seg_T = batch[side][row], batch[f"{side}_segmentation"][row]
        for s in sorted(set(seg_T.tolist()) - {0}):
            out[row, s] = ids_T[seg_T == s].tolist()
    return out


def encoded(tokenizer, pair):
    ids = Tokenize(tokenizer, **LENGTHS)(pair)
    return tuple(ids["inputs"].tolist()), tuple(ids["targets"].tolist())


def test_tokenize_cuts_or_drops_long_pairs(tokenizer):
    """Each side ends in EOS; too long: cut to the limit, or the pair is dropped."""
    pair = {"source": "dreihundertzweiundvierzig", "target": "three hundred and forty-two"}
    full = Tokenize(tokenizer, 100, 100)(pair)
    assert full["inputs"][-1] == EOS_ID and full["targets"][-1] == EOS_ID
    assert full["inputs"].tolist() == tokenizer.encode(pair["source"]) + [EOS_ID]
    cut = Tokenize(tokenizer, 3, 2)(pair)
    assert cut["inputs"].tolist() == full["inputs"][:3].tolist()
    assert cut["targets"].tolist() == full["targets"][:2].tolist()
    assert Tokenize(tokenizer, 3, 2, "drop")(pair) is None
    assert Tokenize(tokenizer, 100, 100, "drop")(pair)["targets"].tolist() == full["targets"].tolist()


def test_no_pair_that_fits_is_an_error_not_a_hang(tokenizer):
    """too_long="drop" with every pair too long for the rows: a DataError after one epoch."""
    dataset = train_dataset(PAIRS, tokenizer, batch_size=4, max_source_length=1,  # EOS alone
                            max_target_length=1, too_long="drop", num_threads=1)
    with pytest.raises(DataError, match=f"all {len(PAIRS)} examples of an epoch were dropped"):
        next(iter(dataset))
    with pytest.raises(DataError, match="the training split is empty"):
        train_dataset([], tokenizer, batch_size=4, **LENGTHS)


def test_packed_rows_hold_whole_pairs_with_restarting_positions(tokenizer):
    """Every segment is one tokenized pair, the same segment id on both sides; positions restart."""
    expected = {encoded(tokenizer, p) for p in PAIRS}
    batch = batches(tokenizer, 1)[0]
    assert {k: v.shape for k, v in batch.items()} == {
        "inputs": (4, 24), "inputs_segmentation": (4, 24), "inputs_positions": (4, 24),
        "targets": (4, 20), "targets_segmentation": (4, 20), "targets_positions": (4, 20)}
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


def test_packed_row_logits_equal_each_pair_alone(tokenizer):
    """The model's logits on a packed row equal those of each pair run alone (1e-5)."""
    batch = jax.tree.map(jnp.asarray, batches(tokenizer, 1)[0])
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


def test_order_is_fixed_by_the_seed(tokenizer):
    a, b, c = (batches(tokenizer, 3, seed=s) for s in (0, 0, 1))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x["targets"], y["targets"])
    assert any(not np.array_equal(x["targets"], z["targets"]) for x, z in zip(a, c))


def test_epochs_cover_every_pair_and_reshuffle(tokenizer):
    """Epoch after epoch every pair comes back, each epoch in a new order."""
    pairs = PAIRS[:40]
    rows = batches(tokenizer, 60, pairs=pairs, batch_size=2)
    targets = [tuple(t) for b in rows for t in segments(b, "targets").values()][:120]
    counts = collections.Counter(targets)
    # 120 segments are 3 epochs; packing may hold a pair back by a row or two.
    assert set(counts) == {encoded(tokenizer, p)[1] for p in pairs}
    assert 2 <= min(counts.values()) and max(counts.values()) <= 4
    first_seen = list(dict.fromkeys(targets[:40]))
    assert first_seen != list(dict.fromkeys(targets[40:80]))


def test_iterator_state_resumes_exactly(tokenizer):
    """Save the state after k batches, restore it in a new pipeline: the same next batches."""
    make = lambda: iter(train_dataset(PAIRS, tokenizer, batch_size=4, seed=3, num_threads=1,
                                      **LENGTHS))
    first = make()
    for _ in range(5):
        next(first)
    state = json.loads(json.dumps(first.get_state()))  # it must survive a checkpoint
    expected = [next(first) for _ in range(3)]
    resumed = make()
    resumed.set_state(state)
    for want in expected:
        got = next(resumed)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


@pytest.mark.parametrize("shard_count", [1, 2])
def test_eval_batches_hold_every_example_once(tokenizer, shard_count):
    """Padded, unpacked, each example exactly once across shards, padding rows marked."""
    pairs = PAIRS[:23]
    per_shard = [list(eval_batches(pairs, tokenizer, batch_size=5, shard_index=k,
                                   shard_count=shard_count, **LENGTHS))
                 for k in range(shard_count)]
    assert len({len(b) for b in per_shard}) == 1  # every process runs the same number
    seen = []
    for batch in itertools.chain.from_iterable(per_shard):
        assert batch["inputs"].shape == (5, 24) and batch["targets"].shape == (5, 20)
        for row in range(5):
            if not batch["example_mask"][row]:
                assert batch["index"][row] == -1 and not batch["targets"][row].any()
                continue
            i = int(batch["index"][row])
            seen.append(i)
            source, target = encoded(tokenizer, pairs[i])
            assert batch["inputs"][row].tolist() == list(source) + [0] * (24 - len(source))
            assert batch["targets"][row].tolist() == list(target) + [0] * (20 - len(target))
    assert sorted(seen) == list(range(23))
