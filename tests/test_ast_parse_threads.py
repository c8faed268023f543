"""Two threads parsing at once in the test process (see _serialize_ast_parse in conftest.py).

On CPython 3.11.0-3.11.7 a thread switch inside ast.parse, to a thread that parses, ends the first parse in
"SystemError: AST constructor recursion depth mismatch". The switch comes from a garbage collection that runs
Python code; here a gc callback makes it happen, at every collection while the main thread is inside the
stdlib's ast.parse, by handing the other thread a parse to do and waiting (briefly) for it.
"""
from __future__ import annotations

import ast
import gc
import queue
import sys
import threading

SOURCE = "y = [g(i) for i in range(3)]\n" * 20


def _inside_stdlib_parse() -> bool:
    """True when the main thread is inside the stdlib's ast.parse (its compile() call), wrapped or not."""
    frame = sys._getframe(2)  # the gc callback's caller
    while frame is not None:
        if frame.f_code.co_name == "parse" and frame.f_code.co_filename == ast.__file__:
            return True
        frame = frame.f_back
    return False


def test_a_thread_that_parses_meanwhile_does_not_break_ast_parse():
    jobs: queue.Queue = queue.Queue()
    errors, handoffs = [], []

    def other():
        while (done := jobs.get()) is not None:
            try:
                ast.parse("x = f(a, b)")  # a shallower stack than the main thread's
            except Exception as e:  # reported by the main thread
                errors.append(e)
            done.set()

    pending = []  # a handoff the other thread has not finished (it waits its turn to parse)

    def on_gc(phase, info):
        if phase != "start" or threading.current_thread() is not threading.main_thread():
            return
        if pending and not pending[0].is_set():
            return
        if _inside_stdlib_parse():
            done = threading.Event()
            pending[:] = [done]
            handoffs.append(done)
            jobs.put(done)
            done.wait(0.2)

    thread = threading.Thread(target=other, daemon=True)
    thread.start()
    thresholds = gc.get_threshold()
    gc.callbacks.append(on_gc)
    gc.set_threshold(1)  # a collection on (nearly) every allocation, so several fall inside the AST constructor
    try:
        ast.parse(SOURCE)
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(on_gc)
        jobs.put(None)
        thread.join(10)
    assert handoffs, "no collection happened inside ast.parse: the test did not exercise the race"
    assert all(done.is_set() for done in handoffs) and errors == []
