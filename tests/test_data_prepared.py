"""Prepared ids: they decode to the text, batches equal a reference packer, a killed
preparation resumes, a stale one is refused, a second prepare reads and tokenizes nothing.

The data is a small folder corpus (numbers in words). Expected values are computed
here from the text with `tokenizer.encode`, never read back from the prepared files.
"""

import itertools
import json
import multiprocessing
import os
import pickle
import shutil
import signal
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from num2words import num2words
from process_table import still_running

from transformer_jax.data import prepared as prepared_module
from transformer_jax.data import prepared_writer, vocabulary
from transformer_jax.data.parallel_encoding import encode_in_processes
from transformer_jax.data.pipeline import CHUNK, train_dataset
from transformer_jax.data.prepared import open_split, prepare
from transformer_jax.data.prepared_split import PreparedSplit
from transformer_jax.data.sources import DataError, Split
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.run_config import data_fields
from transformer_jax.token_ids import EOS_ID

PAIRS = [{"source": num2words(n, lang="de"), "target": num2words(n, lang="en")}
         for n in range(0, 3000, 7)]  # the training split: 429 pairs
VALIDATION = PAIRS[5:45]  # 40 pairs
VOCAB_SIZE = 400  # the minimum is 261 + the 27 distinct characters: 288
QUIET = dict(log=lambda line: None)


def write_corpus(folder, pairs=PAIRS, validation=VALIDATION):
    folder.mkdir(parents=True, exist_ok=True)
    for split, split_pairs in (("train", pairs), ("validation", validation),
                               ("test", validation)):  # read by prepare's check alone
        for lang, side in (("de", "source"), ("en", "target")):
            (folder / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in split_pairs))
    return data_fields(dataset=f"folder:{folder}", vocab_size=VOCAB_SIZE)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The corpus folder's config, read only by the tests that share it."""
    return write_corpus(tmp_path_factory.mktemp("prepared") / "corpus")


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    """(workdir, tokenizer, splits): the corpus prepared once."""
    workdir = str(tmp_path_factory.mktemp("run"))
    tokenizer, splits = prepare(corpus, workdir, **QUIET)
    return workdir, tokenizer, splits


def prepared_arrays(workdir, split):
    folder = os.path.join(workdir, "prepared", split)
    return {name: np.load(os.path.join(folder, f"{name}.npy"))
            for name in ("inputs", "targets", "inputs_offsets", "targets_offsets")}


def count_calls(monkeypatch, obj, name, fail_after=None):
    """Wraps obj.name to record its calls' first argument; raises once fail_after calls ran."""
    original, calls = getattr(obj, name), []
    original = getattr(original, "__wrapped__", original)  # not a wrapper made before

    def wrapper(*args, **kwargs):
        if fail_after is not None and len(calls) >= fail_after:
            raise KeyboardInterrupt("killed")
        calls.append(args[0])
        return original(*args, **kwargs)

    wrapper.__wrapped__ = original
    monkeypatch.setattr(obj, name, wrapper)
    return calls


def killed_preparation(config, tmp_path, monkeypatch, name: str, fail_after: int,
                       processes: int | None = None) -> str:
    """`prepare` in parts of 100 pairs into tmp_path/run, killed (KeyboardInterrupt) once
    `fail_after` calls of prepared_writer.`name` ran; returns the workdir."""
    monkeypatch.setattr(prepared_writer, "PART_PAIRS", 100)
    workdir = str(tmp_path / "run")
    count_calls(monkeypatch, prepared_writer, name, fail_after=fail_after)
    with pytest.raises(KeyboardInterrupt):
        prepare(config, workdir, **QUIET, processes=processes)
    return workdir


# --- what is prepared -------------------------------------------------------------------------


def test_prepared_ids_are_the_encoded_text(run):
    """Every pair's ids are `encode(text) + [EOS]`, and decode back to the text."""
    _, tokenizer, splits = run
    for split, pairs in (("train", PAIRS), ("validation", VALIDATION)):
        prepared = splits[split]
        assert len(prepared) == len(pairs)
        for i, pair in enumerate(pairs):
            ids = prepared[i]
            for side, key in (("inputs", "source"), ("targets", "target")):
                assert ids[side].dtype == np.int32
                assert ids[side].tolist() == tokenizer.encode(pair[key]) + [EOS_ID]
                assert tokenizer.decode(ids[side]) == pair[key]
        last = prepared[-1]["targets"].tolist()
        assert last == tokenizer.encode(pairs[-1]["target"], add_eos=True)
        with pytest.raises(IndexError):
            prepared[len(pairs)]
    manifest = splits["train"].manifest
    assert manifest["pairs"] == 429 and manifest["dtype"] == "uint16"
    assert manifest["tokens"]["targets"] == sum(
        len(tokenizer.encode(p["target"])) + 1 for p in PAIRS)


def test_lengths_and_gather(run):
    """lengths() is each pair's id count; gather() the first counts[k] ids of pair indices[k]."""
    _, tokenizer, splits = run
    train = splits["train"]
    for side, key in (("inputs", "source"), ("targets", "target")):
        expected = [len(tokenizer.encode(p[key])) + 1 for p in PAIRS]
        np.testing.assert_array_equal(train.lengths(side), expected)
    indices = np.asarray([17, 3, 428, 3, 0, 250])  # repeated, unordered, the last pair
    for side, key in (("inputs", "source"), ("targets", "target")):
        full = train.lengths(side)[indices]
        counts = np.asarray([1, full[1] - 1, full[2], 0, full[4], 2])  # whole, cut, none
        expected = list(itertools.chain.from_iterable(
            tokenizer.encode(PAIRS[i][key], add_eos=True)[:n] for i, n in zip(indices, counts)))
        got = train.gather(side, indices, counts)
        assert got.dtype == np.int32 and got.tolist() == expected
    assert train.gather("targets", np.zeros((0,), np.int64), np.zeros((0,), np.int64)).size == 0


def test_a_prepared_split_pickles_as_its_folder(run):
    """Grain workers get the folder and open their own maps: the same ids, no array copied."""
    train = run[2]["train"]
    data = pickle.dumps(train)
    assert len(data) < 1000  # the folder's name, not 4k+ tokens of ids
    again = pickle.loads(data)
    assert len(again) == len(train)
    for i in (0, 211, 428):
        for side in ("inputs", "targets"):
            np.testing.assert_array_equal(again[i][side], train[i][side])


class IdsTokenizer(Tokenizer):
    """A vocabulary of `vocab_size` ids whose texts are ids written out ("5 65536"): its
    `encode_arrays` is Tokenizer's own."""

    def __init__(self, vocab_size):  # no SentencePiece model
        self._vocab_size = vocab_size

    @property
    def vocab_size(self):
        return self._vocab_size

    def encode_batch(self, texts, *, add_eos=False, num_threads=1):
        return [[int(word) for word in text.split()] + [EOS_ID] * add_eos for text in texts]


@pytest.mark.parametrize("vocab_size, dtype", [(65_536, "uint16"), (65_537, "int32")])
def test_ids_are_uint16_while_the_vocabulary_fits_and_int32_beyond(tmp_path, vocab_size, dtype):
    """uint16 holds every id of 65,536 pieces (0 to 65,535); with one piece more, the last id,
    65,536, is int32's to hold: the ids read back are the ids written."""
    top = vocab_size - 1
    pairs = [{"source": f"5 {top}", "target": f"{top} 7 {top}"}, {"source": "4", "target": "6"}]
    prepared_writer.write_split(Split("train", pairs, 0), {"dataset": "ids"},
                                IdsTokenizer(vocab_size), str(tmp_path / "train"),
                                log=lambda line: None, processes=0)
    split = PreparedSplit(str(tmp_path / "train"))
    assert split.manifest["dtype"] == dtype
    assert [{side: ids.tolist() for side, ids in split[i].items()} for i in range(2)] == [
        {"inputs": [5, top, EOS_ID], "targets": [top, 7, top, EOS_ID]},
        {"inputs": [4, EOS_ID], "targets": [6, EOS_ID]}]


def test_the_pairs_skipped_for_an_empty_side_are_counted_in_the_manifest_and_the_line(tmp_path):
    """3 of 33 lines have an empty side: the split holds 30 pairs, and both its manifest and
    its line say that 3 were skipped."""
    pairs = PAIRS[:30] + [{"source": "", "target": "one"}, {"source": "zwei", "target": " "},
                          {"source": "", "target": ""}]
    config = write_corpus(tmp_path / "corpus", pairs)
    lines = []
    _, splits = prepare(config, str(tmp_path / "run"), log=lines.append)
    assert len(splits["train"]) == 30 and splits["train"].manifest["skipped_empty"] == 3
    assert splits["validation"].manifest["skipped_empty"] == 0
    (line,) = [line for line in lines if line.startswith("prepared train:")]
    assert line.startswith("prepared train: 30 pairs, ") and line.endswith(
        "; 3 skipped (an empty side)")


# --- batches from prepared ids equal a reference ----------------------------------------------


def reference_stream(num_pairs, seed, indices=None):
    """The pipeline's example order: each epoch a NumPy permutation seeded by (seed, epoch)."""
    indices = np.arange(num_pairs) if indices is None else indices
    for epoch in itertools.count():
        yield from indices[np.random.default_rng([seed, epoch]).permutation(len(indices))]


def reference_batches(examples, batch_size, max_source_length, max_target_length):
    """Naive first fit, one example at a time: a batch ends when an example fits in no row,
    and that example opens the next batch. `examples` yields (source ids, target ids)."""
    lengths = {"inputs": max_source_length, "targets": max_target_length}
    rows = [[] for _ in range(batch_size)]  # each row's (source, target) list
    for source, target in examples:
        source, target = source[:max_source_length], target[:max_target_length]
        for row in rows:
            if (sum(len(s) for s, _ in row) + len(source) <= max_source_length
                    and sum(len(t) for _, t in row) + len(target) <= max_target_length):
                row.append((source, target))
                break
        else:
            yield to_arrays(rows, lengths)
            rows = [[(source, target)]] + [[] for _ in range(batch_size - 1)]


def to_arrays(rows, lengths):
    batch = {}
    for k, (side, length) in enumerate(lengths.items()):
        ids, seg, pos = (np.zeros((len(rows), length), np.int32) for _ in range(3))
        for r, row in enumerate(rows):
            at = 0
            for s, pair in enumerate(row, start=1):
                n = len(pair[k])
                ids[r, at:at + n], seg[r, at:at + n], pos[r, at:at + n] = pair[k], s, range(n)
                at += n
        batch[side], batch[f"{side}_segmentation"], batch[f"{side}_positions"] = ids, seg, pos
    return batch


def encoded_pairs(tokenizer, pairs=PAIRS):
    return [tuple(tokenizer.encode(p[key], add_eos=True) for key in ("source", "target"))
            for p in pairs]


@pytest.mark.parametrize("case", [
    dict(batch_size=4, max_source_length=24, max_target_length=20, seed=0),
    dict(batch_size=3, max_source_length=6, max_target_length=9, seed=5),  # cut
    dict(batch_size=3, max_source_length=6, max_target_length=9, seed=5, too_long="drop"),
    dict(batch_size=2, max_source_length=12, max_target_length=12, seed=1, shard_index=1,
         shard_count=3),
], ids=["rows", "cut", "drop", "shard"])
def test_batches_equal_a_reference_first_fit(run, case):
    """200 batches equal the reference's: past several epochs' ends (chunks span them) and,
    for "rows", past the first chunk's."""
    _, tokenizer, splits = run
    ids = encoded_pairs(tokenizer)
    indices = np.arange(case.get("shard_index", 0), len(PAIRS), case.get("shard_count", 1))
    if case.get("too_long") == "drop":
        indices = np.asarray([i for i in indices if len(ids[i][0]) <= 6 and len(ids[i][1]) <= 9])
        assert 50 < len(indices) < 400
    rows = {k: case[k] for k in ("batch_size", "max_source_length", "max_target_length")}
    want = reference_batches((ids[i] for i in reference_stream(len(PAIRS), case["seed"], indices)),
                             **rows)
    got = iter(train_dataset(splits["train"], **case))
    for n in range(200):
        expected, batch = next(want), next(got)
        assert batch.keys() == expected.keys()
        for key in expected:
            np.testing.assert_array_equal(batch[key], expected[key], err_msg=f"{n}: {key}")


def test_worker_processes_pack_slices_of_the_chunks_in_turn(run):
    """With 2 grain workers, worker w packs chunks w, w + 2, ... and batches alternate
    between them; the state after some batches resumes exactly in new workers."""
    _, tokenizer, splits = run
    ids = encoded_pairs(tokenizer)
    rows = dict(batch_size=4, max_source_length=24, max_target_length=20)
    stream = list(itertools.islice(reference_stream(len(PAIRS), 7), 4 * CHUNK))
    chunks = [stream[k * CHUNK:(k + 1) * CHUNK] for k in range(4)]
    per_worker = [reference_batches((ids[i] for i in chunks[w] + chunks[w + 2]), **rows)
                  for w in (0, 1)]
    want = [next(per_worker[n % 2]) for n in range(12)]
    first = iter(train_dataset(splits["train"], seed=7, num_workers=2, **rows))
    try:
        got = [{k: np.array(v) for k, v in next(first).items()} for _ in range(8)]
        state = first.get_state()
        got += [{k: np.array(v) for k, v in next(first).items()} for _ in range(4)]
    finally:
        first.close()
    for n, (batch, expected) in enumerate(zip(got, want)):
        for key in expected:
            np.testing.assert_array_equal(batch[key], expected[key], err_msg=f"{n}: {key}")
    resumed = iter(train_dataset(splits["train"], seed=7, num_workers=2, **rows))
    try:
        resumed.set_state(state)
        for n in range(8, 12):
            batch = next(resumed)
            for key in want[n]:
                np.testing.assert_array_equal(batch[key], want[n][key], err_msg=f"{n}: {key}")
    finally:
        resumed.close()


# --- a killed preparation ---------------------------------------------------------------------


def test_a_killed_preparation_resumes_from_its_whole_parts(corpus, run, tmp_path, monkeypatch):
    """Killed after the first of 5 parts: nothing opens; a rerun keeps that part, writes the
    other 4 (and the validation split's one) and equals a clean preparation."""
    workdir = killed_preparation(corpus, tmp_path, monkeypatch, "_write_part", 1)  # 429 pairs
    tokenizer = Tokenizer.load(os.path.join(workdir, "tokenizer.model"))
    for split in ("train", "validation"):
        with pytest.raises(DataError, match=f"{split} is not prepared"):
            open_split(corpus, workdir, split, tokenizer)
    partial = os.path.join(workdir, "prepared", "train.partial")
    assert sorted(os.listdir(partial)) == ["made_from.json", "part-00000.npz"]
    part = np.load(os.path.join(partial, "part-00000.npz"))
    np.testing.assert_array_equal(part["targets_lengths"],
                                  [len(t) for _, t in encoded_pairs(tokenizer, PAIRS[:100])])
    # What a kill inside np.savez leaves: a truncated temporary file, never read.
    with open(os.path.join(partial, "part-00001.npz.tmp-xyz"), "wb") as f:
        f.write(b"PK\x03\x04 truncated")

    written = count_calls(monkeypatch, prepared_writer, "_write_part")
    _, splits = prepare(corpus, workdir, **QUIET)
    assert [os.path.relpath(p, os.path.join(workdir, "prepared")) for p in written] == [
        f"train.partial/part-0000{k}.npz" for k in (1, 2, 3, 4)] + [
        "validation.partial/part-00000.npz"]
    assert not os.path.exists(partial)
    assert_equal_to_the_clean_run(run, workdir)
    for split in ("train", "validation"):
        assert splits[split].manifest == run[2][split].manifest


def rerun_tokenizes_validation_alone(corpus, run, workdir, monkeypatch, killed_in: str):
    """The rerun of a preparation killed in `killed_in` (no longer failing) tokenizes only
    the validation split, whose preparation never began, and equals a clean run."""
    count_calls(monkeypatch, prepared_writer, killed_in)
    written = count_calls(monkeypatch, prepared_writer, "_write_part")
    prepare(corpus, workdir, **QUIET)
    assert [os.path.relpath(p, os.path.join(workdir, "prepared")) for p in written] == [
        "validation.partial/part-00000.npz"]
    assert_equal_to_the_clean_run(run, workdir)


def test_a_kill_before_the_parts_are_joined_keeps_every_part_the_short_last_one_too(
        corpus, run, tmp_path, monkeypatch):
    """Killed once the last of the 5 parts (29 pairs, not 100) was written: the rerun finds
    every part whole and tokenizes none of them again, only the validation split."""
    workdir = killed_preparation(corpus, tmp_path, monkeypatch, "_join_parts", 0)
    parts = sorted(os.listdir(tmp_path / "run" / "prepared" / "train.partial"))
    assert [name for name in parts if name.startswith("part-")] == [
        f"part-0000{k}.npz" for k in range(5)]
    rerun_tokenizes_validation_alone(corpus, run, workdir, monkeypatch, "_join_parts")


def test_worker_processes_prepare_the_same_ids_and_end_with_a_kill(corpus, run, tmp_path,
                                                                    monkeypatch):
    """Splits encoded by 3 worker processes (pieces of 33, 33 and 34 pairs, 9, 10 and 10 in
    the last part of train, 13, 13 and 14 in validation) give the ids encoded in process,
    byte for byte; a kill after the first part leaves no worker running, and the rerun
    completes it."""
    pools = count_calls(monkeypatch, prepared_writer, "encode_in_processes")
    workdir = killed_preparation(corpus, tmp_path, monkeypatch, "_write_part", 1,
                                 processes=3)
    assert len(pools) == 1 and not multiprocessing.active_children()
    count_calls(monkeypatch, prepared_writer, "_write_part")  # no longer failing
    _, splits = prepare(corpus, workdir, **QUIET, processes=3)
    assert len(pools) == 3  # train again, then validation
    assert_equal_to_the_clean_run(run, workdir)
    for split in ("train", "validation"):
        assert splits[split].manifest == run[2][split].manifest


@pytest.mark.parametrize("cores, pairs, processes, expected", [
    (64, 250_000, None, 32),  # one per core, at most MAX_PROCESSES
    (16, 250_000, None, 16),
    (16, 249_999, None, 0),  # too small to be worth starting them
    (1, 4_500_000, None, 0),  # one worker would only wait for the other
    (16, 100, 5, 5),  # asked for: whatever the size
    (16, 4_500_000, 1, 0),
    (16, 4_500_000, 0, 0),
])
def test_how_many_worker_processes_tokenize_a_split(monkeypatch, cores, pairs, processes,
                                                     expected):
    monkeypatch.setattr(prepared_writer, "usable_cores", lambda: cores)
    assert prepared_writer.worker_processes(pairs, processes) == expected


@pytest.mark.parametrize("start, stop, count, sizes", [
    (0, 100, 3, [33, 33, 34]),
    (300, 329, 3, [9, 10, 10]),
    (0, 32, 16, [2] * 16),  # an exact multiple
    (5, 7, 4, [1, 1]),  # fewer pairs than processes: no empty piece
])
def test_pieces_differ_by_one_pair_at_most_and_cover_the_part(start, stop, count, sizes):
    pieces = prepared_writer._pieces(start, stop, count)
    assert [b - a for a, b in pieces] == sizes
    assert pieces[0][0] == start and pieces[-1][1] == stop
    assert all(a1 == b0 for (_, b0), (a1, _) in zip(pieces, pieces[1:]))


def test_worker_processes_exit_when_their_caller_is_killed(run, tmp_path):
    """kill -9 of the process that started the workers, while they encode: they exit too,
    instead of waiting on its queues for good."""
    script = tmp_path / "encode.py"
    script.write_text(
        "import multiprocessing, sys, threading, time\n"
        "import numpy as np\n"
        "from transformer_jax.data.parallel_encoding import encode_in_processes\n"
        "from transformer_jax.data.tokenizer import Tokenizer\n"
        "tokenizer = Tokenizer.load(sys.argv[1])\n"
        "batches = [['siebenhundertdreiundzwanzig'] * 200_000] * 50\n"
        "threading.Thread(target=lambda: list(encode_in_processes(\n"
        "    tokenizer, batches, dtype=np.int32, add_eos=True, processes=2)),\n"
        "    daemon=True).start()\n"
        "while len(multiprocessing.active_children()) < 2:\n"
        "    time.sleep(0.05)\n"
        "print(*(p.pid for p in multiprocessing.active_children()), flush=True)\n"
        "time.sleep(300)\n")
    caller = subprocess.Popen([sys.executable, str(script),
                               os.path.join(run[0], "tokenizer.model")],
                              stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(pid) for pid in caller.stdout.readline().split()]
    finally:
        caller.kill()
        caller.wait()
    assert len(workers) == 2
    assert not still_running(workers, seconds=30)


def test_a_worker_that_dies_is_a_data_error_and_leaves_no_worker(run):
    """A worker killed while it encodes (as the out-of-memory killer would): the caller gets
    a DataError that says what to do, and the other worker is stopped."""
    before = {child.pid for child in multiprocessing.active_children()}  # not this pool's

    def kill_a_worker():
        while len(workers := [child for child in multiprocessing.active_children()
                              if child.pid not in before]) < 2:
            time.sleep(0.05)
        os.kill(workers[0].pid, signal.SIGKILL)

    encoded = encode_in_processes(run[1], [["siebenhundertdreiundzwanzig"] * 200_000] * 50,
                                  dtype=np.int32, add_eos=True, processes=2)
    killer = threading.Thread(target=kill_a_worker, daemon=True)
    killer.start()
    with pytest.raises(DataError, match=r"a worker process tokenizing the corpus died .* "
                                        r"fewer processes"):
        list(encoded)
    killer.join()
    assert not {child.pid for child in multiprocessing.active_children()} - before


def test_worker_processes_do_not_run_a_script_without_a_main_guard(corpus, run, tmp_path):
    """A script that calls prepare at its top level, with no `if __name__ == "__main__":`,
    runs once: spawned workers do not import it (they would prepare again, and fail)."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from transformer_jax.data.prepared import prepare\n"
        "from transformer_jax.run_config import data_fields\n"
        f"config = data_fields(dataset={corpus.dataset!r}, vocab_size={VOCAB_SIZE})\n"
        f"_, splits = prepare(config, {str(tmp_path / 'run')!r}, processes=2)\n"
        "print('prepared', len(splits['train']), 'pairs')\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("prepared train") == 1 and "2 worker processes" in done.stdout
    assert done.stdout.count("prepared 429 pairs") == 1
    np.testing.assert_array_equal(prepared_arrays(str(tmp_path / "run"), "train")["targets"],
                                  prepared_arrays(run[0], "train")["targets"])


def test_parts_made_from_other_files_are_not_reused(tmp_path, monkeypatch):
    """Killed, then the corpus changes: the rerun tokenizes every part anew, from the new text."""
    config = write_corpus(tmp_path / "corpus")
    workdir = killed_preparation(config, tmp_path, monkeypatch, "_write_part", 2)
    # Other pairs (the workdir's tokenizer is kept: its settings are the same).
    changed = list(reversed(PAIRS)) + [{"source": "null", "target": "nothing"}]
    write_corpus(tmp_path / "corpus", changed)
    written = count_calls(monkeypatch, prepared_writer, "_write_part")
    with pytest.warns(UserWarning, match="the training data changed since"):
        tokenizer, splits = prepare(config, workdir, **QUIET)
    assert len(written) == 5 + 1 and len(splits["train"]) == 430
    for i in (0, 1, 100, 199, 428, 429):
        assert splits["train"][i]["inputs"].tolist() == tokenizer.encode(
            changed[i]["source"], add_eos=True)


# --- a stale preparation ----------------------------------------------------------------------


def touch(path, seconds=1):
    """`path`'s modification time `seconds` later, its bytes as they were."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + seconds * 10**9))


def test_changed_files_make_a_split_stale(run, tmp_path):
    """The train files changed after preparing (even only touched): open_split refuses the
    split, naming the files; the unchanged validation split still opens."""
    folder = tmp_path / "corpus"
    config = write_corpus(folder)
    workdir = str(tmp_path / "run")
    tokenizer, _ = prepare(config, workdir, **QUIET)
    path = folder / "train.en"
    touch(path)
    with pytest.raises(DataError, match=r"prepared/train is stale \(") as e:
        open_split(config, workdir, "train", tokenizer)
    # The changed file alone, its size and time as a person reads them.
    assert re.search(rf"\({re.escape(str(path))}: prepared from 1[\d,]+ bytes of "
                     r"20\d\d-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}, now ", str(e.value))
    assert "train.de" not in str(e.value) and "tokenizer_sha256" not in str(e.value)
    assert len(open_split(config, workdir, "validation", tokenizer)) == len(VALIDATION)
    path.write_text(path.read_text().replace("one", "eins"))  # other text, other size
    with pytest.raises(DataError, match="train.en: prepared from"):
        open_split(config, workdir, "train", tokenizer)


def test_files_only_touched_are_tokenized_again_and_kept_while_the_ids_are_the_same(
        tmp_path, monkeypatch):
    """prepare, where a split's files changed their times alone (touched, copied without
    -p): the split tokenized again beside it gives the same ids, so it is kept and its
    record takes the new times (the next prepare tokenizes nothing); a file of the same size
    but other text gives other ids, and the split is refused as stale, as it was."""
    folder = tmp_path / "corpus"
    config = write_corpus(folder)
    workdir = tmp_path / "run"
    tokenizer, _ = prepare(config, str(workdir), **QUIET)
    before = {split: prepared_arrays(workdir, split) for split in ("train", "validation")}
    for name in ("train.en", "validation.de"):
        touch(folder / name)
    lines = []
    # The tokenizer sees the touched train file too: it trains anew, the same model.
    with pytest.warns(UserWarning, match="the training data changed since"):
        again, splits = prepare(config, str(workdir), log=lines.append)
    assert again.sha256 == tokenizer.sha256
    for split in ("train", "validation"):
        assert [line for line in lines if line.startswith(f"prepared {split}:")] == [
            f"prepared {split}: its corpus files' times changed since (touched or copied); "
            f"tokenizing it again to compare the ids",
            f"prepared {split}: the same ids; kept, with the files' new times"]
        after = prepared_arrays(workdir, split)
        assert all(np.array_equal(before[split][k], after[k]) for k in after)
        recorded = json.loads((workdir / "prepared" / split / "manifest.json").read_text())
        assert [entry[2] for entry in recorded["made_from"]["files"]] == [
            (folder / f"{split}.{lang}").stat().st_mtime_ns for lang in ("de", "en")]
    assert sorted(os.listdir(workdir / "prepared")) == ["train", "validation"]
    writes = count_calls(monkeypatch, prepared_module, "write_split")
    lines.clear()
    left = workdir / "prepared" / "train.again.partial"  # a comparison a kill cut short
    left.mkdir()
    (left / "part-00000.npz").write_bytes(b"cut")
    prepare(config, str(workdir), log=lines.append)
    assert writes == [] and lines == [] and not left.exists()
    path = folder / "validation.en"
    text = path.read_text()
    assert "one" in text
    path.write_text(text.replace("one", "uno"))  # the same size, other text
    touch(path)
    lines.clear()
    with pytest.raises(DataError, match=r"prepared/validation is stale \(.*validation\.en: "):
        prepare(config, str(workdir), log=lines.append)
    assert lines == ["prepared validation: its corpus files' times changed since (touched or "
                     "copied); tokenizing it again to compare the ids",
                     "prepared validation: other ids: the text changed"]
    assert sorted(os.listdir(workdir / "prepared")) == ["train", "validation"]
    after = prepared_arrays(workdir, "validation")
    assert all(np.array_equal(before["validation"][k], after[k]) for k in after)


def test_a_moved_corpus_is_the_same_dataset_until_a_file_changes(tmp_path, monkeypatch):
    """A corpus folder moved (mv keeps the files' times) after preparing: a run given its new
    path reuses its tokenizer and prepared ids, reading no text; it was refused as another
    dataset, and then as stale with every file named at the same size and time. A file
    touched in the new place (as a copy without -p) is tokenized again and kept, the split's
    record taking the new place; a file of other text is refused, naming it and both
    places."""
    config = write_corpus(tmp_path / "corpus")
    workdir = str(tmp_path / "run")
    tokenizer, splits = prepare(config, workdir, **QUIET)
    ids = [splits["train"][i]["targets"].tolist() for i in (0, 100)]
    (tmp_path / "corpus").rename(tmp_path / "moved")
    moved = data_fields(**{**config, "dataset": f"folder:{tmp_path / 'moved'}"})
    read = count_calls(monkeypatch, prepared_module, "load_split")
    again, splits = prepare(moved, workdir, **QUIET)
    assert again.sha256 == tokenizer.sha256 and read == []
    assert [splits["train"][i]["targets"].tolist() for i in (0, 100)] == ids
    path = tmp_path / "moved" / "validation.de"
    touch(path)
    lines = []
    prepare(moved, workdir, log=lines.append)
    assert lines == ["prepared validation: its corpus files' times changed since (touched or "
                     "copied); tokenizing it again to compare the ids",
                     "prepared validation: the same ids; kept, with the files' new times"]
    recorded = json.loads((tmp_path / "run" / "prepared" / "validation" / "manifest.json")
                          .read_text())["made_from"]
    assert recorded["dataset"] == f"folder:{tmp_path / 'moved'}"
    (tmp_path / "moved").rename(tmp_path / "again")
    path = tmp_path / "again" / "validation.de"
    path.write_text(path.read_text() + "eins\n")
    again = data_fields(**{**config, "dataset": f"folder:{tmp_path / 'again'}"})
    with pytest.raises(DataError) as error:
        prepare(again, workdir, **QUIET)
    assert re.search(rf"validation is stale \(dataset: prepared from 'folder:"
                     rf"{re.escape(str(tmp_path / 'moved'))}', now 'folder:"
                     rf"{re.escape(str(tmp_path / 'again'))}'; {re.escape(str(path))}: "
                     r"prepared from [\d,]+ bytes of [^,]+, now [\d,]+ bytes of [^,]+\)\. ",
                     str(error.value)), str(error.value)


def test_a_copy_of_a_corpus_still_in_place_is_the_same_dataset_and_rewrites_no_record(
        tmp_path, monkeypatch):
    """A corpus copied without its times while the original stays as recorded (the copy
    given once, say to show a split with the run's tokenizer): its files equal the
    original's byte for byte, so the tokenizer and the prepared ids are used as they are,
    no text is read or tokenized, and the run's records still name the original. Before,
    the tokenizer was trained again and its record rewritten to name the copy, and the
    next start from the original trained it again. A copied file of the same size but
    other text, or an original touched since, and the copy is not taken for the same."""
    config = write_corpus(tmp_path / "corpus")
    workdir = tmp_path / "run"
    tokenizer, _ = prepare(config, str(workdir), **QUIET)
    records = [workdir / "tokenizer.model.json",
               *(workdir / "prepared" / split / "manifest.json" for split in ("train",
                                                                           "validation"))]
    before = [path.read_bytes() for path in records]
    shutil.copytree(tmp_path / "corpus", tmp_path / "copy", copy_function=shutil.copyfile)
    for path in (tmp_path / "copy").iterdir():
        touch(path, seconds=5)  # the copy's times are not the original's
    copy = data_fields(**{**config, "dataset": f"folder:{tmp_path / 'copy'}"})
    read = count_calls(monkeypatch, prepared_module, "load_split")
    trained = count_calls(monkeypatch, vocabulary, "train_tokenizer")
    lines = []
    again, splits = prepare(copy, str(workdir), log=lines.append)
    assert again.sha256 == tokenizer.sha256 and read == trained == []
    assert [path.read_bytes() for path in records] == before
    assert lines == []  # not "tokenizing it again to compare the ids"
    assert splits["validation"][0]["targets"].tolist() == tokenizer.encode(
        VALIDATION[0]["target"], add_eos=True)
    # Other text in a copied file of the same size: the validation ids are compared, and
    # refused as stale (the training files are still a copy: no tokenizer trained).
    path = tmp_path / "copy" / "validation.en"
    text = path.read_text()
    path.write_text(text.replace("one", "two", 1))
    with pytest.raises(DataError, match=r"validation is stale \(dataset: prepared from "):
        prepare(copy, str(workdir), log=lines.append)
    assert trained == [] and lines[-1] == "prepared validation: other ids: the text changed"
    path.write_text(text)
    touch(tmp_path / "copy" / "validation.en", seconds=10)
    # The original touched: the copy is no longer of a folder as recorded, and is taken
    # for the folder moved (the ids compared and kept, the records taking the copy).
    touch(tmp_path / "corpus" / "train.de")
    with pytest.warns(UserWarning, match="the training data changed since"):
        prepare(copy, str(workdir), **QUIET)
    assert len(trained) == 1
    assert json.loads(records[0].read_text())["dataset"] == f"folder:{tmp_path / 'copy'}"


def test_another_tokenizer_or_direction_makes_a_split_stale(corpus, run, tmp_path):
    """Ids prepared with one tokenizer are refused with another, naming its SHA-256; and
    with the languages swapped, naming the languages."""
    workdir, tokenizer, _ = run
    other, _ = prepare(data_fields(**{**corpus, "vocab_size": VOCAB_SIZE - 60}),
                       str(tmp_path / "other"), splits=("validation",), **QUIET)
    assert other.model_proto != tokenizer.model_proto
    with pytest.raises(DataError, match=r"stale \(tokenizer_sha256: prepared from '[0-9a-f]{64}'"):
        open_split(corpus, workdir, "train", other)
    swapped = data_fields(**{**corpus, "source_lang": "en", "target_lang": "de"})
    with pytest.raises(DataError, match=r"languages: prepared from \['de', 'en'\], "
                                        r"now \['en', 'de'\]\)"):
        open_split(swapped, workdir, "validation", tokenizer)
    assert len(open_split(corpus, workdir, "train", tokenizer)) == len(PAIRS)


# --- a second prepare -------------------------------------------------------------------------


def test_a_second_prepare_reads_and_tokenizes_nothing(corpus, run, monkeypatch):
    """With the tokenizer and every split prepared, prepare neither reads the text nor
    trains nor tokenizes, and returns the same ids."""
    workdir, tokenizer, splits = run

    def fail(*args, **kwargs):
        raise AssertionError("prepare read or tokenized again")

    monkeypatch.setattr(prepared_module, "load_split", fail)
    monkeypatch.setattr(Tokenizer, "encode_batch", fail)
    monkeypatch.setattr("transformer_jax.data.vocabulary.train_tokenizer", fail)
    again_tokenizer, again = prepare(corpus, workdir, **QUIET)
    assert again_tokenizer.model_proto == tokenizer.model_proto
    for split in ("train", "validation"):
        assert len(again[split]) == len(splits[split])
        for side in ("inputs", "targets"):
            np.testing.assert_array_equal(again[split].lengths(side), splits[split].lengths(side))
        np.testing.assert_array_equal(again[split][7]["targets"], splits[split][7]["targets"])


def test_prepare_redoes_only_the_missing_split(corpus, run, tmp_path, monkeypatch):
    """Validation deleted: prepare reads only the validation text and tokenizes only it."""
    workdir = str(tmp_path / "run")
    shutil.copytree(run[0], workdir)
    shutil.rmtree(os.path.join(workdir, "prepared", "validation"))
    read = []
    original = prepared_module.load_split
    monkeypatch.setattr(prepared_module, "load_split",
                        lambda config, split: read.append(split) or original(config, split))
    written = count_calls(monkeypatch, prepared_writer, "_write_part")
    prepare(corpus, workdir, **QUIET)
    assert read == ["validation"] and len(written) == 1
    clean = prepared_arrays(run[0], "validation")
    for name, array in prepared_arrays(workdir, "validation").items():
        np.testing.assert_array_equal(array, clean[name])


# --- damaged files ------------------------------------------------------------------------------


def assert_equal_to_the_clean_run(run, workdir, splits=("train", "validation")):
    for split in splits:
        clean = prepared_arrays(run[0], split)
        for name, array in prepared_arrays(workdir, split).items():
            assert array.dtype == clean[name].dtype
            np.testing.assert_array_equal(array, clean[name], err_msg=f"{split} {name}")


def damage(path, how):
    """Damages the file at `path` as a power cut or a disk error might."""
    data = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "cut":
        path.write_bytes(data[:len(data) // 2])
    elif how == "flipped":  # one bit of the data, past the headers
        at = len(data) // 2
        path.write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1:])
    elif how == "zeroed":  # the same size, the data zeros (its blocks never written)
        path.write_bytes(data[:128] + bytes(len(data) - 128))


@pytest.mark.parametrize("how", ["empty", "cut", "flipped"])
def test_a_damaged_part_is_tokenized_again(corpus, run, tmp_path, monkeypatch, how):
    """A whole part of a killed preparation, damaged before the rerun: a warning names it,
    it is tokenized again (with the parts never written), and the ids equal a clean run's."""
    workdir = killed_preparation(corpus, tmp_path, monkeypatch, "_write_part", 2)
    partial = tmp_path / "run" / "prepared" / "train.partial"
    damage(partial / "part-00000.npz", how)
    written = count_calls(monkeypatch, prepared_writer, "_write_part")
    with pytest.warns(UserWarning, match=r"train\.partial/part-00000\.npz is damaged \(.+\); "
                                         r"tokenizing its 100 pairs again"):
        _, splits = prepare(corpus, workdir, **QUIET)
    assert [os.path.basename(p) for p in written] == [
        f"part-0000{k}.npz" for k in (0, 2, 3, 4)] + ["part-00000.npz"]  # validation's last
    assert_equal_to_the_clean_run(run, workdir)
    assert splits["train"].manifest == run[2]["train"].manifest


def test_a_whole_part_of_other_pairs_is_tokenized_again(corpus, run, tmp_path, monkeypatch):
    """A part that reads whole but holds 50 pairs, not its 100 (written with other parts'
    sizes, say): a warning says so, it is tokenized again, and the ids equal a clean run's."""
    workdir = killed_preparation(corpus, tmp_path, monkeypatch, "_write_part", 2)
    path = tmp_path / "run" / "prepared" / "train.partial" / "part-00000.npz"
    with np.load(path) as part:
        arrays = {name: part[name] for name in part.files}
    for side in ("inputs", "targets"):
        arrays[f"{side}_lengths"] = arrays[f"{side}_lengths"][:50]
        arrays[side] = arrays[side][:arrays[f"{side}_lengths"].sum()]
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    count_calls(monkeypatch, prepared_writer, "_write_part")  # no longer failing
    with pytest.warns(UserWarning, match=r"train\.partial/part-00000\.npz is damaged \(its "
                                         r"inputs are not 100 pairs of uint16 ids\); "
                                         r"tokenizing its 100 pairs again"):
        prepare(corpus, workdir, **QUIET)
    assert_equal_to_the_clean_run(run, workdir)


DAMAGED_FILES = [("inputs.npy", "cut"), ("inputs.npy", "empty"), ("targets.npy", "cut"),
                 ("targets_offsets.npy", "cut"), ("inputs_offsets.npy", "zeroed"),
                 ("manifest.json", "cut"), ("manifest.json", "empty"), ("manifest.json", None)]


@pytest.mark.parametrize("name,how", DAMAGED_FILES)
def test_a_damaged_prepared_file_is_named_and_prepared_again(corpus, run, tmp_path,
                                                             monkeypatch, name, how):
    """open_split alone: one error naming the file and what to do. prepare (train.py, the
    data command): a warning naming it, the split prepared again, equal to a clean run;
    the other split is neither read nor tokenized."""
    workdir = tmp_path / "run"
    shutil.copytree(run[0], workdir)
    path = workdir / "prepared" / "train" / name
    if how is None:
        path.unlink()
    else:
        damage(path, how)
    tokenizer = run[1]
    if how is not None:
        with pytest.raises(DataError, match=rf"prepared/train/{name} is damaged \(.+\): delete "
                                            rf".*prepared/train and run python -m "
                                            rf"transformer_jax\.data prepare") as error:
            open_split(corpus, str(workdir), "train", tokenizer)
        assert "\n" not in str(error.value)
    read = []
    original = prepared_module.load_split
    monkeypatch.setattr(prepared_module, "load_split",
                        lambda config, split: read.append(split) or original(config, split))
    with pytest.warns(UserWarning, match=rf"prepared/train/{name} is damaged \(.+\); "
                                         r"preparing train again"):
        prepare(corpus, str(workdir), **QUIET)
    assert read == ["train"]
    assert_equal_to_the_clean_run(run, str(workdir))
    assert sorted(os.listdir(workdir / "prepared")) == ["train", "validation"]


@pytest.mark.parametrize("name, edit", [
    ("inputs_offsets.npy", "from 1"), ("targets_offsets.npy", "an empty pair"),
    ("targets.npy", "one id fewer"), ("manifest.json", "pairs null")])
def test_a_whole_file_that_does_not_fit_its_split_is_named(corpus, run, tmp_path, name, edit):
    """Files that read whole (NumPy and JSON parse them) but do not hold the split: offsets
    from 1 (pair 0 would lose its first id), a pair of no ids (not even its EOS), one id
    fewer than the manifest says, a pair count that is no number. open_split names the
    file, not another one, nor fails later with a TypeError or an IndexError."""
    workdir = tmp_path / "run"
    shutil.copytree(run[0], workdir)
    path = workdir / "prepared" / "train" / name
    if edit == "pairs null":
        manifest = json.loads(path.read_text())
        path.write_text(json.dumps({**manifest, "pairs": None}))
    else:
        array = np.load(path)
        if edit == "from 1":
            assert array[1] >= 2  # pair 0 keeps an id
            array[0] = 1
        elif edit == "an empty pair":
            array[1] = array[0]
        else:
            array = array[:-1]
        np.save(path, array)
    with pytest.raises(DataError, match=rf"prepared/train/{re.escape(name)} is damaged \(.+\): "
                                        r"delete "):
        open_split(corpus, str(workdir), "train", run[1])


def test_a_kill_while_moving_a_split_into_place_resumes_without_tokenizing(
        corpus, run, tmp_path, monkeypatch):
    """Killed after joining, while removing the parts (made_from.json already gone): the
    rerun finds the joined arrays whole and moves them into place, tokenizing nothing."""
    workdir = killed_preparation(corpus, tmp_path, monkeypatch, "_move_into_place", 0)
    partial = tmp_path / "run" / "prepared" / "train.partial"
    for name in ("made_from.json", "part-00000.npz", "part-00001.npz"):
        (partial / name).unlink()
    rerun_tokenizes_validation_alone(corpus, run, workdir, monkeypatch, "_move_into_place")
    assert sorted(os.listdir(tmp_path / "run" / "prepared" / "train")) == [
        "inputs.npy", "inputs_offsets.npy", "manifest.json", "targets.npy",
        "targets_offsets.npy"]


def test_joined_arrays_damaged_before_the_move_are_joined_again_from_the_parts(
        corpus, run, tmp_path, monkeypatch):
    """Killed as the joined split was to be moved into place, its offsets then zeroed (their
    blocks never written): the rerun does not move them into place but joins the whole
    parts again, tokenizing none of them."""
    workdir = killed_preparation(corpus, tmp_path, monkeypatch, "_move_into_place", 0)
    damage(tmp_path / "run" / "prepared" / "train.partial" / "inputs_offsets.npy", "zeroed")
    rerun_tokenizes_validation_alone(corpus, run, workdir, monkeypatch, "_move_into_place")


def test_a_damaged_split_that_is_also_stale_is_refused_not_prepared_again(tmp_path,
                                                                          monkeypatch):
    """The corpus changed and an array was damaged: the stale split is refused as before
    (a run's checkpoints were trained on its ids), not silently prepared from the new text,
    nor tokenized again to compare with the damaged ids."""
    folder = tmp_path / "corpus"
    config = write_corpus(folder)
    workdir = str(tmp_path / "run")
    prepare(config, workdir, **QUIET)
    damage(tmp_path / "run" / "prepared" / "train" / "inputs.npy", "cut")
    path = folder / "train.en"
    touch(path)
    writes = count_calls(monkeypatch, prepared_module, "write_split")
    with pytest.warns(UserWarning, match="training again gives the same model"):
        with pytest.raises(DataError, match=r"prepared/train is stale \(.*train\.en: prepared"):
            prepare(config, workdir, **QUIET)
    assert writes == []
    assert os.path.exists(os.path.join(workdir, "prepared", "train", "manifest.json"))


def test_a_full_disk_while_preparing_is_one_data_error(corpus, tmp_path, monkeypatch):
    """ENOSPC from a part's write was a 21-frame traceback from the data command and from
    train.py; it is a DataError (one line in both) that says a rerun keeps whole parts."""
    import errno

    where = str(tmp_path / "prepared" / "train.partial" / "part-00000.inputs.npy")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), where)

    monkeypatch.setattr(prepared_writer, "_write_parts", full)
    with pytest.raises(DataError) as error:
        prepare(corpus, str(tmp_path), **QUIET)
    assert str(error.value) == (f"preparing the data failed: {where}: No space left on device; "
                                f"free space or fix the permissions, and run again: what was "
                                f"prepared whole is kept")
    assert (tmp_path / "tokenizer.model").exists()  # made before: kept for the rerun


def test_a_test_split_that_cannot_be_read_is_said_before_training(tmp_path):
    """A folder corpus without test.en, or with misaligned test files, was found only by
    evaluate.py, after training."""
    config = write_corpus(tmp_path / "corpus")
    (tmp_path / "corpus" / "test.de").write_text("eins\nzwei\n")
    (tmp_path / "corpus" / "test.en").unlink()
    with pytest.warns(UserWarning) as caught:
        prepare(config, str(tmp_path / "run"), **QUIET)
    (warning,) = [w for w in caught if "test split" in str(w.message)]
    assert str(warning.message).startswith(
        "the test split cannot be read, and evaluate.py will need it after training: missing "
        f"{tmp_path / 'corpus' / 'test.en'}; ")
    (tmp_path / "corpus" / "test.en").write_text("one\n")
    shutil.rmtree(tmp_path / "run" / "prepared" / "validation")  # prepared again: checked
    with pytest.warns(UserWarning, match=re.escape(
            f"{tmp_path / 'corpus' / 'test.de'} has 2 lines but "
            f"{tmp_path / 'corpus' / 'test.en'} has 1")):
        prepare(config, str(tmp_path / "run"), **QUIET)


def test_a_missing_validation_file_is_said_before_the_training_split_is_read(tmp_path,
                                                                             monkeypatch):
    """The validation split's files are checked first: a missing one was found only after
    the whole training split had been read and tokenized."""
    config = write_corpus(tmp_path / "corpus")
    (tmp_path / "corpus" / "validation.en").unlink()
    read = count_calls(monkeypatch, prepared_module, "load_split")
    with pytest.raises(DataError, match=r"^missing .*validation\.en; .* \(empty validation "
                                        r"files train a run without evaluation\)$"):
        prepare(config, str(tmp_path / "run"), **QUIET)
    assert read == [] and not (tmp_path / "run" / "prepared").exists()


def test_closing_workers_with_full_buffers_ends_them_without_a_kill(run):
    """An iterator closed while its 2 grain workers' buffers are full (a run's last step,
    or a stop signal) ends them: each exits with status 0. With batches copied through the
    workers' pipes, a worker that put one more batch after grain emptied its queue waited at
    exit for a reader that never came, and grain killed it 25 s later (-9; 4 of 6 runs of
    train.py, 5 steps with num_workers=2, ended so)."""
    _, _, splits = run
    batches = iter(train_dataset(splits["train"], seed=7, num_workers=2, batch_size=128,
                                 max_source_length=64, max_target_length=64))
    try:
        next(batches)
        time.sleep(1)  # the workers fill their buffers and wait for room
        workers = multiprocessing.active_children()
    finally:
        batches.close()
    assert len(workers) == 2 and [w.exitcode for w in workers] == [0, 0]
