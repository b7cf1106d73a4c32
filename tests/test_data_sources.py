"""Sources: a user's folder (and every bad input), TFDS through mock data, clear errors."""

import ml_collections
import pytest
import tensorflow_datasets as tfds

from transformer_jax.data.sources import DataError, open_split, translation_datasets


def data_config(**overrides) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict(dict(
        dataset="numbers", numbers_size="small", source_lang="de", target_lang="en",
        data_dir=None, download=True, num_threads=1))
    config.update(overrides)
    return config


def write_split(folder, split, de_lines, en_lines, *, end="\n"):
    for lang, lines in (("de", de_lines), ("en", en_lines)):
        (folder / f"{split}.{lang}").write_bytes("".join(l + end for l in lines).encode())


# --- folder:PATH --------------------------------------------------------------------------


def test_folder_pairs_in_order_in_either_direction(tmp_path):
    """Lines pair up by number; source_lang/target_lang choose the direction."""
    write_split(tmp_path, "train", ["eins", "zwei", "drei"], ["one", "two", "three"])
    de_en = list(open_split(data_config(dataset=f"folder:{tmp_path}"), "train"))
    assert de_en == [{"source": "eins", "target": "one"}, {"source": "zwei", "target": "two"},
                     {"source": "drei", "target": "three"}]
    en_de = list(open_split(data_config(dataset=f"folder:{tmp_path}", source_lang="en",
                                        target_lang="de"), "train"))
    assert en_de[1] == {"source": "two", "target": "zwei"}


def test_folder_keeps_spaces_and_only_splits_on_newline(tmp_path):
    """CRLF endings are removed; inner spaces and U+2028 stay inside their line."""
    write_split(tmp_path, "test", ["a  b", "x\u2028y"], [" c", "z"], end="\r\n")
    pairs = list(open_split(data_config(dataset=f"folder:{tmp_path}"), "test"))
    assert pairs == [{"source": "a  b", "target": " c"}, {"source": "x\u2028y", "target": "z"}]


def test_folder_skips_pairs_with_an_empty_side(tmp_path):
    """Empty or blank lines on either side drop the pair; the index still counts it."""
    write_split(tmp_path, "train", ["eins", "", "drei", "vier"], ["one", "two", " \t", "four"])
    pairs = open_split(data_config(dataset=f"folder:{tmp_path}"), "train")
    assert len(pairs) == 4
    assert [pairs[i] is None for i in range(4)] == [False, True, True, False]
    assert [p["source"] for p in pairs] == ["eins", "vier"]


def test_folder_line_count_mismatch_names_both_files(tmp_path):
    write_split(tmp_path, "train", ["eins", "zwei", "drei"], ["one", "two"])
    with pytest.raises(DataError) as error:
        open_split(data_config(dataset=f"folder:{tmp_path}"), "train")
    message = str(error.value)
    assert "train.de has 3 lines" in message and "train.en has 2" in message


def test_folder_invalid_utf8_names_file_and_line(tmp_path):
    write_split(tmp_path, "validation", ["eins", "zwei", "drei"], ["one", "two", "three"])
    (tmp_path / "validation.en").write_bytes(b"one\ntwo\nth\xffree\n")
    with pytest.raises(DataError, match=r"validation\.en, line 3: not valid UTF-8"):
        open_split(data_config(dataset=f"folder:{tmp_path}"), "validation")


def test_folder_missing_split_lists_what_exists(tmp_path):
    write_split(tmp_path, "train", ["eins"], ["one"])
    with pytest.raises(DataError) as error:
        open_split(data_config(dataset=f"folder:{tmp_path}"), "test")
    assert "test.de" in str(error.value) and "train.de, train.en" in str(error.value)


def test_missing_folder_and_unknown_names(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        open_split(data_config(dataset=f"folder:{tmp_path / 'nope'}"), "train")
    with pytest.raises(DataError, match="numbers.*tfds:NAME.*folder:PATH"):
        open_split(data_config(dataset="mnist"), "train")
    with pytest.raises(DataError, match="train, validation, test"):
        open_split(data_config(dataset=f"folder:{tmp_path}"), "dev")


# --- tfds:NAME ----------------------------------------------------------------------------


def test_tfds_mock_data_direction_and_types():
    """Mocked WMT14 records come out as str pairs, source from source_lang."""
    config = data_config(dataset="tfds:wmt14_translate/de-en", source_lang="en",
                         target_lang="de")
    with tfds.testing.mock_data(num_examples=6):
        pairs = open_split(config, "train")
        records = tfds.data_source("wmt14_translate/de-en", split="train")
        assert len(pairs) == 6
        for i in range(6):
            assert isinstance(pairs[i]["source"], str)
            assert pairs[i] == {"source": str(records[i]["en"]), "target": str(records[i]["de"])}


def test_tfds_unknown_name_lists_translation_datasets():
    with pytest.raises(DataError) as error:
        open_split(data_config(dataset="tfds:wmt14_translat/de-en"), "train")
    assert "wmt14_translate" in str(error.value) and "wmt19_translate" in str(error.value)
    assert "wmt14_translate" in translation_datasets()


def test_tfds_not_prepared_without_download_says_how(tmp_path):
    config = data_config(dataset="tfds:wmt14_translate/de-en", data_dir=str(tmp_path),
                         download=False)
    with pytest.raises(DataError) as error:
        open_split(config, "train")
    assert "not prepared" in str(error.value) and "TFDS_DATA_DIR" in str(error.value)


def test_tfds_failed_download_is_a_clear_error(tmp_path, monkeypatch):
    """A download that fails (no network here) becomes a DataError that says what to do."""

    def offline(self, *args, **kwargs):
        raise ConnectionError("name resolution failed")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", offline)
    config = data_config(dataset="tfds:wmt14_translate/de-en", data_dir=str(tmp_path))
    with pytest.raises(DataError, match="could not be prepared here.*ConnectionError"):
        open_split(config, "train")


def test_tfds_wrong_language_is_named():
    config = data_config(dataset="tfds:wmt14_translate/de-en", source_lang="fr")
    with tfds.testing.mock_data(num_examples=2):
        with pytest.raises(DataError, match="source_lang='fr'"):
            open_split(config, "train")
