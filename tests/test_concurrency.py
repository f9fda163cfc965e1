"""One loaded .om shared by 8 threads: every run returns exactly what the same run returns
serially, for a three-partition artifact (NPU → CPU fallback → NPU, mapped weights) and a
single-partition one."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import warnings

import numpy as np
import pytest
from helpers import conv_classifier, parse_model

import graphopt

THREADS = 8
RUNS = 100  # per thread


def _weight(rng, *shape):
    return (rng.standard_normal(shape) * 0.2).astype(np.float32)


def three_partitions():
    """Convs and a classifier on the NPU, TopK (no NPU kernel) on the CPU, then a 1024-wide MLP
    large enough to go back to the NPU; its 4 MiB weight becomes a mapped weights blob."""
    rng = np.random.default_rng(0)
    proto = conv_classifier("""v, idx = TopK <axis = 1> (scores, k)
            h = Gemm <transB = 1> (v, w3, b3)
            h2 = Relu (h)
            h3 = Gemm <transB = 1> (h2, w4, b4)
            out = Relu (h3)""", "float[1,1024] out, int64[1,64] idx", seed=0,
        k=np.array([64], np.int64), w3=_weight(rng, 1024, 64), b3=_weight(rng, 1024),
        w4=_weight(rng, 1024, 1024), b4=_weight(rng, 1024))
    return proto, "ascend310", (1, 8, 32, 32)


def one_partition():
    rng = np.random.default_rng(1)
    proto = parse_model("""
        g (float[4,64] x) => (float[4,32] y) {
            h = MatMul (x, w1)
            a = Relu (h)
            y = Gemm (a, w2, b2)
        }""", w1=_weight(rng, 64, 128), w2=_weight(rng, 128, 32), b2=_weight(rng, 32))
    return proto, "cpu", (4, 64)


@pytest.mark.parametrize("build, partitions", [(three_partitions, 3), (one_partition, 1)],
                         ids=["three_partitions", "one_partition"])
def test_eight_threads_get_the_serial_outputs(tmp_path, build, partitions):
    proto, target, shape = build()
    result = graphopt.optimize(proto, target=target)
    assert len(result.partitioning.partitions) == partitions
    path = tmp_path / "model.om"
    graphopt.save(result, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the NPU partitions' CPU stand-in notice
        session = graphopt.load(path)
    if partitions > 1:
        assert any(name.startswith("weights/") for name in session.artifact.spans)

    # Distinct inputs per thread and run, from per-thread seeds; the reference is the same
    # session run serially. Exact equality: the same kernels on the same input in the same
    # session are deterministic, so any difference means state leaked between runs.
    feeds = [[np.random.default_rng([thread, run]).standard_normal(shape).astype(np.float32)
              for run in range(RUNS)] for thread in range(THREADS)]
    name = session.inputs[0]["name"]
    expected = [[session.run({name: x}) for x in per_thread] for per_thread in feeds]
    first, other = expected[0][0], expected[1][0]
    assert any(not np.array_equal(first[k], other[k]) for k in first)  # a swapped result shows

    start = threading.Barrier(THREADS)  # all threads in run() at once, not one after another

    def worker(thread: int) -> list[str]:
        start.wait()
        wrong = []
        for run, x in enumerate(feeds[thread]):
            outputs = session.run({name: x})
            for key, want in expected[thread][run].items():
                if not np.array_equal(outputs[key], want):
                    wrong.append(f"thread {thread} run {run} output {key}")
        return wrong

    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(worker, range(THREADS)))  # re-raises any worker's exception
    assert [w for per_thread in results for w in per_thread] == []


def test_overlapping_compiles_leave_the_collector_on(monkeypatch):
    # Each block saved and restored gc's switch: a thread that read "off" (another had paused
    # collection) and switched it off after that other had switched it back on left it off
    # for good. Here the second thread's gc.disable waits for the first to leave.
    import gc

    from graphopt.ir import collector

    real_disable, first_left, second_disabling = gc.disable, threading.Event(), threading.Event()

    def disable():
        if threading.current_thread().name == "second":
            second_disabling.set()
            first_left.wait(2)
        real_disable()

    monkeypatch.setattr(collector.gc, "disable", disable)
    first_inside = threading.Event()

    def first():
        with collector.collection_paused():
            first_inside.set()
            second_disabling.wait(0.5)  # never set where the second finds collection paused
        first_left.set()

    def second():
        first_inside.wait(5)
        with collector.collection_paused():
            pass

    threads = [threading.Thread(target=first, name="first"),
               threading.Thread(target=second, name="second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    enabled = gc.isenabled()
    gc.enable()
    assert enabled


@contextlib.contextmanager
def _another_compile_inside(*blocks: str):
    """Another thread held inside the collector's `blocks` (a compile's import and passes)
    until the with-block ends."""
    from graphopt.ir import collector

    inside, leave = threading.Event(), threading.Event()

    def compiling():
        with contextlib.ExitStack() as stack:
            for block in blocks:
                stack.enter_context(getattr(collector, block)())
            inside.set()
            leave.wait(30)

    thread = threading.Thread(target=compiling)
    thread.start()
    try:
        assert inside.wait(10)
        yield
    finally:
        leave.set()
        thread.join(10)


def test_dropped_results_are_collected_while_another_thread_compiles(monkeypatch):
    # A thread pool whose compiles always overlapped never closed its last block: collection
    # stayed paused and the heap frozen, and dropped results piled up (1.4 GB after 200).
    import gc
    import weakref

    from graphopt import compiler, zoo
    from graphopt.ir import collector

    with _another_compile_inside("collection_paused", "heap_frozen"):
        model = zoo.build("tiny")
        dropped = weakref.ref(compiler.optimize(model))
        monkeypatch.setattr(collector, "_long_lived", 0)  # due: the next import collects
        kept = compiler.optimize(model)
        assert dropped() is None and kept.model is not None
        assert gc.get_freeze_count() > 0  # the other thread's freeze is kept
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_compile_hands_out_no_references_to_other_threads_objects(monkeypatch):
    # gc.get_objects lists every object, a tuple another thread is still filling among them,
    # which then fails to grow (SystemError: bad argument to internal function).
    import gc

    from graphopt import compiler, zoo
    from graphopt.ir import collector

    def refused(*args, **kwargs):
        raise AssertionError("gc.get_objects during a compile")

    monkeypatch.setattr(collector.gc, "get_objects", refused)
    monkeypatch.setattr(collector, "_long_lived", None)
    model = zoo.build("tiny")
    compiler.optimize(model)
    monkeypatch.setattr(collector, "_long_lived", 0)
    compiler.optimize(model)  # due: collects and counts
    assert gc.isenabled()


@pytest.mark.parametrize("block", ["collection_paused", "heap_frozen"])
def test_a_child_forked_while_another_thread_compiles_gets_the_collector_back(block):
    # The other thread's block never closes in the child: its count stayed above 0 there, and
    # the collector off (or the heap frozen) for the child's life.
    import gc
    import os

    from graphopt.ir import collector

    with _another_compile_inside(block):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: only this thread came along
            ok = gc.isenabled() and not gc.get_freeze_count() \
                and collector._paused == collector._frozen == 0
            with collector.collection_paused(), collector.heap_frozen():  # the lock is free
                pass
            ok = ok and gc.isenabled() and not gc.get_freeze_count()
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
        os.close(write)
        verdict = os.read(read, 1)
        os.waitpid(pid, 0)
        assert verdict == b"1"
    assert gc.isenabled() and not gc.get_freeze_count()


def test_kept_notices_are_this_threads_alone():
    # compare and profile caught warnings around load with catch_warnings, which is
    # process-wide: another thread's stand-in warning became a note of their report (and was
    # lost to that thread).
    from graphopt.warning_scope import kept_notices, notice

    inside, done = threading.Event(), threading.Event()

    def other():
        inside.wait(5)
        notice("the other thread's", RuntimeWarning)
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with pytest.warns(RuntimeWarning, match="the other thread's"):
        with kept_notices() as kept:
            inside.set()
            done.wait(5)
            notice("this thread's", RuntimeWarning)
    thread.join(10)
    assert kept == ["this thread's"]


def test_overlapping_warning_blocks_leave_the_filters_as_they_were():
    # catch_warnings swaps the process-wide filter list: overlapping blocks put back each
    # other's temporary list, and an "ignore everything" filter stayed installed.
    from graphopt.warning_scope import warnings_as

    before = list(warnings.filters)
    finished = threading.Event()
    first_inside = threading.Event()

    def one():
        with warnings_as("ignore"):
            first_inside.set()
            finished.wait(0.2)  # thread two waits for the lock meanwhile

    def two():
        first_inside.wait(5)
        with warnings_as("error", UserWarning):
            pass
        finished.set()

    threads = [threading.Thread(target=one), threading.Thread(target=two)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert warnings.filters == before
