"""interrupts_deferred: a signal that lands inside the block reaches its handler once the block
has ended, and an error of the block's own wins."""

from __future__ import annotations

import os
import signal

import pytest

from graphopt.interrupts import interrupts_deferred


class Stopped(Exception):
    pass


@pytest.fixture
def sigterm_raises():
    def stop(signum, frame):
        raise Stopped(signum)
    previous = signal.signal(signal.SIGTERM, stop)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_inside_the_block_is_taken_after_it(signum, sigterm_raises):
    expected = KeyboardInterrupt if signum == signal.SIGINT else Stopped
    done = []
    with pytest.raises(expected):
        with interrupts_deferred():
            os.kill(os.getpid(), signum)
            done.append("the rest of the block")  # a commit's result noted, say
    assert done == ["the rest of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_blocks_own_error_wins_and_nothing_is_held_after(sigterm_raises):
    with pytest.raises(ValueError):
        with interrupts_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            raise ValueError("the block's own")
    with interrupts_deferred():
        pass  # no signal: nothing raised
    with pytest.raises(Stopped):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler is back
