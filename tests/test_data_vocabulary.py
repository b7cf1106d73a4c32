"""The run's tokenizer: trained once, its settings recorded, other settings refused."""

import json
import os
import random
import re
import subprocess
import sys
import warnings

import pytest
from num2words import num2words

from transformer_jax.data.sources import DataError
from transformer_jax.data.tokenizer import Tokenizer, train_tokenizer
from transformer_jax.data.vocabulary import (
    SETTINGS_VERSION,
    VOCABULARY_SETTINGS,
    get_tokenizer,
    tokenizer_path,
    training_sentences,
    vocabulary_settings,
)
from transformer_jax.run_config import data_fields

VOCAB_SIZE = 400
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_pairs(n: int = 1000, seed: int = 0) -> list[dict]:
    """German-English pairs with numbers in words, like the "numbers" dataset."""
    rng = random.Random(seed)
    nouns = [("Katzen", "cats"), ("Häuser", "houses"), ("Bäume", "trees"), ("Vögel", "birds")]
    pairs = []
    for _ in range(n):
        number = rng.randrange(1_000_000)
        de, en = rng.choice(nouns)
        pairs.append({"source": f"In der Stadt gibt es {num2words(number, lang='de')} {de}.",
                      "target": f"There are {num2words(number, lang='en')} {en} ({number})."})
    return pairs


PAIRS = make_pairs()


def config(**overrides):
    """A data group that trains on PAIRS (passed as train_pairs) and can read nothing:
    a call that wants the training split from the dataset fails with a DataError."""
    settings = dict(dataset="folder:/nonexistent/corpus", vocab_size=VOCAB_SIZE,
                    tokenizer_sentences=1500)
    return data_fields(**(settings | overrides))


def pieces(tokenizer: Tokenizer) -> list[str]:
    return [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]


def test_trains_once_then_loads(tmp_path):
    first = get_tokenizer(config(), str(tmp_path), PAIRS)
    assert sorted(os.listdir(tmp_path)) == ["tokenizer.model", "tokenizer.model.json"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = get_tokenizer(config(), str(tmp_path))  # reading the dataset would fail
    assert again.model_proto == first.model_proto
    assert Tokenizer.load(tokenizer_path(str(tmp_path))).model_proto == first.model_proto


def test_settings_file_records_every_vocabulary_setting(tmp_path):
    data = config(dataset="numbers", numbers_size="small")
    tokenizer = get_tokenizer(data, str(tmp_path), PAIRS)
    with open(tokenizer_path(str(tmp_path)) + ".json") as f:
        recorded = json.load(f)
    assert recorded == {**{key: data[key] for key in VOCABULARY_SETTINGS},
                        "actual_vocab_size": tokenizer.vocab_size, "version": SETTINGS_VERSION}


# A value other than config()'s for each recorded setting.
CHANGED = {"dataset": "folder:/elsewhere", "numbers_size": "full", "source_lang": "fr",
           "target_lang": "fr", "tokenizer_sentences": 800, "vocab_size": 420,
           "tokenizer_type": "unigram"}


def test_every_vocabulary_setting_has_a_changed_value():
    assert set(CHANGED) == set(VOCABULARY_SETTINGS)


@pytest.mark.parametrize("key", sorted(CHANGED))
def test_a_changed_setting_is_refused(tmp_path, key):
    numbers = {"dataset": "numbers", "numbers_size": "small"}  # so numbers_size counts
    base = config(**numbers)
    get_tokenizer(base, str(tmp_path), PAIRS)
    model = (tmp_path / "tokenizer.model").read_bytes()
    said = re.escape(f"trained with {key}={base[key]!r}, but config.data.{key}={CHANGED[key]!r}.")
    with pytest.raises(DataError, match=said):
        get_tokenizer(config(**numbers | {key: CHANGED[key]}), str(tmp_path), PAIRS)
    assert (tmp_path / "tokenizer.model").read_bytes() == model  # not retrained


def test_numbers_size_counts_for_numbers_only(tmp_path):
    assert "numbers_size" not in vocabulary_settings(config())
    get_tokenizer(config(numbers_size="small"), str(tmp_path), PAIRS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        get_tokenizer(config(numbers_size="full"), str(tmp_path))  # the folder's vocabulary


def test_requested_vocab_size_is_compared_so_a_capped_vocabulary_is_reused(tmp_path):
    with pytest.warns(UserWarning, match="supports only"):
        capped = get_tokenizer(config(vocab_size=100_000), str(tmp_path), PAIRS)
    assert capped.vocab_size < 100_000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        get_tokenizer(config(vocab_size=100_000), str(tmp_path))
    with pytest.raises(DataError, match=rf"config\.data\.vocab_size={capped.vocab_size}"):
        get_tokenizer(config(vocab_size=capped.vocab_size), str(tmp_path))


def test_training_sentences_are_capped_and_spread_over_the_split():
    sentences = list(training_sentences(PAIRS, 301))
    assert len(sentences) == 301
    assert sentences[:2] == [PAIRS[0]["source"], PAIRS[0]["target"]]
    used = [i for i, pair in enumerate(PAIRS) if pair["source"] in sentences]
    assert max(used) >= 0.9 * len(PAIRS)  # not only the first pairs
    everything = list(training_sentences(PAIRS, 10 * len(PAIRS)))
    assert everything == [side for pair in PAIRS for side in (pair["source"], pair["target"])]


def test_tokenizer_sentences_caps_what_trains_the_tokenizer(tmp_path):
    capped = get_tokenizer(config(tokenizer_sentences=300), str(tmp_path / "a"), PAIRS)
    alone = train_tokenizer(training_sentences(PAIRS, 300), VOCAB_SIZE)
    assert capped.model_proto == alone.model_proto
    whole = get_tokenizer(config(tokenizer_sentences=2 * len(PAIRS)), str(tmp_path / "b"), PAIRS)
    assert pieces(capped) != pieces(whole)


def test_capped_training_is_the_same_in_another_process(tmp_path):
    # SentencePiece's own sampling would give the same model twice in one process
    # but another one in the next (its generator is salted per process).
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for side, lang in (("source", "de"), ("target", "en")):
        (corpus / f"train.{lang}").write_text("".join(p[side] + "\n" for p in PAIRS))
    script = ("import sys\nfrom transformer_jax.data.vocabulary import get_tokenizer\n"
              "from transformer_jax.run_config import data_fields\n"
              "for kind in ('bpe', 'unigram'):\n"
              "    data = data_fields(dataset=sys.argv[1], vocab_size=400, tokenizer_type=kind,"
              " tokenizer_sentences=500)\n"
              "    get_tokenizer(data, f'{sys.argv[2]}/{kind}')\n")
    subprocess.run([sys.executable, "-c", script, f"folder:{corpus}", str(tmp_path / "other")],
                   cwd=REPO, check=True, timeout=300)
    for kind in ("bpe", "unigram"):
        data = config(dataset=f"folder:{corpus}", tokenizer_type=kind, tokenizer_sentences=500)
        here = get_tokenizer(data, str(tmp_path / "here" / kind))
        there = Tokenizer.load(tmp_path / "other" / kind / "tokenizer.model")
        assert there.model_proto == here.model_proto, kind


def test_version_1_settings_are_checked_as_far_as_they_go(tmp_path):
    get_tokenizer(config(), str(tmp_path), PAIRS)
    version_1 = {"vocab_size": VOCAB_SIZE, "model_type": "bpe", "actual_vocab_size": VOCAB_SIZE,
                 "max_sentences": None, "version": 1}
    (tmp_path / "tokenizer.model.json").write_text(json.dumps(version_1))
    with pytest.raises(DataError, match=r"tokenizer_type='bpe', but config\.data\.tokenizer_type"):
        get_tokenizer(config(tokenizer_type="unigram"), str(tmp_path))
    with pytest.warns(UserWarning, match=r"config\.data\.dataset, source_lang, target_lang, "
                                         r"tokenizer_sentences not checked.*version 1"):
        get_tokenizer(config(tokenizer_sentences=999), str(tmp_path))


def test_without_settings_file_only_the_size_is_checked(tmp_path):
    tokenizer = get_tokenizer(config(), str(tmp_path), PAIRS)
    os.remove(tmp_path / "tokenizer.model.json")  # a model copied alone
    with pytest.raises(DataError, match=rf"vocab_size={VOCAB_SIZE}, but config\.data\."
                                        rf"vocab_size=500"):
        get_tokenizer(config(vocab_size=500), str(tmp_path))
    with pytest.warns(UserWarning, match=r"tokenizer_type not checked.*json', which records "
                                         r"them, is missing"):
        loaded = get_tokenizer(config(), str(tmp_path))
    assert loaded.model_proto == tokenizer.model_proto


def test_a_training_error_names_the_config(tmp_path):
    with pytest.raises(DataError, match=r"config\.data\.vocab_size=270.*too small"):
        get_tokenizer(config(vocab_size=270), str(tmp_path), PAIRS)
    assert not os.listdir(tmp_path)  # nothing saved
