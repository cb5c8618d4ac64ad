"""The Python interpreter driver (agent/src/code/python/driver.py) against its protocol.

Each test starts the driver exactly as the agent does (see driver_client.py) and checks
what an agent would see: results, errors, output order, interrupts, the end of the process.
Run with: /var/cache/pvisor/venv/bin/python -m pytest -q tests/driver
matplotlib and pandas cases run only when the driver's interpreter has them (visible skip).
"""

import base64
import functools
import json
import subprocess

import pytest

from driver_client import Driver, interpreter


@pytest.fixture
def driver():
    d = Driver()
    yield d
    d.stop()


@functools.lru_cache(maxsize=None)
def driver_version():
    probe = subprocess.run([interpreter(), "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True)
    return tuple(int(part) for part in probe.stdout.split())


# Python 3.7 has no PyCF_ALLOW_TOP_LEVEL_AWAIT: the driver runs there, without top-level await.
needs_await = pytest.mark.skipif(driver_version() < (3, 8), reason="top-level await needs Python 3.8+")


@functools.lru_cache(maxsize=None)
def has_module(name):
    probe = subprocess.run([interpreter(), "-c", "import " + name], capture_output=True)
    return probe.returncode == 0


def require(module):
    if not has_module(module):
        pytest.skip("%s is not importable by the driver's interpreter %s" % (module, interpreter()))


def stdout_before(cell, predicate):
    """The stdout text seen before the first control message matching `predicate`."""
    text = ""
    for name, item in cell.events:
        if name == "stdout":
            text += item
        elif name == "control" and predicate(item):
            return text
    raise AssertionError("no such message in %r" % (cell.events,))


# ------------------------------------------------------------------ REPL semantics


def test_ready_reports_the_interpreter_version(driver):
    version = subprocess.run(
        [interpreter(), "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True
    ).stdout.strip()
    assert driver.ready == {"t": "ready", "version": version}


def test_last_expression_is_the_main_result(driver):
    cell = driver.run("result = 2 + 2\nresult")
    assert cell.kinds() == ["main", "done"]
    assert cell.main[0]["data"] == {"text/plain": "4"}
    assert cell.error is None


def test_trailing_semicolon_suppresses_the_value(driver):
    assert driver.run("1 + 1;").results == []
    assert driver.run("1 + 1;  # a comment\n").results == []
    assert driver.run("x = 1; x").value == "1"
    assert driver.run("s = 'a;'\ns").value == "'a;'"


def test_none_and_statements_give_no_result(driver):
    assert driver.run("None").results == []
    assert driver.run("x = 3").results == []
    assert driver.run("print('hi')").results == []
    assert driver.run("").results == []
    assert driver.run("# only a comment").results == []


def test_underscore_holds_the_last_value(driver):
    driver.run("40 + 2")
    driver.run("y = 1")  # a cell without a value leaves `_` alone
    assert driver.run("_").value == "42"
    driver.run("'x';")  # nor does a suppressed one
    assert driver.run("_ + 1").value == "43"


def test_state_persists_across_cells(driver):
    driver.run("import math\ndef area(r):\n    return math.pi * r * r\ncounter = 10")
    driver.run("counter += 5")
    assert driver.run("counter, round(area(1), 2)").value == "(15, 3.14)"


def test_execution_count_increases_on_every_exec(driver):
    counts = [driver.run(code).done["count"] for code in ("1", "1/0", "x = = 2", "", "2")]
    assert counts == [1, 2, 3, 4, 5]


def test_globals_are_a_registered_main_module(driver):
    assert driver.run("__name__").value == "'__main__'"
    cell = driver.run("if __name__ == '__main__':\n    print('as a script')")
    assert cell.stdout == "as a script\n"
    assert driver.run("import sys\nsys.modules['__main__'].__dict__ is globals()").value == "True"
    # the driver's own names do not leak into the user's namespace
    assert driver.run("sorted(k for k in globals() if not k.startswith('__'))").value == "['sys']"


def test_pickle_and_dataclass_of_classes_defined_in_cells(driver):
    driver.run("class Point:\n    def __init__(self, x):\n        self.x = x")
    cell = driver.run("import pickle\npickle.loads(pickle.dumps(Point(3))).x")
    assert cell.error is None and cell.value == "3"
    cell = driver.run("from dataclasses import dataclass\n@dataclass\nclass P:\n    x: int\nP(1)")
    assert cell.error is None and cell.value == "P(x=1)"


def test_future_import_carries_to_later_cells(driver):
    driver.run("from __future__ import annotations")
    assert driver.run("def f(x: Undefined) -> int:\n    return x\nf.__annotations__['x']").value == "'Undefined'"


def test_cell_sources_are_in_linecache(driver):
    driver.run("def answer():\n    return 42")
    assert driver.run("import inspect\ninspect.getsource(answer)").value == repr("def answer():\n    return 42\n")
    cell = driver.run("import warnings\nwarnings.warn('careful')")
    assert "2: UserWarning: careful" in cell.stderr
    if driver_version() >= (3, 8):  # 3.7's warnings name the file after sys.argv[0]
        assert "<cell-3>:2: UserWarning: careful" in cell.stderr


def test_long_containers_are_pretty_printed(driver):
    value = driver.run("list(range(40))").value
    assert value.count("\n") > 3 and value.replace("\n", "").replace(" ", "") == str(list(range(40))).replace(" ", "")


# ------------------------------------------------------------------ top-level await


@needs_await
def test_top_level_await(driver):
    cell = driver.run("import asyncio\nawait asyncio.sleep(0)\nasync def twice(x):\n    return 2 * x\nawait twice(21)")
    assert cell.error is None and cell.value == "42"


@needs_await
def test_the_event_loop_persists_across_cells(driver):
    driver.run("import asyncio\nqueue = asyncio.Queue()\nawait queue.put('kept')")
    assert driver.run("await queue.get()").value == "'kept'"
    driver.run("await asyncio.sleep(0)\nloop = asyncio.get_running_loop()\nasync def f():\n    return asyncio.get_running_loop()")
    assert driver.run("(await f()) is loop").value == "True"


@needs_await
def test_sync_cells_can_use_asyncio_run(driver):
    cell = driver.run("import asyncio\nasync def f():\n    return 'ran'\nasyncio.run(f())")
    assert cell.error is None and cell.value == "'ran'"
    assert driver.run("await asyncio.sleep(0, 'after')").value == "'after'"


# ------------------------------------------------------------------ rich results


def test_display_results_come_in_order_before_the_value(driver):
    cell = driver.run("display(1)\ndisplay('two', [3])\n4")
    assert cell.kinds() == ["result", "result", "result", "main", "done"]
    assert [r["data"]["text/plain"] for r in cell.results] == ["1", "'two'", "[3]", "4"]
    assert [r["main"] for r in cell.results] == [False, False, False, True]


def test_display_raw_bundle(driver):
    cell = driver.run("display({'text/html': '<b>x</b>'}, raw=True)")
    assert cell.results[0]["data"]["text/html"] == "<b>x</b>"
    assert "text/plain" in cell.results[0]["data"]


def test_repr_hooks_give_their_mime_types(driver):
    code = (
        "class Rich:\n"
        "    def __repr__(self): return 'Rich()'\n"
        "    def _repr_html_(self): return '<i>rich</i>'\n"
        "    def _repr_markdown_(self): return '*rich*'\n"
        "    def _repr_svg_(self): return '<svg/>'\n"
        "    def _repr_png_(self): return b'\\x89PNG'\n"
        "    def _repr_latex_(self): return '$x$'\n"
        "    def _repr_json_(self): return {'a': [1]}\n"
        "Rich()"
    )
    data = driver.run(code).main[0]["data"]
    assert data["text/plain"] == "Rich()"
    assert data["text/html"] == "<i>rich</i>"
    assert data["text/markdown"] == "*rich*"
    assert data["image/svg+xml"] == "<svg/>"
    assert base64.b64decode(data["image/png"]) == b"\x89PNG"
    assert data["text/latex"] == "$x$"
    assert json.loads(data["application/json"]) == {"a": [1]}


def test_repr_mimebundle(driver):
    code = (
        "class Bundle:\n"
        "    def _repr_mimebundle_(self, include=None, exclude=None):\n"
        "        return {'text/html': '<p>b</p>', 'image/jpeg': b'\\xff\\xd8', 'text/plain': 'B'}, {}\n"
        "    def _repr_html_(self): return 'not used: the bundle has text/html'\n"
        "    def _repr_markdown_(self): return 'md'\n"
        "Bundle()"
    )
    data = driver.run(code).main[0]["data"]
    assert data["text/plain"] == "B"
    assert data["text/html"] == "<p>b</p>"
    assert base64.b64decode(data["image/jpeg"]) == b"\xff\xd8"
    assert data["text/markdown"] == "md"


def test_a_broken_hook_drops_only_its_mime_type(driver):
    code = "class Half:\n    def _repr_html_(self): raise RuntimeError('no html')\n    def __repr__(self): return 'Half'\nHalf()"
    cell = driver.run(code)
    assert cell.error is None
    assert cell.main[0]["data"] == {"text/plain": "Half"}
    assert "no html" in cell.stderr


def test_classes_and_catch_all_objects_get_repr_only(driver):
    driver.run("class Rich:\n    def _repr_html_(self): return '<b/>'")
    assert driver.run("Rich").main[0]["data"] == {"text/plain": "<class '__main__.Rich'>"}
    code = "class Any:\n    def __getattr__(self, name): return lambda *a, **k: 'junk'\n    def __repr__(self): return 'Any'\nAny()"
    assert driver.run(code).main[0]["data"] == {"text/plain": "Any"}


def test_a_failing_repr_is_the_cells_error(driver):
    cell = driver.run("class Bad:\n    def __repr__(self): raise ValueError('bad repr')\nBad()")
    assert cell.error["ename"] == "ValueError"
    assert "    def __repr__(self): raise ValueError('bad repr')" in cell.error["traceback"]
    assert driver.run("1").value == "1"


# ------------------------------------------------------------------ errors


def assert_no_driver_frames(traceback):
    """The driver runs as `-c` (file "<string>") and runs await cells through asyncio."""
    for line in traceback:
        if line.startswith('  File "'):
            assert not line.startswith('  File "<string>"') and "/asyncio/" not in line, traceback


def test_exception_reports_the_users_frames_only(driver):
    driver.run("def inner(x):\n    raise ValueError('boom %d' % x)")
    cell = driver.run("y = 1\ninner(y)")
    assert cell.kinds() == ["error", "done"]
    error = cell.error
    assert error["ename"] == "ValueError" and error["evalue"] == "boom 1"
    tb = error["traceback"]
    assert tb[0] == "Traceback (most recent call last):"
    assert '  File "<cell-2>", line 2, in <module>' in tb
    assert "    inner(y)" in tb
    assert '  File "<cell-1>", line 2, in inner' in tb
    assert "    raise ValueError('boom %d' % x)" in tb
    assert tb[-1] == "ValueError: boom 1"
    assert_no_driver_frames(tb)


@needs_await
def test_exception_in_an_await_cell_has_no_asyncio_frames(driver):
    cell = driver.run("import asyncio\nasync def f():\n    await asyncio.sleep(0)\n    return {}['k']\nawait f()")
    assert cell.error["ename"] == "KeyError" and cell.error["evalue"] == "'k'"
    assert "    return {}['k']" in cell.error["traceback"]
    assert_no_driver_frames(cell.error["traceback"])


def test_chained_exceptions_keep_both_parts(driver):
    cell = driver.run("try:\n    1/0\nexcept ZeroDivisionError as e:\n    raise RuntimeError('wrapped') from e")
    tb = cell.error["traceback"]
    assert cell.error["ename"] == "RuntimeError"
    assert "ZeroDivisionError: division by zero" in tb
    assert "The above exception was the direct cause of the following exception:" in tb
    assert_no_driver_frames(tb)


def test_syntax_error_shows_the_line_and_caret(driver):
    cell = driver.run("x = 1\ny = = 2")
    error = cell.error
    assert error["ename"] == "SyntaxError"
    assert error["traceback"][0] == '  File "<cell-1>", line 2'
    assert "    y = = 2" in error["traceback"]
    assert any(line.strip() == "^" for line in error["traceback"])
    assert error["traceback"][-1].startswith("SyntaxError: ")
    assert driver.run("x = 1\nx").value == "1"


def test_system_exit_is_an_error_and_the_context_lives(driver):
    driver.run("kept = 'yes'")
    cell = driver.run("import sys\nsys.exit(3)")
    assert cell.error["ename"] == "SystemExit" and cell.error["evalue"] == "3"
    assert driver.run("exit()").error["ename"] == "SystemExit"
    assert driver.proc.poll() is None
    assert driver.run("kept").value == "'yes'"


def test_malformed_request_gets_an_error_and_done(driver):
    mark = len(driver.events)
    driver.send({"op": "exec"})
    cell = driver.finish(mark)
    assert cell.error["ename"] == "TypeError"
    assert driver.run("'still fine'").value == "'still fine'"


# ------------------------------------------------------------------ interrupt


@pytest.mark.parametrize(
    "busy",
    [
        "while True:\n    pass",
        "import time\ntime.sleep(100)",
        pytest.param("import asyncio\nawait asyncio.sleep(100)", marks=needs_await),
        "import subprocess\nsubprocess.run(['sleep', '100'])",
    ],
    ids=["busy-loop", "sleep", "await-sleep", "child-process"],
)
def test_interrupt_raises_keyboard_interrupt_and_keeps_state(driver, busy):
    driver.run("kept = 41\nimport asyncio, subprocess, time")  # slow imports out of the way
    mark = driver.start("print('started', flush=True)\n" + busy)
    driver.wait_stdout(mark, "started")
    driver.interrupt()
    cell = driver.finish(mark)
    assert cell.error["ename"] == "KeyboardInterrupt"
    assert_no_driver_frames(cell.error["traceback"])
    assert cell.error["traceback"][-1] == "KeyboardInterrupt"
    assert driver.run("kept + 1").value == "42"


def test_interrupted_busy_loop_points_at_the_users_line(driver):
    mark = driver.start("n = 0\nwhile True:\n    n += 1\n    if n == 1000:\n        print('go', flush=True)")
    driver.wait_stdout(mark, "go")
    driver.interrupt()
    tb = driver.finish(mark).error["traceback"]
    assert any(line in tb for line in ['  File "<cell-1>", line %d, in <module>' % n for n in (2, 3, 4, 5)]), tb
    assert driver.run("n >= 1000").value == "True"


def test_sigint_while_idle_is_ignored(driver):
    driver.run("kept = 'here'")
    for _ in range(3):
        driver.interrupt()
        driver.wait_signal_taken()
    assert driver.proc.poll() is None
    cell = driver.run("kept")
    assert cell.error is None and cell.value == "'here'"


# ------------------------------------------------------------------ output


def test_output_arrives_before_done(driver):
    cell = driver.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.stdout.write('no newline');")
    assert cell.stdout == "out\nno newline"
    assert cell.stderr == "err\n"
    assert cell.kinds()[-1] == "done"
    assert set(cell.kinds()[:-1]) == {"stdout", "stderr"}


def test_output_keeps_its_order_relative_to_results(driver):
    cell = driver.run("print('a')\ndisplay('b')\nprint('c')\n'd'")
    assert stdout_before(cell, lambda m: m.get("t") == "result" and not m["main"]).startswith("a\n")
    assert stdout_before(cell, lambda m: m.get("main")) == "a\nc\n"


def test_output_from_threads_and_child_processes(driver):
    code = (
        "import threading, subprocess\n"
        "t = threading.Thread(target=print, args=('from a thread',))\n"
        "t.start(); t.join()\n"
        "subprocess.run(['echo', 'from a child'])\n"
    )
    cell = driver.run(code)
    assert cell.stdout == "from a thread\nfrom a child\n"


def test_large_output_and_results_do_not_deadlock(driver):
    cell = driver.run("print('x' * 300000)\n'y' * 300000")
    assert cell.stdout == "x" * 300000 + "\n"
    assert cell.value == repr("y" * 300000)


def test_control_fds_are_not_inherited(driver):
    code = (
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.listdir(\"/proc/self/fd\")))'],"
        " close_fds=False)\n"
    )
    assert driver.run(code).stdout == "['0', '1', '2', '3']\n"


def test_shell_escape(driver):
    cell = driver.run("!echo from the shell\nprint('python')")
    assert cell.error is None
    assert cell.stdout == "from the shell\npython\n"
    # valid Python is never rewritten
    assert driver.run("x = 5\nx !=3").value == "True"


def test_pip_magic_runs_this_interpreters_pip(driver):
    require("pip")
    cell = driver.run("%pip --version")
    assert cell.error is None and cell.stdout.startswith("pip ")


def test_shell_escape_expands_and_captures(driver):
    driver.run("n = 3")
    assert driver.run("!echo {n + 1} $n $$ {{n}}").stdout == "4 3 $ {n}\n"
    assert driver.run("lines = !printf 'a\\nb\\n'\nlines").value == "['a', 'b']"


def test_line_magics(driver, tmp_path):
    assert driver.run("%matplotlib inline\n1").value == "1"  # accepted, nothing to do
    assert driver.run("%cd " + str(tmp_path)).stdout == str(tmp_path) + "\n"
    assert driver.run("%pwd").value == repr(str(tmp_path))
    assert driver.run("import os\nos.getcwd()").value == repr(str(tmp_path))
    assert driver.run("%env PVISOR_MAGIC=on").stdout == "env: PVISOR_MAGIC=on\n"
    assert driver.run("os.environ['PVISOR_MAGIC']").value == "'on'"
    cell = driver.run("%time sum(range(4))")
    assert cell.value == "6" and "Wall time: " in cell.stdout
    assert "per loop (mean ± std. dev. of 7 runs" in driver.run("%timeit sum(range(4))").stdout


def test_cell_magics(driver, tmp_path):
    target = tmp_path / "written.txt"
    cell = driver.run("%%writefile " + str(target) + "\nline one\n")
    assert cell.stdout == "Writing %s\n" % target and target.read_text() == "line one\n"
    assert driver.run("%%bash\nv=shell\necho \"in $v\"").stdout == "in shell\n"
    cell = driver.run("%%time\ny = 20\ny + 22")
    assert cell.value == "42" and cell.kinds() == ["stdout", "main", "done"]
    tb = driver.run("%%time\n\nraise KeyError('k')").error["traceback"]
    assert '  File "<cell-4>", line 3, in <module>' in tb and "    raise KeyError('k')" in tb


def test_unknown_magic_is_a_usage_error(driver):
    assert driver.run("%nosuchmagic").error["ename"] == "UsageError"
    assert driver.run("%%nosuchmagic\nbody").error["ename"] == "UsageError"
    assert driver.run("'fine'").value == "'fine'"


# ------------------------------------------------------------------ end


def test_eof_on_the_control_pipe_exits_zero(driver):
    driver.run("x = 1")
    driver.close_control()
    assert driver.wait_exit() == 0


# ------------------------------------------------------------------ matplotlib and pandas


def png(result):
    raw = base64.b64decode(result["data"]["image/png"])
    assert raw.startswith(b"\x89PNG\r\n\x1a\n")
    return raw


def test_matplotlib_figures_flush_at_the_end_of_the_cell(driver):
    require("matplotlib")
    cell = driver.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nprint('drawn')")
    assert cell.kinds() == ["stdout", "result", "done"]
    png(cell.results[0])
    assert driver.run("import matplotlib.pyplot as plt\nlen(plt.get_fignums())").value == "0"


def test_matplotlib_show_displays_in_place(driver):
    require("matplotlib")
    cell = driver.run("import matplotlib.pyplot as plt\nplt.plot([1])\nplt.show()\nprint('after show')")
    assert cell.kinds() == ["result", "stdout", "done"] or cell.kinds() == ["stdout", "result", "done"]
    assert stdout_before(cell, lambda m: m.get("t") == "done") == "after show\n"
    assert len(cell.results) == 1
    png(cell.results[0])
    assert "non-interactive" not in cell.stderr and "cannot be shown" not in cell.stderr


def test_matplotlib_figure_value_is_shown_once(driver):
    require("matplotlib")
    cell = driver.run("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2])\nfig")
    assert len(cell.results) == 1 and cell.results[0]["main"]
    assert cell.value.startswith("<Figure size")
    png(cell.results[0])


def test_pandas_frame_has_html(driver):
    require("pandas")
    cell = driver.run("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    data = cell.main[0]["data"]
    assert "<table" in data["text/html"]
    assert data["text/plain"].split() == ["a", "0", "1", "1", "2"]


# ------------------------------------------------------------------ robustness


@needs_await
def test_a_loop_set_up_by_sync_cells_is_adopted(driver):
    driver.run(
        "import asyncio, warnings\nwarnings.simplefilter('ignore', DeprecationWarning)\n"
        "async def job():\n    return 'scheduled earlier'\n"
        "task = asyncio.get_event_loop().create_task(job())"
    )
    assert driver.run("await task").value == "'scheduled earlier'"


def test_a_cell_resetting_sigint_does_not_make_idle_sigint_fatal(driver):
    driver.run("import signal\nsignal.signal(signal.SIGINT, signal.SIG_DFL)")
    driver.interrupt()
    driver.wait_signal_taken()
    driver.run("signal.signal(signal.SIGINT, signal.default_int_handler)")
    driver.interrupt()
    driver.wait_signal_taken()
    assert driver.proc.poll() is None
    assert driver.run("'alive'").value == "'alive'"


def test_forked_children_do_not_write_control_messages(driver):
    code = (
        "import multiprocessing\n"
        "child = multiprocessing.get_context('fork').Process(target=display, args=('from the child',))\n"
        "child.start(); child.join()\n"
        "child.exitcode"
    )
    cell = driver.run(code)
    assert [r["data"]["text/plain"] for r in cell.results] == ["0"]
    assert driver.run("'parent'").value == "'parent'"


def test_ipython_display_is_the_drivers(driver):
    require("IPython")
    cell = driver.run("from IPython.display import display, HTML\ndisplay(HTML('<b>x</b>'))")
    assert cell.results[0]["data"]["text/html"] == "<b>x</b>"
