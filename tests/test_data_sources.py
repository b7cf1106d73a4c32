"""Sources: a user's folder (and every bad input), TFDS through mock data, clear errors."""

import errno
import io
import os
import signal

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from transformer_jax.data.pipeline import eval_batches, train_dataset
from transformer_jax.data.prepared import prepare
from transformer_jax.data import sources
from transformer_jax.data.sources import (DataError, decode_lines, describe_split, load_split,
                                          moved_folder, translation_datasets)
from transformer_jax.token_ids import EOS_ID
from transformer_jax.run_config import data_fields


def data_config(**overrides) -> ml_collections.ConfigDict:
    return data_fields(**{"numbers_size": "small", **overrides})


def write_split(folder, split, de_lines, en_lines, *, end="\n"):
    for lang, lines in (("de", de_lines), ("en", en_lines)):
        (folder / f"{split}.{lang}").write_bytes("".join(line + end for line in lines).encode())


def test_the_three_forms_of_a_dataset_name():
    """config.data.dataset is "numbers", "tfds:NAME" or "folder:PATH" (the path may hold a
    colon); anything else, an empty NAME or PATH among them, is a DataError naming the forms,
    from the name alone (check_config asks before any workdir is made)."""
    assert sources.dataset_kind("numbers") == ("numbers", "")
    assert sources.dataset_kind("tfds:wmt14_translate/de-en") == ("tfds", "wmt14_translate/de-en")
    assert sources.dataset_kind("folder:/data/a:b") == ("folder", "/data/a:b")
    for name in ("", "tfds", "tfds:", "folder:", "numbers:small", "wmt14", "Folder:x"):
        with pytest.raises(DataError, match=r"^unknown dataset .*; use \"numbers\", "):
            sources.dataset_kind(name)
        with pytest.raises(DataError, match=r"^unknown dataset "):
            describe_split(data_config(dataset=name), "train")


# --- folder:PATH --------------------------------------------------------------------------


def test_folder_pairs_in_order_in_either_direction(tmp_path):
    """Lines pair up by number; source_lang/target_lang choose the direction."""
    write_split(tmp_path, "train", ["eins", "zwei", "drei"], ["one", "two", "three"])
    de_en = load_split(data_config(dataset=f"folder:{tmp_path}"), "train").pairs
    assert de_en == [{"source": "eins", "target": "one"}, {"source": "zwei", "target": "two"},
                     {"source": "drei", "target": "three"}]
    en_de = load_split(data_config(dataset=f"folder:{tmp_path}", source_lang="en",
                                   target_lang="de"), "train").pairs
    assert en_de[1] == {"source": "two", "target": "zwei"}


def test_folder_keeps_spaces_and_only_splits_on_newline(tmp_path):
    """CRLF endings are removed; inner spaces and U+2028 stay inside their line."""
    write_split(tmp_path, "test", ["a  b", "x\u2028y"], [" c", "z"], end="\r\n")
    pairs = load_split(data_config(dataset=f"folder:{tmp_path}"), "test").pairs
    assert pairs == [{"source": "a  b", "target": " c"}, {"source": "x\u2028y", "target": "z"}]


def test_decode_lines_splits_on_newline_only_and_drops_a_bom():
    """Only "\\n" (or "\\r\\n") ends a line; a leading BOM goes, a later U+FEFF stays."""
    text = "\ufeffa\x0bb\r\nc\x1cd\x85e\n\nf\u2029\ufeff\n"
    assert decode_lines(text.encode(), "x") == ["a\x0bb", "c\x1cd\x85e", "", "f\u2029\ufeff"]


def test_a_bom_is_dropped_only_at_the_start_of_the_text():
    """A chunk that starts at line 1 loses its BOM; one that starts at a later line (a line
    typed in a terminal) keeps it, as a pipe's whole text would."""
    data = "\ufeffzwei\n".encode()
    assert decode_lines(data, "stdin") == ["zwei"]
    assert decode_lines(data, "stdin", first_line=2) == ["\ufeffzwei"]
    assert decode_lines(b"a\n" + data, "stdin") == ["a", "\ufeffzwei"]
    assert decode_lines(b"no final newline", "x") == ["no final newline"]
    with pytest.raises(DataError, match=r"^in\.txt, line 3: not valid UTF-8 \(invalid start "
                                        r"byte at byte 3 of the line\)$"):
        decode_lines(b"a\nb\nbc\xffd\n", "in.txt")
    with pytest.raises(DataError, match=r"^in\.txt, line 1: .* at byte 1 of the line\)$"):
        decode_lines(b"\xff\n", "in.txt")


def test_folder_skips_pairs_with_an_empty_side(tmp_path):
    """Empty or blank lines on either side drop the pair, and the drops are counted."""
    write_split(tmp_path, "train", ["eins", "", "drei", "vier"], ["one", "two", " \t", "four"])
    split = load_split(data_config(dataset=f"folder:{tmp_path}"), "train")
    assert [p["source"] for p in split.pairs] == ["eins", "vier"]
    assert split.skipped_empty == 2


def test_shards_split_the_lines_between_processes(tmp_path):
    """Process k of n reads pairs k, k+n, ...; empty pairs are skipped in each share."""
    de = [f"de{i}" if i != 4 else "" for i in range(7)]
    write_split(tmp_path, "train", de, [f"en{i}" for i in range(7)])
    shards = [load_split(data_config(dataset=f"folder:{tmp_path}"), "train",
                         shard_index=k, shard_count=2) for k in (0, 1)]
    assert [p["target"] for p in shards[0].pairs] == ["en0", "en2", "en6"]
    assert [p["target"] for p in shards[1].pairs] == ["en1", "en3", "en5"]
    assert (shards[0].skipped_empty, shards[1].skipped_empty) == (1, 0)


def test_folder_line_count_mismatch_names_both_files(tmp_path):
    write_split(tmp_path, "train", ["eins", "zwei", "drei"], ["one", "two"])
    with pytest.raises(DataError) as error:
        load_split(data_config(dataset=f"folder:{tmp_path}"), "train")
    message = str(error.value)
    assert "train.de has 3 lines" in message and "train.en has 2" in message


def test_folder_invalid_utf8_names_file_and_line(tmp_path):
    write_split(tmp_path, "validation", ["eins", "zwei", "drei"], ["one", "two", "three"])
    (tmp_path / "validation.en").write_bytes(b"one\ntwo\nth\xffree\n")
    with pytest.raises(DataError) as error:
        load_split(data_config(dataset=f"folder:{tmp_path}"), "validation")
    assert str(error.value) == (f"{tmp_path / 'validation.en'}, line 3: not valid UTF-8 "
                                f"(invalid start byte at byte 3 of the line); if the file is in "
                                f"another encoding, convert it, e.g. iconv -f LATIN1 -t UTF-8 "
                                f"for Latin-1")


def test_folder_missing_split_lists_what_exists_and_what_to_do(tmp_path):
    """The folder's files are listed; a language no file has names the keys that choose the
    files, and a missing validation split says that empty files make a run without it."""
    write_split(tmp_path, "train", ["eins"], ["one"])
    with pytest.raises(DataError) as error:
        load_split(data_config(dataset=f"folder:{tmp_path}"), "test")
    assert str(error.value) == (f"missing {tmp_path / 'test.de'}, {tmp_path / 'test.en'}; "
                                f"{tmp_path} holds: train.de, train.en")
    with pytest.raises(DataError) as error:
        load_split(data_config(dataset=f"folder:{tmp_path}"), "validation")
    assert str(error.value).endswith(" holds: train.de, train.en (empty validation files "
                                     "train a run without evaluation)")
    with pytest.raises(DataError) as error:
        load_split(data_config(dataset=f"folder:{tmp_path}", target_lang="fr"), "train")
    assert str(error.value) == (f"missing {tmp_path / 'train.fr'}; {tmp_path} holds: train.de, "
                                f"train.en (the files are named for config.data.source_lang="
                                f"'de' and config.data.target_lang='fr')")


def test_folder_says_what_a_corpus_path_is_instead_of_a_file(tmp_path):
    """A FIFO or a directory named train.de is named for what it is, before anything is
    opened (opening the FIFO would wait for a writer forever: the alarm fails the test)."""
    os.mkfifo(tmp_path / "train.de")
    (tmp_path / "train.en").mkdir()
    config = data_config(dataset=f"folder:{tmp_path}")

    def opened_the_fifo(signum, frame):
        raise TimeoutError("the FIFO was opened")

    previous = signal.signal(signal.SIGALRM, opened_the_fifo)
    signal.alarm(10)
    try:
        for read in (load_split, describe_split):
            with pytest.raises(DataError) as error:
                read(config, "train")
            assert str(error.value) == (
                f"{tmp_path}/train.de is a FIFO (named pipe), not a regular file; "
                f"{tmp_path}/train.en is a directory, not a file; "
                f"{tmp_path} holds: train.de, train.en")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_folder_file_that_fails_to_read_is_named(tmp_path, monkeypatch):
    """An I/O error (EIO) while reading validation.en is a DataError naming the file."""
    write_split(tmp_path, "validation", ["eins"], ["one"])
    failing = str(tmp_path / "validation.en")

    class FailingFile(io.BytesIO):
        def read(self, *args):
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(sources, "open", lambda path, mode="r": (
        FailingFile() if path == failing else open(path, mode)), raising=False)
    with pytest.raises(DataError) as error:
        load_split(data_config(dataset=f"folder:{tmp_path}"), "validation")
    assert str(error.value) == f"cannot read {failing}: Input/output error"


def test_missing_folder_and_unknown_names(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_split(data_config(dataset=f"folder:{tmp_path / 'nope'}"), "train")
    with pytest.raises(DataError, match="numbers.*tfds:NAME.*folder:PATH"):
        load_split(data_config(dataset="mnist"), "train")
    with pytest.raises(DataError, match="train, validation, test"):
        load_split(data_config(dataset=f"folder:{tmp_path}"), "dev")


# --- tfds:NAME ----------------------------------------------------------------------------


# Records as TFDS stores WMT pairs: one bytes field per language.
WMT_RECORDS = [{"de": f"Satz {i}".encode(), "en": f"sentence {i}".encode()} for i in range(6)]


def test_tfds_mock_data_direction_and_types():
    """Mocked WMT14 records become str pairs, the source taken from source_lang."""
    config = data_config(dataset="tfds:wmt14_translate/de-en", source_lang="en",
                         target_lang="de")
    with tfds.testing.mock_data(as_data_source_fn=lambda builder, split, **_: WMT_RECORDS):
        pairs = load_split(config, "train").pairs
        odd = load_split(config, "train", shard_index=1, shard_count=2).pairs
    assert pairs == [{"source": f"sentence {i}", "target": f"Satz {i}"} for i in range(6)]
    assert odd == pairs[1::2]


def test_tfds_records_are_read_in_chunks_each_once_in_order(monkeypatch):
    """Records are read a chunk at a time (one `__getitems__` call each): chunks of 4 of a
    process's 5 records 1, 3, ... 9 of 11 read each of them once, in order."""
    records = [{"de": f"Satz {i}".encode(), "en": f"sentence {i}".encode()} for i in range(11)]
    calls = []

    class Records(list):
        def __getitems__(self, indices):
            calls.append(list(indices))
            return [self[i] for i in indices]

    read = sources._read_pairs(Records(records), range(1, 11, 2), data_config(), "tfds train",
                               chunk=4)
    assert read == [{"source": f"Satz {i}", "target": f"sentence {i}"} for i in range(1, 11, 2)]
    assert calls == [[1, 3, 5, 7], [9]]


@pytest.mark.filterwarnings("ignore:Requested vocab_size")
def test_tfds_mock_data_batches_shapes_and_dtypes(tmp_path):
    """Mocked WMT14 pairs, prepared, become int32 batches of the configured shapes,
    EOS-terminated."""
    config = data_config(dataset="tfds:wmt14_translate/de-en", source_lang="en",
                         target_lang="de", vocab_size=300, data_dir=str(tmp_path / "tfds"))
    with tfds.testing.mock_data(as_data_source_fn=lambda builder, split, **_: WMT_RECORDS):
        tokenizer, splits = prepare(config, str(tmp_path / "run"), log=lambda line: None)
    assert len(splits["train"]) == len(splits["validation"]) == 6
    train = next(iter(train_dataset(splits["train"], batch_size=3, max_source_length=8,
                                    max_target_length=6)))
    assert {k: (v.shape, v.dtype) for k, v in train.items()} == {
        f"{side}{suffix}": ((3, length), np.int32)
        for side, length in (("inputs", 8), ("targets", 6))
        for suffix in ("", "_segmentation", "_positions")}
    batch = next(eval_batches(splits["validation"], batch_size=4, max_source_length=8,
                              max_target_length=6))
    assert batch["inputs"].shape == (4, 8) and batch["targets"].dtype == np.int32
    first = batch["inputs"][0][batch["inputs"][0] > 0].tolist()
    assert first == tokenizer.encode("sentence 0") + [EOS_ID]  # English is the source


def test_numbers_reads_the_built_array_records(tmp_path):
    """load_split on the built-in data reads every record of the split, de -> en."""
    from transformer_jax.data.numbers import SMALL_SIZES, number_words, split_numbers

    split = load_split(data_config(data_dir=str(tmp_path)), "validation")
    expected = {(number_words(n)["de"], number_words(n)["en"])
                for n in split_numbers("validation", SMALL_SIZES)}
    assert len(split) == SMALL_SIZES["validation"] and split.skipped_empty == 0
    assert {(p["source"], p["target"]) for p in split.pairs} == expected


def test_tfds_unknown_name_lists_translation_datasets():
    with pytest.raises(DataError) as error:
        load_split(data_config(dataset="tfds:wmt14_translat/de-en"), "train")
    assert "wmt14_translate" in str(error.value) and "wmt19_translate" in str(error.value)
    assert "wmt14_translate" in translation_datasets()
    with pytest.raises(DataError) as described:  # as the tokenizer asks before reading
        describe_split(data_config(dataset="tfds:wmt14_translat/de-en"), "train")
    assert str(described.value) == str(error.value)


def test_tfds_not_prepared_without_download_says_how(tmp_path):
    config = data_config(dataset="tfds:wmt14_translate/de-en", data_dir=str(tmp_path),
                         download=False)
    with pytest.raises(DataError) as error:
        load_split(config, "train")
    assert "not prepared" in str(error.value) and "TFDS_DATA_DIR" in str(error.value)


def test_tfds_failed_download_is_a_clear_error(tmp_path, monkeypatch, capsys):
    """A download that fails (no network here) becomes a DataError that says what to do;
    before it, one line says that it downloads and that offline that takes minutes."""

    def offline(self, *args, **kwargs):
        raise ConnectionError("name resolution failed")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", offline)
    config = data_config(dataset="tfds:wmt14_translate/de-en", data_dir=str(tmp_path))
    with pytest.raises(DataError, match="could not be prepared here.*ConnectionError"):
        load_split(config, "train")
    assert capsys.readouterr().err == (
        f"preparing wmt14_translate/de-en in {tmp_path} (array_record): downloading it; "
        f"without a network TFDS retries for about 3.5 minutes before giving up "
        f"(--config.data.download=false stops at once)\n")


def test_tfds_wrong_language_is_named():
    config = data_config(dataset="tfds:wmt14_translate/de-en", source_lang="fr")
    with tfds.testing.mock_data(num_examples=2):
        with pytest.raises(DataError, match="source_lang='fr'"):
            load_split(config, "train")


def test_a_folder_that_is_no_folder_says_what_it_is(tmp_path, monkeypatch):
    """A file given as the folder was said not to exist, ~ was not expanded, a relative path
    did not say where it was looked for, and a broken link was "missing" in a listing that
    named it."""
    write_split(tmp_path, "train", ["eins"], ["one"])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as error:
        load_split(data_config(dataset="folder:train.de"), "train")
    assert str(error.value) == (f"dataset folder 'train.de' (from {tmp_path}) is a file, not a "
                                f"folder; set --config.data.dataset=folder:PATH, the folder "
                                f"that holds train.de and train.en")
    with pytest.raises(DataError) as error:
        load_split(data_config(dataset=f"folder:{tmp_path}/corpus"), "train")
    assert str(error.value).startswith(f"dataset folder '{tmp_path}/corpus' does not exist; ")
    monkeypatch.setenv("HOME", str(tmp_path.parent))
    pairs = load_split(data_config(dataset=f"folder:~/{tmp_path.name}"), "train").pairs
    assert pairs == [{"source": "eins", "target": "one"}]
    with pytest.raises(DataError) as error:  # looked for under HOME, not the current folder
        load_split(data_config(dataset="folder:~/gone"), "train")
    assert str(error.value).startswith(f"dataset folder '~/gone' ({tmp_path.parent}/gone) "
                                       f"does not exist; ")
    (tmp_path / "train.en").unlink()
    (tmp_path / "train.en").symlink_to(tmp_path / "gone.en")
    with pytest.raises(DataError) as error:
        load_split(data_config(dataset=f"folder:{tmp_path}"), "train")
    assert str(error.value).startswith(f"{tmp_path / 'train.en'} is a broken link (to "
                                       f"{tmp_path / 'gone.en'}); {tmp_path} holds: ")


def test_a_utf16_file_is_named_as_such(tmp_path):
    """A file saved as UTF-16 was "line 1: not valid UTF-8", as if that line were damaged."""
    (tmp_path / "train.de").write_bytes("eins\nzwei\n".encode("utf-16"))
    (tmp_path / "train.en").write_text("one\ntwo\n")
    with pytest.raises(DataError) as error:
        load_split(data_config(dataset=f"folder:{tmp_path}"), "train")
    assert str(error.value) == (f"{tmp_path / 'train.de'} is UTF-16 (it starts with UTF-16's "
                                f"byte-order mark), not UTF-8; convert it, e.g. iconv -f "
                                f"UTF-16 -t UTF-8")


def test_one_folder_however_written_is_one_dataset(tmp_path, monkeypatch):
    """Relative, absolute, with a trailing /, from ~ or through a link: one folder is one
    dataset; another folder is another."""
    (tmp_path / "corpus").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "corpus")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for written in (f"folder:{tmp_path}/corpus/", "folder:~/corpus", "folder:link",
                    f"folder:{tmp_path}/link", "folder:./other/../corpus"):
        assert sources.same_dataset("folder:corpus", written), written
    assert not sources.same_dataset("folder:corpus", "folder:other")
    assert not sources.same_dataset("folder:corpus", "numbers")


def test_a_folder_moved_is_its_files_by_name_size_and_time_to_the_millisecond(tmp_path):
    """describe_split of a folder and of its copy elsewhere: moved when the files' names and
    sizes match and their times to the millisecond (a copy to another file system may keep
    only microseconds); not when a time, a size or another setting differs."""
    write_split(tmp_path, "train", ["eins"], ["one"])
    here = describe_split(data_config(dataset=f"folder:{tmp_path}"), "train")

    def elsewhere(shift_ns=0, grow=0, **changes):
        files = [[f"/elsewhere/{os.path.basename(path)}", size + grow,
                  mtime_ns // 1000 * 1000 + shift_ns] for path, size, mtime_ns in here["files"]]
        return {**here, "dataset": "folder:/elsewhere", "files": files, **changes}

    assert moved_folder(here, elsewhere()) and moved_folder(here, elsewhere(999_000))
    assert not moved_folder(here, elsewhere(2_000_000))
    assert moved_folder(here, elsewhere(2_000_000), times=False)
    assert not moved_folder(here, elsewhere(grow=1), times=False)
    assert not moved_folder(here, elsewhere(languages=["en", "de"]))
    assert not moved_folder(here, {**elsewhere(), "dataset": "numbers"})
    assert not moved_folder({"dataset": "folder:/x", "files": "edited"}, elsewhere())
