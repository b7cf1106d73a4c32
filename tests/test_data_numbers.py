"""The "numbers" dataset: known spellings, the split rules, and the built "small" config."""

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from transformer_jax.data.numbers import (
    FULL_SIZES,
    SMALL_SIZES,
    SPLITS,
    Numbers,
    number_words,
    prepare_numbers,
    split_numbers,
)

# --- number_words --------------------------------------------------------------------------

# Written by hand: German writes units before tens and the whole number as one word.
KNOWN = [
    (0, "zero", "null"),
    (1, "one", "eins"),
    (11, "eleven", "elf"),
    (17, "seventeen", "siebzehn"),
    (21, "twenty-one", "einundzwanzig"),
    (30, "thirty", "dreißig"),
    (101, "one hundred and one", "einhunderteins"),
    (342, "three hundred and forty-two", "dreihundertzweiundvierzig"),
    (1000, "one thousand", "eintausend"),
    (1234, "one thousand, two hundred and thirty-four", "eintausendzweihundertvierunddreißig"),
    (21005, "twenty-one thousand and five", "einundzwanzigtausendfünf"),
    (700007, "seven hundred thousand and seven", "siebenhunderttausendsieben"),
    (999999, "nine hundred and ninety-nine thousand, nine hundred and ninety-nine",
     "neunhundertneunundneunzigtausendneunhundertneunundneunzig"),
]


@pytest.mark.parametrize("n, en, de", KNOWN)
def test_number_words_known_pairs(n, en, de):
    assert number_words(n) == {"de": de, "en": en}


def test_number_words_accepts_numpy_integers():
    assert number_words(np.int64(21)) == number_words(21)


def test_number_words_german_hundred_and_one_thousand():
    """num2words writes "einhunderteinstausend"; the dataset corrects it."""
    assert number_words(101_000)["de"] == "einhunderteintausend"
    assert number_words(901_101)["de"] == "neunhunderteintausendeinhunderteins"
    assert number_words(1_001)["de"] == "eintausendeins"
    assert number_words(1)["de"] == "eins"


# --- split_numbers -------------------------------------------------------------------------


@pytest.mark.parametrize("sizes, copies",
                         [(FULL_SIZES, (160, 32, 16)), (SMALL_SIZES, (1, 1, 1))],
                         ids=["full", "small"])
def test_split_numbers_sizes_disjoint_in_range(sizes, copies):
    """Train holds each number of 1, 2 and 3 digits `copies` times (in "full" 10:2:1, the
    most that fits a tenth of its 200,000: 1,600 + 2,880 + 14,400 = 18,880; once in
    "small"), then distinct numbers; the splits share no number."""
    splits = {split: split_numbers(split, sizes) for split in SPLITS}
    for split, nums in splits.items():
        assert len(nums) == sizes[split]
        assert nums.min() >= 0 and nums.max() <= 999_999
        assert np.all(np.diff(nums) >= 0)  # sorted
        large = nums[nums >= 1000]
        assert len(np.unique(large)) == len(large)
    for a, b in itertools.combinations(SPLITS, 2):
        assert len(np.intersect1d(splits[a], splits[b])) == 0, (a, b)
    below_1000 = np.repeat(np.arange(1000), np.repeat(copies, (10, 90, 900)))
    np.testing.assert_array_equal(splits["train"][:len(below_1000)], below_1000)
    assert splits["train"][len(below_1000)] >= 1000
    assert splits["validation"].min() >= 1000 and splits["test"].min() >= 1000


@pytest.mark.parametrize("sizes", [FULL_SIZES, SMALL_SIZES], ids=["full", "small"])
def test_split_numbers_deterministic(sizes):
    for split in SPLITS:
        np.testing.assert_array_equal(split_numbers(split, sizes), split_numbers(split, sizes))


def test_small_splits_are_subsets_of_full_splits():
    """So a model trained on "full" has never seen the "small" test numbers."""
    for split in SPLITS:
        small, full = split_numbers(split, SMALL_SIZES), split_numbers(split, FULL_SIZES)
        assert np.all(np.isin(small, full)), split


# Numbers of version 1.2.0's splits (the first four and the sum of each): another draw would
# be another dataset under the same version, and prepared ids or a test score made from one
# would silently not match the other.
VERSION_1_2_0 = {
    ("small", "train"): ([1117, 1332, 1677, 1977], 1_481_906_014),
    ("small", "validation"): ([1848, 4869, 9375, 9768], 96_290_473),
    ("small", "test"): ([6499, 10506, 13061, 18399], 103_167_778),
    ("full", "train"): ([1006, 1007, 1009, 1012], 90_829_458_193),
    ("full", "validation"): ([1579, 1648, 1848, 2194], 990_948_569),
    ("full", "test"): ([1643, 1768, 2730, 3007], 1_004_077_896),
}


@pytest.mark.parametrize("config, split", sorted(VERSION_1_2_0))
def test_split_numbers_are_those_of_the_version(config, split):
    assert str(Numbers.VERSION) == "1.2.0"
    numbers = split_numbers(split, {"small": SMALL_SIZES, "full": FULL_SIZES}[config])
    first, total = VERSION_1_2_0[config, split]
    assert numbers[numbers >= 1000][:4].tolist() == first and int(numbers.sum()) == total


def test_record_keys_are_the_number_plus_a_million_per_copy_before():
    """A number's first record keeps the number as its key (version 1.0.0's keys, so a split
    without copies keeps its records' order); each later copy adds 1,000,000."""
    keys = [key for key, _ in Numbers._generate_examples(None, np.array([5, 5, 5, 7, 1234]))]
    assert keys == [5, 1_000_005, 2_000_005, 7, 1234]


def test_split_numbers_rejects_bad_arguments():
    with pytest.raises(ValueError, match="train, validation, test"):
        split_numbers("dev")
    with pytest.raises(ValueError, match="at least"):
        split_numbers("train", dict(SMALL_SIZES, train=999))
    with pytest.raises(ValueError, match="out of range"):
        split_numbers("test", dict(SMALL_SIZES, test=500_000))


def test_pool_spelling_equals_serial_and_runs_an_unguarded_script_once(tmp_path):
    """The process pool (spawned workers) gives the same examples in the same order, and a
    script that spells at its top level, with no `if __name__ == "__main__":` (as a user's
    script calling train does), runs once: its workers do not import it again."""
    nums = split_numbers("validation", SMALL_SIZES)[:40]
    script, runs = tmp_path / "unguarded.py", tmp_path / "runs.txt"
    script.write_text(
        "import json, sys\n"
        "from transformer_jax.data import numbers\n"
        f"open({str(runs)!r}, 'a').write('ran\\n')\n"
        "numbers.POOL_MIN_NUMBERS, numbers.POOL_CHUNK = 10, 7\n"
        f"print(json.dumps(list(numbers._spelled({nums.tolist()}))))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert runs.read_text() == "ran\n"
    assert json.loads(done.stdout) == [number_words(n) for n in nums]


# --- the built "small" dataset -------------------------------------------------------------


def read_pairs(builder, split) -> list[tuple[str, str]]:
    source = builder.as_data_source(split=split)
    return [(r["de"].decode(), r["en"].decode()) for r in source.__getitems__(range(len(source)))]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("numbers")
    return data_dir, prepare_numbers(str(data_dir), config="small")


def test_default_config_is_full():
    assert Numbers.BUILDER_CONFIGS[0].name == "full"
    assert Numbers.name == "numbers"


def test_small_split_lengths(small):
    _, builder = small
    for split in SPLITS:
        assert len(builder.as_data_source(split=split)) == SMALL_SIZES[split]


def test_small_records_spell_their_split_numbers(small):
    """Exactly the expected (de, en) pairs, each once; so the splits are disjoint too."""
    _, builder = small
    seen = set()
    for split in SPLITS:
        pairs = read_pairs(builder, split)
        words = map(number_words, split_numbers(split, SMALL_SIZES))
        expected = {(w["de"], w["en"]) for w in words}
        assert len(pairs) == len(set(pairs)) == len(expected)
        assert set(pairs) == expected
        assert seen.isdisjoint(pairs)
        seen.update(pairs)


def test_small_build_is_reproducible(small, tmp_path, capfd):
    """A second build elsewhere writes the same records in the same order. It says so in
    one line on stderr and nothing on stdout, where TFDS printed "Downloading and preparing
    dataset" (into a benchmark's markdown table, for a dataset that downloads nothing)."""
    _, builder = small
    capfd.readouterr()
    again = prepare_numbers(str(tmp_path), config="small")
    out, err = capfd.readouterr()
    assert out == ""
    assert (f"building the numbers dataset (small: train 4,000, validation 200, test 200 "
            f"pairs, spelled here, nothing downloaded) in {tmp_path}/numbers/small/") in err
    assert "ownload" not in err.replace("nothing downloaded", "")
    for split in SPLITS:
        assert read_pairs(again, split) == read_pairs(builder, split)


def test_prepare_again_is_a_no_op(small):
    data_dir, _ = small

    def snapshot():
        return {p: p.stat().st_mtime_ns for p in data_dir.rglob("*") if p.is_file()}

    before = snapshot()
    builder = prepare_numbers(str(data_dir), config="small")
    assert snapshot() == before
    assert len(builder.as_data_source(split="test")) == SMALL_SIZES["test"]


def test_prepare_rejects_unknown_config(tmp_path):
    with pytest.raises(ValueError, match="full, small"):
        prepare_numbers(str(tmp_path), config="tiny")


def test_two_first_builds_at_once_both_succeed(tmp_path):
    """Two first runs at once on one TFDS folder: both read the dataset that one of them
    built. TFDS builds into a folder of its own and renames it into place; the second
    rename failed ("Destination ... already exists"), which train.py reported as a disk
    or permission problem."""
    import subprocess
    import sys

    code = ("import sys; from transformer_jax.data.numbers import prepare_numbers; "
            "b = prepare_numbers(sys.argv[1], config='small'); "
            "print(len(b.as_data_source(split='train')))")
    runs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    results = [(run.wait(timeout=300), *run.communicate()) for run in runs]
    assert [(rc, out) for rc, out, _ in results] == [(0, f"{SMALL_SIZES['train']}\n")] * 2, [
        err[-500:] for _, _, err in results]
    assert sum("building the numbers dataset" in err for _, _, err in results) == 1
