"""Stop signals (stop_signal.py): the first asks for a save once training runs; one before,
or a second, stops at once; a stop Python drops or wraps is not lost. The whole run's
signal handling (saves, process groups, compilation) is tested in test_train.py."""

import gc
import os
import signal
import sys
import time

import pytest

from transformer_jax.stop_signal import StopSignal, StoppedAtOnce


def test_a_signal_before_training_or_a_second_one_stops_at_once(capsys):
    """The first signal once training runs only asks for a save; one during setup, or a
    second, raises StoppedAtOnce; the handlers before are restored afterwards."""
    before = signal.getsignal(signal.SIGTERM)
    stop = StopSignal()
    try:
        with pytest.raises(StoppedAtOnce, match="SIGTERM before the first step: stopped at once"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs between bytecodes; this is never reached
        stop.training = True
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        assert stop.requested and "SIGINT: saving after the current step" in capsys.readouterr().err
        with pytest.raises(StoppedAtOnce, match="SIGTERM a second time: stopped at once"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_once_the_loop_ended_waits_for_the_last_save(capsys):
    """After the last step, while the final checkpoint is written and the run closes, a
    first signal lets it finish (it said "before the first step" and exited 1 with every
    step run and the checkpoint whole); a second stops at once."""
    stop = StopSignal()
    try:
        stop.training = True
        stop.closing = True  # as trainer.run's finally sets it
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert stop.requested and stop.stopped is None
        assert ("SIGTERM: the run is ending, once its last checkpoint is written (send it "
                "again to stop at once)") in capsys.readouterr().err
        with pytest.raises(StoppedAtOnce, match="SIGINT a second time: stopped at once"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    finally:
        stop.restore()


def test_a_stop_raised_inside_a_gc_callback_is_not_lost(capsys):
    """Python drops an error raised in a garbage-collector callback (jax has one) and prints
    "Exception ignored": a stop signal handled there is sent again, and raised in the
    run's own code, silently."""
    def in_gc(phase, info):
        del info
        if phase == "start":
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, in the callback

    stop = StopSignal()
    gc.callbacks.append(in_gc)
    try:
        with pytest.raises(StoppedAtOnce, match="SIGTERM before the first step"):
            try:
                gc.collect()
            finally:
                gc.callbacks.remove(in_gc)
            time.sleep(1)  # the stop comes again within 10 ms; this is never finished
    finally:
        stop.restore()
    assert "Exception ignored" not in capsys.readouterr().err


def test_an_error_a_stop_caused_ends_the_run_as_the_stop():
    """Code a stop interrupts may wrap it (Python 3.11 wraps errors in `__set_name__`, as
    TFDS's lazy imports met) or fail from it: the run still ends as the stop."""
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(StoppedAtOnce, match="SIGTERM before the first step") as caught:
        with StopSignal():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)  # the handler raises between bytecodes; this is never finished
            except BaseException as error:
                raise RuntimeError("Error calling __set_name__") from error
    assert isinstance(caught.value.__context__, RuntimeError)
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("inner_restores", [True, False])
def test_a_hook_set_inside_stays_in_the_chain(inner_restores):
    """A hook set while the stop signal is on (checkpoint.py filters orbax's noise that
    way, and keeps its filter after a failed read) is not thrown away when the stop signal
    ends: only a hook that is still the stop signal's own is put back."""
    before, inner = sys.unraisablehook, print
    with StopSignal():
        inner_previous = sys.unraisablehook
        sys.unraisablehook = inner
        if inner_restores:
            sys.unraisablehook = inner_previous
    try:
        assert sys.unraisablehook is (before if inner_restores else inner)
    finally:
        sys.unraisablehook = before


def test_a_stop_that_python_swallowed_is_raised_by_check():
    """The handler's StoppedAtOnce raised where Python swallows it (an `except Exception`
    would not, but a C callback does): `check`, called before the first step and at every
    step, raises that same stop; before any signal it raises nothing."""
    stop = StopSignal()
    try:
        stop.check()
        try:
            stop._handle(signal.SIGTERM, None)
        except StoppedAtOnce as swallowed:
            raised = swallowed
        with pytest.raises(StoppedAtOnce) as caught:
            stop.check()
        assert caught.value is raised and caught.value.signum == signal.SIGTERM
    finally:
        stop.restore()
