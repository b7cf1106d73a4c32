"""The run's tokenizer: trained once, its settings recorded, other settings refused."""

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import warnings

import pytest
from num2words import num2words
from sentencepiece import sentencepiece_model_pb2

from transformer_jax.data.numbers import Numbers
from transformer_jax.data.sources import DataError
from transformer_jax.data.tokenizer import Tokenizer, train_tokenizer
from transformer_jax.data.vocabulary import (
    CHECKPOINT_TOKENIZER_KEY,
    SETTINGS_VERSION,
    VOCABULARY_SETTINGS,
    get_tokenizer,
    other_tokenizer,
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


def write_folder(folder, pairs):
    """A folder corpus whose training split is `pairs`; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for side, lang in (("source", "de"), ("target", "en")):
        (folder / f"train.{lang}").write_text("".join(p[side] + "\n" for p in pairs))
    return folder


UNREADABLE = {}  # "folder": a corpus whose files are there but hold no UTF-8 text


@pytest.fixture(autouse=True, scope="module")
def unreadable_corpus(tmp_path_factory):
    """The folder `config()` names: the record describes its files (their sizes and
    modification times), but a call that reads them gets a DataError."""
    folder = tmp_path_factory.mktemp("unreadable")
    for lang in ("de", "en"):
        (folder / f"train.{lang}").write_bytes(b"\xff\xfe not UTF-8\n")
    UNREADABLE["folder"] = folder
    yield folder
    UNREADABLE.clear()


def config(**overrides):
    """A data group that trains on PAIRS (passed as train_pairs) and can read nothing:
    a call that wants the training split from the dataset fails with a DataError."""
    settings = dict(dataset=f"folder:{UNREADABLE['folder']}", vocab_size=VOCAB_SIZE,
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
    corpus = {"dataset": "numbers", "split": "train", "languages": ["de", "en"],
              "numbers_size": "small", "version": str(Numbers.VERSION)}
    sha256 = hashlib.sha256((tmp_path / "tokenizer.model").read_bytes()).hexdigest()
    assert recorded == {**{key: data[key] for key in VOCABULARY_SETTINGS},
                        "actual_vocab_size": tokenizer.vocab_size, "corpus": corpus,
                        "sha256": sha256, "version": SETTINGS_VERSION}


def test_the_record_names_a_folder_corpus_by_its_files(tmp_path):
    """A folder's training files by path, size and modification time (in nanoseconds)."""
    folder = write_folder(tmp_path / "corpus", PAIRS)
    get_tokenizer(config(dataset=f"folder:{folder}"), str(tmp_path / "run"))
    recorded = json.loads((tmp_path / "run" / "tokenizer.model.json").read_text())
    files = [[str(folder / f"train.{lang}"), (folder / f"train.{lang}").stat().st_size,
              (folder / f"train.{lang}").stat().st_mtime_ns] for lang in ("de", "en")]
    assert recorded["corpus"]["files"] == files
    assert files[1][1] == sum(len(p["target"].encode()) + 1 for p in PAIRS)


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
    # 900 pairs, 1,000 sentences: 500 pairs from all 900 (0, 1, 3, 5, 7, 9, 10, ...: i · 9 // 5),
    # not the first 500; 2,700 pairs and 600 sentences: every ninth, a whole stride.
    pairs = [{"source": f"s{i}", "target": f"t{i}"} for i in range(2700)]
    spread = list(training_sentences(pairs[:900], 1000))
    assert len(spread) == 1000 and spread[-2:] == ["s898", "t898"]
    assert spread[:8] == ["s0", "t0", "s1", "t1", "s3", "t3", "s5", "t5"]
    strided = list(training_sentences(pairs, 600))
    assert strided == [side for pair in pairs[::9] for side in (pair["source"], pair["target"])]
    assert list(training_sentences(pairs, 5)) == ["s0", "t0", "s900", "t900", "s1800"]


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
                                         r"tokenizer_sentences and the training data not "
                                         r"checked.*version 1"):
        get_tokenizer(config(tokenizer_sentences=999), str(tmp_path))


def test_without_settings_file_only_a_size_over_the_request_is_refused(tmp_path):
    """A model copied alone (or its record deleted, as a refusal advises to keep it): more
    pieces than config.data.vocab_size asks for is another vocabulary; fewer may be that
    request capped by a small corpus, which the record deleted to keep the model was
    refused for again."""
    tokenizer = get_tokenizer(config(), str(tmp_path), PAIRS)
    os.remove(tmp_path / "tokenizer.model.json")
    with pytest.raises(DataError, match=rf"vocab_size={VOCAB_SIZE}, but config\.data\."
                                        rf"vocab_size=300"):
        get_tokenizer(config(vocab_size=300), str(tmp_path))
    for requested in (VOCAB_SIZE, 16_000):
        with pytest.warns(UserWarning, match=r"config\.data\.dataset, .*, vocab_size, "
                                             r"tokenizer_type and the training data not checked"
                                             r".*json', which records them, is missing"):
            loaded = get_tokenizer(config(vocab_size=requested), str(tmp_path))
        assert loaded.model_proto == tokenizer.model_proto


def test_a_training_error_names_the_config(tmp_path):
    with pytest.raises(DataError, match=r"config\.data\.vocab_size=270.*too small"):
        get_tokenizer(config(vocab_size=270), str(tmp_path), PAIRS)
    assert not os.listdir(tmp_path)  # nothing saved


# --- the record vouches for the model: the training data, damage ------------------------------


def trained_on_folder(tmp_path, pairs=PAIRS):
    """(config, workdir, model bytes): a tokenizer trained on a folder corpus of `pairs`."""
    data = config(dataset=f"folder:{write_folder(tmp_path / 'corpus', pairs)}")
    workdir = str(tmp_path / "run")
    get_tokenizer(data, workdir)
    return data, workdir, (tmp_path / "run" / "tokenizer.model").read_bytes()


def test_a_replaced_corpus_is_refused_until_its_files_are_deleted(tmp_path):
    """The corpus replaced by other text: the old vocabulary is neither reused nor replaced
    (the run's checkpoints were trained on it); the error names the changed file. Deleting
    the two files as it says trains a vocabulary on the new text."""
    data, workdir, model = trained_on_folder(tmp_path)
    other = make_pairs(seed=1)
    write_folder(tmp_path / "corpus", other)
    with pytest.raises(DataError, match=r"training data changed since .*tokenizer\.model was "
                                        r"trained \(.*train\.de: [\d,]+ bytes of .*, now "
                                        r"[\d,]+ bytes of .*gives another vocabulary") as error:
        get_tokenizer(data, workdir)
    assert "delete " in str(error.value) and "\n" not in str(error.value)
    assert (tmp_path / "run" / "tokenizer.model").read_bytes() == model
    os.remove(tmp_path / "run" / "tokenizer.model")
    os.remove(tmp_path / "run" / "tokenizer.model.json")
    new = get_tokenizer(data, workdir)
    assert new.model_proto == train_tokenizer(training_sentences(other, 1500),
                                              VOCAB_SIZE).model_proto
    assert new.model_proto != model


def test_deleting_the_record_keeps_the_vocabulary_for_new_data(tmp_path):
    data, workdir, model = trained_on_folder(tmp_path)
    write_folder(tmp_path / "corpus", make_pairs(seed=1))
    os.remove(tmp_path / "run" / "tokenizer.model.json")
    with pytest.warns(UserWarning, match="and the training data not checked"):
        assert get_tokenizer(data, workdir).model_proto == model


def test_a_touched_corpus_keeps_the_model_and_records_the_files_anew(tmp_path):
    """Same text, another modification time: training again gives the same model, so it is
    kept, with a warning; the record names the files as they are now, and the next call
    trains nothing."""
    data, workdir, model = trained_on_folder(tmp_path)
    path = tmp_path / "corpus" / "train.en"
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    with pytest.warns(UserWarning, match=r"train\.en: .*training again gives the same model"):
        assert get_tokenizer(data, workdir).model_proto == model
    recorded = json.loads((tmp_path / "run" / "tokenizer.model.json").read_text())
    assert recorded["corpus"]["files"][1] == [str(path), path.stat().st_size,
                                              path.stat().st_mtime_ns]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_tokenizer(data, workdir, train_pairs=[]).model_proto == model  # no training


def cut_before_normalizer_spec(model: bytes) -> bytes:
    """The model without its normalizer spec, its last field: bytes that still parse."""
    parsed = sentencepiece_model_pb2.ModelProto.FromString(model)
    parsed.ClearField("normalizer_spec")
    assert model.startswith(parsed.SerializeToString())  # fields are written in order
    return parsed.SerializeToString()


@pytest.mark.parametrize("damage", ["empty", "half", "normalizer", "other model"])
def test_a_damaged_model_is_trained_again_when_its_record_names_it(tmp_path, damage):
    """Cut short (even where the bytes still parse), or replaced by another model: training
    again gives the model whose SHA-256 the record holds, so it is written back, with a
    warning naming the file."""
    data, workdir, model = trained_on_folder(tmp_path)
    path = tmp_path / "run" / "tokenizer.model"
    damaged = {"empty": b"", "half": model[:len(model) // 2],
               "normalizer": cut_before_normalizer_spec(model),
               "other model": train_tokenizer(training_sentences(PAIRS, 300),
                                              VOCAB_SIZE).model_proto}[damage]
    path.write_bytes(damaged)
    said = "is not the model" if damage == "other model" else "is damaged"
    with pytest.warns(UserWarning, match=rf"tokenizer\.model {said} .*training again gives "
                                         r"the same model"):
        assert get_tokenizer(data, workdir).model_proto == model
    assert path.read_bytes() == model
    assert sorted(os.listdir(path.parent)) == ["tokenizer.model", "tokenizer.model.json"]


def test_a_damaged_model_without_a_record_is_one_error_naming_it(tmp_path):
    data, workdir, model = trained_on_folder(tmp_path)
    os.remove(tmp_path / "run" / "tokenizer.model.json")
    (tmp_path / "run" / "tokenizer.model").write_bytes(model[:100])
    with pytest.raises(DataError, match=r"tokenizer\.model is damaged \(not a SentencePiece "
                                        r"model: 100 bytes.*no record names the model"):
        get_tokenizer(data, workdir)


def test_a_damaged_model_whose_data_changed_is_refused(tmp_path):
    """Training again on other text gives another model than the record names: an error
    that says to restore the model (deleting only the record cannot help)."""
    data, workdir, model = trained_on_folder(tmp_path)
    (tmp_path / "run" / "tokenizer.model").write_bytes(model[:-10])
    write_folder(tmp_path / "corpus", make_pairs(seed=2))
    with pytest.raises(DataError, match=r"tokenizer\.model is damaged .*another vocabulary.*"
                                        r"restore it from a copy"):
        get_tokenizer(data, workdir)


@pytest.mark.parametrize("record", ["cut", "version 2"])
def test_a_damaged_or_version_2_record_is_written_anew_when_the_model_comes_out_again(
        tmp_path, record):
    """A record cut short, or one of version 2 (settings only): the model is trained again;
    it is the same, so the record is written anew, whole and of this version."""
    data, workdir, model = trained_on_folder(tmp_path)
    path = tmp_path / "run" / "tokenizer.model.json"
    whole = json.loads(path.read_text())
    if record == "cut":
        path.write_text(path.read_text()[:40])
        said = r"tokenizer\.model\.json is damaged \(not whole JSON"
    else:
        path.write_text(json.dumps({key: whole[key] for key in (*vocabulary_settings(data),
                                                                 "actual_vocab_size")}
                                   | {"version": 2}))
        said = r"tokenizer\.model\.json is from version 2, which did not record the training"
    with pytest.warns(UserWarning, match=said + ".*training again gives the same model"):
        assert get_tokenizer(data, workdir).model_proto == model
    assert json.loads(path.read_text()) == whole


def test_a_version_2_record_of_a_replaced_corpus_is_refused(tmp_path):
    """The reported fault in a workdir of the version before: its record names no files,
    the corpus was replaced; training again tells, and the old vocabulary is refused."""
    data, workdir, model = trained_on_folder(tmp_path)
    path = tmp_path / "run" / "tokenizer.model.json"
    whole = json.loads(path.read_text())
    path.write_text(json.dumps({key: whole[key] for key in vocabulary_settings(data)}
                               | {"version": 2}))
    write_folder(tmp_path / "corpus", make_pairs(seed=1))
    with pytest.raises(DataError, match="version 2.*another vocabulary"):
        get_tokenizer(data, workdir)
    assert (tmp_path / "run" / "tokenizer.model").read_bytes() == model


def test_one_folder_written_another_way_is_the_same_dataset(tmp_path, monkeypatch):
    """A run trained with folder:/abs/corpus resumed with folder:corpus (or corpus/, or
    ~/corpus) was refused as another dataset, with the advice to delete its tokenizer."""
    folder = UNREADABLE["folder"]
    get_tokenizer(config(dataset=f"folder:{folder}"), str(tmp_path), PAIRS)
    model = (tmp_path / "tokenizer.model").read_bytes()
    monkeypatch.chdir(folder.parent)
    monkeypatch.setenv("HOME", str(folder.parent))
    for written in (f"folder:{folder.name}", f"folder:{folder}/", f"folder:~/{folder.name}",
                    f"folder:./{folder.name}/../{folder.name}"):
        assert get_tokenizer(config(dataset=written), str(tmp_path)).sha256 == \
            hashlib.sha256(model).hexdigest()
    other = folder.parent / "other"
    other.mkdir()
    with pytest.raises(DataError, match=re.escape("trained with dataset=")):
        get_tokenizer(config(dataset=f"folder:{other}"), str(tmp_path), PAIRS)


def test_an_empty_training_split_is_named_not_the_vocabulary(tmp_path):
    with pytest.raises(DataError) as error:
        get_tokenizer(config(), str(tmp_path), [])
    assert str(error.value) == (f"the training split of folder:{UNREADABLE['folder']} has no "
                                f"pairs with text on both sides (pairs with an empty side are "
                                f"skipped); the tokenizer is trained on it")


def test_a_checkpoint_of_another_tokenizer_is_named(tmp_path):
    """A checkpoint's metadata names its tokenizer's SHA-256: another one is refused in one
    line naming both; the same one, or none (an older checkpoint), is not."""
    tokenizer = get_tokenizer(config(), str(tmp_path), PAIRS)
    assert other_tokenizer({}, tokenizer) is None
    assert other_tokenizer({CHECKPOINT_TOKENIZER_KEY: tokenizer.sha256}, tokenizer) is None
    other = "0123456789ab" + tokenizer.sha256[12:]
    assert other_tokenizer({CHECKPOINT_TOKENIZER_KEY: other}, tokenizer) == (
        f"was trained with another tokenizer (SHA-256 0123456789ab...) than the workdir's "
        f"tokenizer.model ({tokenizer.sha256[:12]}...); put back the one it was trained with")
