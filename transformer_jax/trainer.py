"""The training loop: wires data, model, optimizer, parallel steps, checkpoints and logs.

    train(config, workdir)  # what `python train.py --config=... --workdir=...` runs

The first start prepares the data (DIR/prepared: the training and validation
splits as the tokenizer's ids, `python -m transformer_jax.data prepare`); later
starts only open it.
Restarting the same command resumes from the latest checkpoint in
DIR/checkpoints, exactly: the state, the data iterator and the dropout keys
(derived from seed and step) continue where they stopped; a damaged latest
checkpoint is moved aside and the one before it used. SIGTERM or Ctrl-C
finishes the current step, saves, and returns. DIR/train.lock keeps a second
run off the same workdir.

A config changed between two starts never costs the run its checkpoints (they
are only moved aside when their files are damaged):
  - another model, a setting of the vocabulary (checked before the data is prepared),
    or an optim setting that changes the optimizer state's tree (grad_clip_norm 0 <-> > 0):
    a ConfigError names the settings, saved and new, before anything compiles; nothing
    is moved, metrics.jsonl is untouched.
    Other settings (learning_rate_scale, num_train_steps, intervals...) resume, and so
    do the model's dtype, dropout and attention implementation, named in one line.
  - another kind of data iterator (data.batching, data.num_workers), or a
    checkpoint of an older version without the data position: the state
    resumes, and the training data starts a new shuffle, seeded from (seed,
    restored step) so that it does not replay the first steps' batches; one
    warning names the setting (or the reason).

Watching the speed: each training record has `steps_per_sec` beside `tokens_per_sec`
(rates that leave out a run's first step, which waits for compiling, and the profiled
steps below), the first step's line says how long the start took (data, compiling), and
`config.profile_steps=N` traces N steps of the run (after its first 10) into
DIR/plugins/profile/ (TensorBoard's profile tab) with a summary: the device's busy and
idle time per step, the operations that took it, and their time by part of the model
(`profiling.StepTrace`).
"""

import collections
import contextlib
import dataclasses
import functools
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax

from transformer_jax.bleu import score
from transformer_jax.checkpoint import (Checkpointer, DataPositionError, StateMismatchError,
                                       saved_metadata)
from transformer_jax.config_checks import ConfigError, checked_copy
from transformer_jax.data import eval_batches, load_split, prepare
from transformer_jax.data.prepared import made_workdir
from transformer_jax.data.vocabulary import CHECKPOINT_TOKENIZER_KEY, tokenizer_path
from transformer_jax.metrics_window import MetricsWindow
from transformer_jax.model import Transformer
from transformer_jax.optim import optimizer_from_config
from transformer_jax.output_paths import writable_folder
from transformer_jax.parallel import Parallel
from transformer_jax.predict import predict
from transformer_jax import processes, provenance
from transformer_jax.profiling import TRACEABLE, ProfileError, StepTrace
from transformer_jax.resume_checks import (changed_layout, changed_settings, refuse_other_model,
                                           refuse_other_run, refuse_other_vocabulary)
from transformer_jax.run_config import build_model_config
from transformer_jax.run_log import RunLog
from transformer_jax.run_messages import (finished_line, first_step_line, opening_lines,
                                          profile_line)
from transformer_jax.steps import eval_step, train_step
from transformer_jax.stop_signal import StopSignal
from transformer_jax.train_batches import batch_rows, new_shuffle_seed, train_batches
from transformer_jax.train_state import abstract_train_state, create_train_state
from transformer_jax.workdir_lock import workdir_lock


# The host runs ahead of the devices (JAX dispatches a step and returns); unbounded, it had
# queued about 30 steps, all run before a stop signal's "saving after the current step"
# could save: SIGTERM 4 s after the first step (configs/default.py, one layer a side,
# 2-core CPU) stopped at steps 69 and 71, 5.7 s after the signal; bounded, at 40 and 40,
# 2.7-3.0 s after. Steps/s unchanged there (8.8 both, medians of 12 records, alternated).
# Two steps queued keep an accelerator busy while the host reads the next batch.
STEPS_AHEAD = 2
# Settings outside optim that change what a resumed run's steps learn from (and the rows per
# update, in the checkpoint's layout; per_device_batch_size where it has none).
_LEARNING_SETTINGS = ("seed", "accumulation_steps")
_LEARNING_DATA = ("max_source_length", "max_target_length", "too_long")  # the rows' contents


def _due(step: int, every: int, last_step: int) -> bool:
    """Every `every` steps and at the last one; never when `every` is 0."""
    return every > 0 and (step % every == 0 or step == last_step)


@dataclasses.dataclass(frozen=True)
class _Periodic:
    """Work the training loop does every `every` steps (0: never), at the last step, and,
    with `on_stop`, at the step a stop signal ends: `run(step, placed_state)`."""

    every: int
    run: Callable[[int, Any], None]
    on_stop: bool = False

    def due(self, step: int, last_step: int, stopped: bool) -> bool:
        return _due(step, self.every, last_step) or (stopped and self.on_stop)


@dataclasses.dataclass
class TrainResult:
    """What a call of `train` did: its last step and the records it logged."""

    step: int
    records: list[dict]
    stopped_early: bool = False


def train(config, workdir: str, *, launched: float | None = None) -> TrainResult:
    """Trains (or resumes training) the run of `config` in `workdir`.

    `config` is an ml_collections.ConfigDict (`load_config_file`) or a dict of its keys;
    training changes a copy of it, never the caller's.

    `launched`, the monotonic time its process started (train.py passes it), adds to the
    first step's line the time before training began: Python, the imports, JAX's devices.
    """
    config = checked_copy(config)
    # From here on: while data is read and the step compiles too.
    started = time.monotonic()
    with StopSignal() as stop, contextlib.ExitStack() as held:
        # One run per workdir; in a run of several processes, process 0 makes and locks it
        # for all, and the others learn from it when it cannot (they would wait for it forever).
        processes.first_then_others(
            lambda: held.enter_context(workdir_lock(made_workdir(config.data, workdir)))
            if jax.process_index() == 0 else None, "lock the workdir", quiet=True)
        return _train(config, writable_folder(workdir), stop, (launched, started))



def _train(config, workdir: str, stop: StopSignal, starts: tuple) -> TrainResult:
    parallel = Parallel(config.parallelism)
    if (config.model.layer_norm_implementation == "pallas" and parallel.strategy == "sharded"
            and parallel.mesh.size > 1):
        # XLA cannot split a Pallas kernel's custom call over the mesh: each device would
        # gather the whole batch's activations and normalize all of them.
        raise ConfigError(f"config.model.layer_norm_implementation='pallas' runs on one "
                          f"device's rows; with parallelism='sharded' over {parallel.mesh.size} "
                          f"devices use parallelism='pmap' or layer_norm_implementation='xla'")
    batch_rows(config, parallel.num_local_devices)  # a budget too small: said before the data
    directory = os.path.join(workdir, "checkpoints")
    if (saved := saved_metadata(directory)) is not None:  # before a tokenizer is trained
        refuse_other_vocabulary(saved[1], config.data, f"{directory}/{saved[0]}")
    # Process 0 trains the tokenizer and prepares the splits; the others wait for it, as long
    # as it takes, then open them.
    tokenizer, splits = processes.first_then_others(lambda: prepare(config.data, workdir),
                                                    "prepare the data")
    opened = time.monotonic()  # the data; then the state, then the first step
    model_config = build_model_config(config.model, tokenizer.vocab_size)
    checkpointer = Checkpointer(directory, keep=config.checkpoints_to_keep)
    try:
        # The newest checkpoint whose metadata reads (damaged ones are moved aside) must be
        # of this run; the settings that changed are named once the state is restored.
        found = checkpointer.newest(checkpointer.metadata)
        if found is not None:
            refuse_other_run(found[1], model_config, config.optim, tokenizer,
                             workdir=workdir, where=f"{checkpointer.directory}/{found[0]}")
        loop = _Loop(config, workdir, parallel, tokenizer, model_config, checkpointer, splits)
        return loop.run(stop, starts, opened)
    finally:
        checkpointer.close()


def _perplexity(loss: float) -> float:
    """exp(loss), or inf past a float's range (a diverged run: it was capped at exp(50) =
    5.185e21 and logged as if measured)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


class _Loop:
    """The state of one training run between its steps."""

    def __init__(self, config, workdir, parallel, tokenizer, model_config, checkpointer,
                 splits):
        self.config, self.workdir, self.parallel = config, workdir, parallel
        self.tokenizer, self.checkpointer = tokenizer, checkpointer
        self.model = Transformer(model_config)
        self.metadata = {"config": config.to_dict(), "model": dataclasses.asdict(model_config),
                         "tokenizer": tokenizer_path(workdir),
                         CHECKPOINT_TOKENIZER_KEY: tokenizer.sha256,
                         "software": provenance.software()}  # what wrote the checkpoint
        optimizer = optimizer_from_config(config.optim, model_config.d_model)
        self.p_train = parallel.compile_train_step(functools.partial(
            train_step, model=self.model, seed=config.seed,
            label_smoothing=config.optim.label_smoothing,
            learning_rate_fn=optimizer.learning_rate_fn,
            accumulation_steps=config.accumulation_steps,
            loss_chunk_size=config.loss_chunk_size),
            # A profiled run's kernels each name their operation (no CUDA graphs).
            compiler_options=TRACEABLE if config.profile_steps else None)
        self.p_eval = parallel.compile_eval_step(functools.partial(
            eval_step, model=self.model, loss_chunk_size=config.loss_chunk_size))
        self.rows = batch_rows(config, parallel.num_local_devices)
        self.metadata["layout"] = {"rows_per_update": self.rows * jax.process_count(),
                                   "devices": jax.device_count(),
                                   "parallelism": parallel.strategy}
        self.validation = splits["validation"]
        self.eval_pairs = load_split(config.data, "validation").pairs  # BLEU's text
        self._train_split = splits["train"]
        self.data = self._batches(config.seed)
        self._tx = optimizer.tx
        # A restore's template: the state's shapes on this process's first device, as
        # `create_train_state` places it. Nothing is drawn until no checkpoint is found
        # (on an H100 a fresh state took 32 s, where a 2-core CPU took 5).
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        self.state = jax.tree.map(lambda x: x.update(sharding=device),
                                  abstract_train_state(self.model, self._tx))
        self.drawing_s = None  # the seconds drawing fresh parameters took, if it was done
        self._window = MetricsWindow()

    def _draw(self) -> None:
        """Fresh parameters and optimizer state into `self.state`, timed apart for the first
        step's line."""
        drawing = time.monotonic()
        self.state = jax.block_until_ready(
            create_train_state(self.model, self._tx, jax.random.key(self.config.seed)))
        self.drawing_s = time.monotonic() - drawing

    def _batches(self, seed: int, *, announce: bool = True):
        return iter(train_batches(self.config, self._train_split, self.rows,
                                   self.parallel.num_local_devices, seed, announce=announce))

    def _restore(self) -> dict | None:
        """The newest checkpoint that reads, into `self.state` and `self.data` (a damaged
        one is moved aside); returns its metadata (None: no checkpoint). A state of another
        tree is a ConfigError. A data position the iterator cannot take restores the state
        alone: see `_new_shuffle`."""
        restore = self.checkpointer.restore
        try:
            try:
                found = self.checkpointer.newest(lambda s: restore(s, self.state, self.data))
            except DataPositionError as error:
                found = self.checkpointer.newest(lambda s: restore(s, self.state))
                if found is not None:
                    self._new_shuffle(found[0], error, found[1][1])
        except StateMismatchError as error:
            raise ConfigError(f"{error}; resume with the config it was written with, or "
                              f"train in a new --workdir") from None
        if found is None:
            return None
        self.state, metadata = found[1]
        return metadata

    def _name_changes(self, step: int, metadata: dict) -> None:
        """One line naming the settings of how the steps compute (dtype, dropout, attention)
        that differ from those of the restored checkpoint `step` (its `metadata`), if any,
        and one naming those of what they learn from (optim's, the seed, the rows). (Not the
        newest step's: a damaged one may have been passed over.)"""
        changed = refuse_other_model(metadata["model"], self.model.config, self.workdir)
        if changed and jax.process_index() == 0:
            print(f"resuming {self.checkpointer.directory}/{step} with {'; '.join(changed)} "
                  f"(they change how the steps compute, not the parameters)", file=sys.stderr)
        # What the steps learn from: the schedule, Adam, the rows, the dropout draws. Taken
        # as given (a run may go on at another rate), but named: it had changed unannounced.
        saved, now = metadata.get("config", {}), self.config.to_dict()
        layout = metadata.get("layout")  # None: written before it was recorded
        dropout = max(self.model.config.dropout_rate,
                      self.model.config.attention_dropout_rate) > 0
        learning = (changed_settings("optim", saved.get("optim", {}), now["optim"],
                                     now["optim"])
                    + changed_settings("config", saved, now, _LEARNING_SETTINGS + (
                        ("per_device_batch_size",) if layout is None else ()))
                    + changed_settings("data", saved.get("data", {}), now["data"],
                                       _LEARNING_DATA)
                    + changed_layout(layout or {}, self.metadata["layout"], dropout=dropout))
        if learning and jax.process_index() == 0:
            print(f"resuming {self.checkpointer.directory}/{step} with {'; '.join(learning)} "
                  f"(the steps from here learn with the new values)", file=sys.stderr)

    def _new_shuffle(self, step: int, error: DataPositionError, saved: dict) -> None:
        """Training data on a new shuffle, seeded by `new_shuffle_seed(seed, step)`, with
        one warning naming the data settings that changed (or why the position was lost)."""
        getattr(self.data, "close", lambda: None)()  # grain's worker processes, if any
        # The same buckets as the first iterator's, already announced.
        self.data = self._batches(new_shuffle_seed(self.config.seed, step), announce=False)
        now = self.config.data.to_dict()
        changed = changed_settings("data", saved.get("config", {}).get("data", {}), now, now)
        why = f"written with {' and '.join(changed)}" if changed else error.why
        if jax.process_index() == 0:
            print(f"warning: {self.checkpointer.directory}/{step}: {why}; the training data "
                  f"cannot go on from its saved position and starts a new shuffle (seeded "
                  f"from seed {self.config.seed} and step {step})", file=sys.stderr)

    def run(self, stop: StopSignal, starts: tuple, opened: float) -> TrainResult:
        """Trains from the newest checkpoint to `num_train_steps` (`starts`: the monotonic
        times of the process's start, or None, and of the run's; `opened`: of its data
        opened; for the first step's line)."""
        restored = self._restore()
        if restored is None:
            self._draw()
        parameters = sum(x.size for x in jax.tree.leaves(self.state.params))
        first = int(self.state.step)
        placed = self.parallel.put_state(self.state)
        self.state = None  # the placed copy is the live one (its buffers are donated)
        if restored is not None:
            self._name_changes(first, restored)
        log = RunLog(self.workdir, total_steps=self.config.num_train_steps, first_step=first,
                     enabled=jax.process_index() == 0)
        for line in opening_lines(self.config, self.model.config, rows=self.rows,
                                  software=self.metadata["software"], first=first,
                                  parameters=parameters, evaluable=bool(self.eval_pairs),
                                  checkpoints=self.checkpointer.directory):
            log.message(line)
        records = []
        work = self._periodic_work(log, records)
        trace = StepTrace(self.workdir, first_step=first, steps=self.config.profile_steps
                          if jax.process_index() == 0 else 0)
        if note := trace.unreached(self.config.num_train_steps):
            log.message(note)
        built = time.monotonic()  # the state built or restored, and placed
        try:
            step, stopped = self._loop(
                stop, placed, first, log, trace, work,
                first_line=lambda step: first_step_line(step, starts, opened, built,
                                                        self.drawing_s))
        finally:
            stop.closing = True  # a first signal from here waits for the last save
            try:
                trace.close()
                self.checkpointer.wait()
                getattr(self.data, "close", lambda: None)()  # grain's worker processes
            finally:
                log.close()  # the progress bar's line ended: an error starts its own
        if step == self.config.num_train_steps > first and jax.process_index() == 0:
            print(finished_line(self.workdir, step, self.checkpointer.directory), flush=True)
        return TrainResult(step, records, stopped)

    def _loop(self, stop: StopSignal, placed, first: int, log: RunLog, trace: StepTrace,
              work: list["_Periodic"], first_line: Callable[[int], str]) -> tuple[int, bool]:
        """The steps after `first`, each followed by the work due, to `num_train_steps` or a
        stop signal's step: (the last step, whether a signal stopped it)."""
        step, last = first, self.config.num_train_steps
        queued = collections.deque()  # the metrics of the steps the devices may still run
        self._window.start()
        stop.check()
        while step < last:
            self._watch(log, trace.before, step)
            if step == first or trace.tracing:  # compiling and tracing: not the speed
                self._window.pause()
            batch = self.parallel.put_batch(next(self.data))
            placed, metrics = self.p_train(placed, batch)
            step += 1
            self._window.pending.append(metrics)
            queued.append(metrics)
            if len(queued) > STEPS_AHEAD:
                jax.block_until_ready(queued.popleft())
            if step == first + 1:
                jax.block_until_ready(metrics)
                log.message(first_line(step))
                log.first_step_done(step)
                # Compiled and run: from here a signal asks for a save (before, it stops at
                # once, even inside the compilation).
                stop.training = True
            stopped = self._stop_requested(stop, step)
            profiled = self._watch(
                log, trace.after, step, metrics, last=stopped or step == last,
                # The step's program, from JAX's cache of the compilation just run (a
                # profiled pmap step runs under jit in one process; in several, pmap
                # compiles it again: WORKDIR/compilation_cache may hold it).
                program=lambda: self.p_train.lower(placed, batch).compile().as_text())
            if profiled:
                log.message(profile_line(profiled))
            if not trace.tracing:
                self._window.resume()
            self._between_steps(work, step, placed, stopped)
            if stopped:
                log.message(f"stopped at step {step}; saved to "
                            f"{self.checkpointer.directory}/{step}")
                return step, True
        return step, False

    def _between_steps(self, work: list["_Periodic"], step: int, placed,
                       stopped: bool) -> None:
        """The periodic work due after `step`: the window's metrics reach the host once,
        then each runs in order (never saving a broken state); their time is not
        training's."""
        due = [w for w in work if w.due(step, self.config.num_train_steps, stopped)]
        if not due:
            return
        self._window.fetch(self.parallel, step)
        with self._window.left_out():  # evaluating and saving are not training time
            for periodic in due:
                periodic.run(step, placed)
        if not self._window.rows and not self._window.pending:
            self._window.start()

    @staticmethod
    def _watch(log: RunLog, call, *args, **kwargs):
        """`call` of the step trace; a ProfileError is one warning, and training goes on."""
        try:
            return call(*args, **kwargs)
        except ProfileError as error:
            log.message(f"warning: {error}")
            return None

    def _periodic_work(self, log: RunLog, records: list[dict]) -> list["_Periodic"]:
        """What the loop does between steps, in this order: log the training metrics,
        evaluate, measure BLEU, save. Logging and saving also happen at a stop."""
        c = self.config
        evaluable = bool(self.eval_pairs)

        def log_train(step, placed):
            record = self._window.summary()
            records.append({"step": step, **record})
            log.write(step, record)
            log.progress(step, record)

        def log_eval(measure):
            def run(step, placed):
                record = measure(placed)
                log.write(step, record)
                log.message(f"step {step}: " + ", ".join(
                    f"{k} {v:.4g}" for k, v in record.items()))
            return run

        return [
            _Periodic(c.log_every_steps, log_train, on_stop=True),
            _Periodic(c.eval_every_steps if evaluable and c.num_eval_batches != 0 else 0,
                      log_eval(self._evaluate)),
            _Periodic(c.decode.bleu_every_steps if evaluable else 0, log_eval(self._bleu)),
            _Periodic(c.checkpoint_every_steps, self._save, on_stop=True),
        ]

    def _bleu(self, placed) -> dict[str, float]:
        """sacreBLEU of beam search on the first `decode.bleu_examples` validation pairs."""
        d = self.config.decode
        pairs = self.eval_pairs[:d.bleu_examples]
        outputs = predict(self.model, self.parallel.local_params(placed),
                          self.tokenizer.encode_batch([p["source"] for p in pairs], add_eos=True),
                          beam_size=d.beam_size, alpha=d.alpha,
                          max_extra_length=d.max_extra_length)
        result = score(self.tokenizer.decode_batch(outputs), [p["target"] for p in pairs])
        return {"eval_bleu": result["bleu"], "eval_chrf": result["chrf"]}

    def _stop_requested(self, stop: StopSignal, step: int) -> bool:
        stop.check()
        if jax.process_count() == 1:
            return stop.requested
        # A collective, so only at the steps that log, where every process agrees to look.
        c = self.config
        return _due(step, c.log_every_steps, c.num_train_steps) and stop.agreed()

    def _evaluate(self, placed) -> dict[str, float]:
        """Loss (no label smoothing), accuracy and perplexity on the validation split."""
        d, sums, queued = self.config.data, [], collections.deque()
        batches = eval_batches(self.validation, batch_size=self.rows,
                               max_source_length=d.max_source_length,
                               max_target_length=d.max_target_length,
                               shard_index=jax.process_index(), shard_count=jax.process_count())
        for i, batch in enumerate(batches):
            if i == self.config.num_eval_batches:
                break
            inputs = {"inputs": batch["inputs"], "targets": batch["targets"]}
            queued.append(self.p_eval(placed.params, self.parallel.put_batch(inputs)))
            # As the training loop: at most STEPS_AHEAD queued. On CPU devices, 125 pmapped
            # batches queued at once left a cross-device sum waiting for a device's thread
            # until XLA's rendezvous timeout aborted the process.
            if len(queued) > STEPS_AHEAD:
                sums.append(self.parallel.to_host(queued.popleft()))
        sums += [self.parallel.to_host(t) for t in queued]
        tokens = max(sum(s["weight_sum"] for s in sums), 1.0)
        loss = sum(s["loss_sum"] for s in sums) / tokens
        return {"eval_loss": loss, "eval_accuracy": sum(s["correct_sum"] for s in sums) / tokens,
                "eval_perplexity": _perplexity(loss)}

    def _save(self, step: int, placed) -> None:
        # A host copy: the step donates the device buffers before an async save would read them.
        state = self.parallel.get_state(placed)
        self.checkpointer.save(step, state, data_iterator=self.data, metadata=self.metadata)
