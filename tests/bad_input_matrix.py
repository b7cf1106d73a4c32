"""Bad configs and bad inputs through the command lines: is each one clear line, exit != 0?

    python tests/bad_input_matrix.py

Each case runs train.py, translate.py, evaluate.py or `python -m transformer_jax` (and
its data, benchmark and plot commands) with one bad value or one fault (a full disk,
/dev/full, Ctrl-C, too little memory) and passes when the command exits non-zero within
120 s, prints no traceback, and its last stderr line starts with "error" (absl's flag
errors: "FATAL Flags parsing error: ..." and a line pointing at --helpshort; argparse's:
"python -m transformer_jax...: error: ..."). Bad inputs to translate.py and evaluate.py use a
tiny run trained first. Not part of the test suite (a minute of process starts); its result is
in docs/faults.md.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config.model.d_model=32", "--config.model.d_ff=64", "--config.model.num_layers=2",
        "--config.data.numbers_size=small", "--config.decode.bleu_every_steps=0"]

BAD_CONFIGS = [f"--config.{c}" for c in (
    "num_train_steps=0", "num_train_steps=-5", "per_device_batch_size=0",
    "per_device_batch_size=-1", "accumulation_steps=0", "log_every_steps=0",
    "eval_every_steps=0", "checkpoint_every_steps=0", "checkpoints_to_keep=0", "seed=-1",
    "num_eval_batches=-2", "loss_chunk_size=-1", "parallelism=mpi", "data.too_long=wrap",
    "data.numbers_size=medium",
    "data.max_source_length=0", "data.max_target_length=1", "data.num_workers=-1",
    "decode.beam_size=0", "decode.alpha=-0.5", "decode.bleu_every_steps=-1",
    "decode.max_extra_length=-1", "decode.bleu_examples=0", "model.num_heads=5",
    "model.d_model=0", "model.num_layers=0", "model.dropout_rate=1.5",
    "model.attention_implementation=cudnn", "model.attention_implementation=flash",
    "optim.warmup_steps=0", "num_train_stepz=5", "data.batching=sorted",
    "data.tokens_per_batch=25000", "data.tokens_per_batch=-1", "data.num_buckets=0",
    "data.dataset=wmt14", "model.preset=tiny", "model.layer_norm_epsilon=0")] + [
    "--config.per_device_batch_size=0 --config.data.tokens_per_batch=20",
    "--config.model.attention_dropout_rate=0.1 --config.model.attention_implementation=xla",
    "--config=configs/missing.py"]


def write_inputs(scratch) -> None:
    """The bad files: invalid UTF-8, corpora whose train.de is a folder or a FIFO, and
    input long enough to be interrupted."""
    with open(os.path.join(scratch, "bad.txt"), "wb") as f:
        f.write(b"drei\nzw\xffei\n")
    for corpus in ("dir_corpus", "fifo_corpus"):
        os.makedirs(os.path.join(scratch, corpus))
        with open(os.path.join(scratch, corpus, "train.en"), "w") as f:
            f.write("one\n")
    os.makedirs(os.path.join(scratch, "dir_corpus", "train.de"))
    os.mkfifo(os.path.join(scratch, "fifo_corpus", "train.de"))
    with open(os.path.join(scratch, "many.txt"), "w") as f:
        f.write("dreihundertzweiundvierzig\n" * 20_000)


def blank_run(workdir, scratch) -> None:
    """scratch/blank_run: `workdir` with its checkpoints pointed at a folder corpus whose
    test split has no pair with text on both sides."""
    corpus, run = os.path.join(scratch, "blank_corpus"), os.path.join(scratch, "blank_run")
    shutil.copytree(workdir, run)
    os.makedirs(corpus)
    for split in ("train", "validation", "test"):
        for lang, text in (("de", "eins\n \n"), ("en", "\none\n")):
            with open(os.path.join(corpus, f"{split}.{lang}"), "w") as f:
                f.write(text)
    for path in glob.glob(os.path.join(run, "checkpoints", "*", "metadata", "metadata")):
        with open(path) as f:
            metadata = json.load(f)
        metadata["config"]["data"]["dataset"] = f"folder:{corpus}"
        with open(path, "w") as f:
            json.dump(metadata, f)


def bad_inputs(workdir, scratch):
    """(name, command, stdin) of translate.py, evaluate.py and the data CLI."""
    write_inputs(scratch)
    # A full disk: files end at 100 bytes (writes past it fail with EFBIG).
    full = [sys.executable, "-c", "import os, resource, sys; resource.setrlimit("
            "resource.RLIMIT_FSIZE, (100, 100)); os.execv(sys.argv[1], sys.argv[1:])"]
    def ctrl_c(started: str) -> list[str]:
        """Ctrl-C once the shell test `started` holds (job control on, so the background
        job takes SIGINT); stderr is in ctrl_c.err."""
        return ["bash", "-c", f'set -m; "$@" 2>{scratch}/ctrl_c.err & until {started} || '
                f'! kill -0 $!; do sleep 0.2; done; kill -INT $!; wait $!; status=$?; '
                f'cat {scratch}/ctrl_c.err >&2; exit $status', "bash"]

    os.makedirs(os.path.join(scratch, "fifo_run"))
    os.mkfifo(os.path.join(scratch, "fifo_run", "metrics.jsonl"))
    blank_run(workdir, scratch)
    t = [sys.executable, "translate.py", f"--workdir={workdir}"]
    x = [sys.executable, "-m", "transformer_jax.export", f"--workdir={workdir}"]
    hlo = os.path.join(scratch, "hlo")
    subprocess.run([*x, "--format=stablehlo", f"--output={hlo}", "--batch_sizes=1",
                    "--lengths=16"], cwd=ROOT, capture_output=True, check=True)
    damaged = {}
    for name, damage in (("no artifact", lambda d: os.remove(f"{d}/greedy_b1_s16.jaxexport")),
                         ("params not npz", lambda d: open(f"{d}/params.npz", "w").close())):
        damaged[name] = os.path.join(scratch, name.replace(" ", "_"))
        subprocess.run(["cp", "-r", hlo, damaged[name]], check=True)
        damage(damaged[name])
    s = [sys.executable, "translate.py", "--engine=stablehlo", "--beam_size=1"]
    e = [sys.executable, "evaluate.py", f"--workdir={workdir}"]
    d = [sys.executable, "-m", "transformer_jax.data", "--config=configs/default.py",
         "--config.data.numbers_size=small"]
    return [
        ("no checkpoints", [*t[:2], f"--workdir={scratch}/empty"], ""),
        ("missing input", [*t, f"--input={scratch}/missing.txt"], ""),
        ("invalid UTF-8 file", [*t, f"--input={scratch}/bad.txt"], ""),
        ("invalid UTF-8 stdin", t, b"zw\xffei\n"),
        ("output is a folder", [*t, f"--output={scratch}"], "null\n"),
        ("checkpoint 3", [*t, "--checkpoint=3"], ""), ("checkpoint x", [*t, "--checkpoint=x"], ""),
        ("average:5", [*t, "--checkpoint=average:5"], ""),
        ("average:x", [*t, "--checkpoint=average:x"], ""),
        ("beam 0", [*t, "--beam_size=0"], ""), ("batch 0", [*t, "--batch_size=0"], ""),
        ("alpha -1", [*t, "--alpha=-1"], ""), ("extra -100", [*t, "--max_extra_length=-100"], ""),
        ("max input 0", [*t, "--max_input_length=0"], ""),
        ("too long", [*t, "--max_input_length=3"], "dreihundertzweiundvierzig " * 8 + "\n"),
        ("unknown flag", [*t, "--beam=4"], ""),
        ("workdir missing", t[:2], ""),
        ("output on a full disk", [*full, *t, f"--output={scratch}/out.txt"], "null\n" * 200),
        ("output /dev/full", [*t, "--output=/dev/full"], "null\n"),
        ("stdout /dev/full", ["bash", "-c", 'exec "$@" > /dev/full', "bash", *t], "null\n"),
        ("Ctrl-C while translating", [*ctrl_c(f"grep -q ^checkpoint {scratch}/ctrl_c.err"),
                                      *t, f"--input={scratch}/many.txt",
                                      f"--output={scratch}/out.txt"], ""),
        ("export: --force on the workdir", [*x, "--format=ctranslate2", f"--output={workdir}",
                                            "--force"], ""),
        ("export: --force on an empty --output", [*x, "--format=stablehlo", "--output=",
                                                  "--force"], ""),
        ("export: --lengths for ctranslate2", [*x, "--format=ctranslate2", "--lengths=8",
                                               f"--output={scratch}/ct"], ""),
        ("export: --batch_sizes=0", [*x, "--format=stablehlo", "--batch_sizes=0",
                                     f"--output={scratch}/h"], ""),
        ("Ctrl-C while exporting", [*ctrl_c(f"ls -d {scratch}/.h.partial-* >/dev/null 2>&1"),
                                    *x, "--format=stablehlo", f"--output={scratch}/h"], ""),
        ("stablehlo: an artifact missing", [*s, f"--exported={damaged['no artifact']}"],
         "null\n"),
        ("stablehlo: params.npz empty", [*s, f"--exported={damaged['params not npz']}"],
         "null\n"),
        ("evaluate: no checkpoints", [*e[:2], f"--workdir={scratch}/empty"], ""),
        ("evaluate: split", [*e, "--split=nonsense"], ""),
        ("evaluate: average 0", [*e, "--checkpoint=average:0"], ""),
        ("evaluate: average 5", [*e, "--checkpoint=average:5"], ""),
        ("evaluate: both spellings", [*e, "--checkpoint=2", "--average_last=2"], ""),
        ("evaluate: beam 0", [*e, "--beam_size=0"], ""),
        ("evaluate: results on a full disk", [*full, *e, "--split=validation"], ""),
        ("evaluate: --dataset of no known kind", [*e, "--dataset=books"], ""),
        ("evaluate: --dataset folder missing", [*e, f"--dataset=folder:{scratch}/gone"], ""),
        ("evaluate: --dataset without the split", [*e, f"--dataset=folder:{scratch}/empty"],
         ""),
        ("translate: a folder of runs", [*t[:2], f"--workdir={os.path.dirname(workdir)}"], ""),
        ("train.py: a misspelt config file", [sys.executable, "train.py",
                                              "--config=configs/defualt.py",
                                              f"--workdir={scratch}/x"], ""),
        ("train.py: a new run's corpus missing", [sys.executable, "train.py",
                                                  f"--workdir={scratch}/new",
                                                  "--config.data.dataset=folder:/nonexistent"],
         ""),
        ("data: train.de is a directory", [*d, f"--config.data.dataset=folder:{scratch}/"
                                                "dir_corpus"], ""),
        ("data: train.de is a FIFO", [*d, f"--config.data.dataset=folder:{scratch}/fifo_corpus"],
         ""),
        ("data: missing folder", [*d, "--config.data.dataset=folder:/nonexistent"], ""),
        ("data: empty folder", [*d, f"--config.data.dataset=folder:{scratch}/empty"], ""),
        ("data: unknown TFDS", [*d, "--config.data.dataset=tfds:no_such_dataset"], ""),
        ("data: unknown kind", [*d, "--config.data.dataset=ftp:x"], ""),
        ("data: numbers medium", [*d, "--config.data.numbers_size=medium"], ""),
        ("data: bad split", [*d, "--split=nonsense"], ""),
        ("data: show -1", [*d, "--show=-1"], ""),
        ("data: unknown flag", [*d, "--sauce=numbers"], ""),
        ("data: misspelt command", [*d, "preapre"], ""),
        ("data: prepare without workdir", [*d, "prepare"], ""),
        ("data: no config", d[:3], ""),
        ("data: workdir is a file", [*d, f"--workdir={scratch}/bad.txt"], ""),
        ("train.py: a positional argument", [sys.executable, "train.py",
                                             f"--workdir={scratch}/x", "configs/default.py"], ""),
        ("alpha nan", [*t, "--alpha=nan"], ""),
        ("main: batch 0", [sys.executable, "-m", "transformer_jax", "--batch=0"], ""),
        ("main: out of memory", [sys.executable, "-m", "transformer_jax", "--batch=64",
                                 "--length=100000"], ""),
        ("benchmark: workdir untrained", [sys.executable, "-m", "transformer_jax.benchmark",
                                          "decode", "--peers", f"--workdir={scratch}"], ""),
        ("plot: no metrics", [sys.executable, "-m", "transformer_jax.plot", scratch], ""),
        ("plot: a run twice", [sys.executable, "-m", "transformer_jax.plot", workdir,
                               f"{workdir}/"], ""),
        ("plot: metrics a FIFO", [sys.executable, "-m", "transformer_jax.plot",
                                  f"{scratch}/fifo_run"], ""),
        ("main: vocabulary past int32", [sys.executable, "-m", "transformer_jax",
                                         "--vocab_size=10000000000"], ""),
        ("main: parameters out of memory", [sys.executable, "-m", "transformer_jax",
                                            "--vocab_size=2000000000"], ""),
        ("benchmark: pipeline --profile", [sys.executable, "-m", "transformer_jax.benchmark",
                                           "pipeline", f"--profile={scratch}/p"], ""),
        ("benchmark: --json empty", [sys.executable, "-m", "transformer_jax.benchmark",
                                     "loss", "--json="], ""),
        ("benchmark: --from-json not JSON", [sys.executable, "-m", "transformer_jax.benchmark",
                                             "loss", "--from-json=README.md"], ""),
        ("benchmark: --from-json another suite's", [
            sys.executable, "-m", "transformer_jax.benchmark", "decode",
            "--from-json=benchmarks/h100/attention.json"], ""),
        ("evaluate: nothing to score", [*e, f"--workdir={scratch}/blank_run"], ""),
        ("train.py: --process_id alone", [sys.executable, "train.py", f"--workdir={scratch}/x",
                                          "--process_id=1"], ""),
        ("train.py: no process 0", [sys.executable, "train.py", f"--workdir={scratch}/x",
                                    "--coordinator_address=localhost:1", "--num_processes=2",
                                    "--process_id=1", "--initialization_timeout=2"], ""),
    ]


def check(name, command, stdin) -> str:
    """"" when the case passes, else why not."""
    try:
        done = subprocess.run(command, cwd=ROOT, input=stdin, capture_output=True, timeout=120,
                              text=not isinstance(stdin, bytes))
    except subprocess.TimeoutExpired:
        return "hung (120 s)"
    err = done.stderr if isinstance(done.stderr, str) else done.stderr.decode(errors="replace")
    last = err.strip().splitlines()[-1] if err.strip() else ""
    if done.returncode == 0:
        return "exit 0"
    if "Traceback" in err:
        return "traceback: " + last[:150]
    if "\nflags:\n" in err:  # absl's app.UsageError: the module's docstring and every flag
        return "help text, then: " + last[:150]
    flag_error = "FATAL Flags parsing error" in err and last.startswith("Pass --helpshort")
    usage_error = last.startswith("python -m transformer_jax") and ": error: " in last
    if not (last.startswith("error") or flag_error or usage_error):  # absl's: 2 lines
        return "last line: " + last[:150]
    return ""


def main() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        os.makedirs(os.path.join(scratch, "empty"))
        workdir = os.path.join(scratch, "run")
        subprocess.run([sys.executable, "train.py", "--config=configs/default.py",
                        f"--workdir={workdir}", *TINY, "--config.num_train_steps=2"],
                       cwd=ROOT, capture_output=True, check=True)
        cases = [(flag, [sys.executable, "train.py", f"--workdir={scratch}/bad", *TINY,
                         *flag.split()], "")
                 for flag in BAD_CONFIGS] + bad_inputs(workdir, scratch)
        failed = [(name, why) for name, command, stdin in cases
                  if (why := check(name, command, stdin))]
    configs = len(BAD_CONFIGS)
    print(f"{configs} bad configs, {len(cases) - configs} bad inputs: "
          f"{len(cases) - len(failed)} of {len(cases)} one clear line, exit != 0, none hangs")
    for name, why in failed:
        print(f"  FAILED {name}: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
