"""The code interpreter end to end, with the official `opensandbox-code-interpreter`
SDK (1.1.1) unmodified: `CodeInterpreterSync.create(sandbox)` runs the SDK's own
readiness check (GET /ping, then a bash probe of 127.0.0.1:44771 in the sandbox).

Python runs in the tools image (numpy, pandas and matplotlib from Debian), bash in
the same sandbox, javascript in the node image (`pvisor/node:latest`, skipped
visibly when that archive was not built). Raw httpx calls check what the Python
SDK drops: the MIME bundle of a result, the event order and pings.
"""

from __future__ import annotations

import base64
import json
import threading
from datetime import timedelta

import httpx
import pytest
from code_interpreter import CodeInterpreterSync
from code_interpreter.models.code_sync import CodeContextSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.execd import Execution
from opensandbox.models.execd_sync import ExecutionHandlersSync

from conftest import SandboxFactory, _make_conn, _start_server, images_dir
from e2e_util import PYTHON, TOOLS, dataplane, stdout_text

NODE = "pvisor/node:latest"
NODE_ARCHIVE = "node-bookworm.tar"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RESOURCE = {"cpu": "1", "memory": "1Gi"}


def texts(ex: Execution) -> list[str]:
    return [r.text for r in ex.result]


def explain(ex: Execution) -> str:
    err = None if ex.error is None else f"{ex.error.name}: {ex.error.value} {ex.error.traceback}"
    return (f"id={ex.id} count={ex.execution_count} results={texts(ex)} error={err} "
            f"stdout={[m.text for m in ex.logs.stdout]} stderr={[m.text for m in ex.logs.stderr]}")


def ok(ex: Execution) -> Execution:
    assert ex.error is None and ex.complete is not None, explain(ex)
    return ex


@pytest.fixture(scope="module")
def tools_sb(module_sandbox):
    return module_sandbox(TOOLS, resource=RESOURCE)


@pytest.fixture(scope="module")
def ci(tools_sb):
    interp = CodeInterpreterSync.create(tools_sb)
    yield interp
    interp.close()


def raw_run(sb, body: dict, timeout: float = 60) -> list[dict]:
    """POST /code on the sandbox's execd endpoint; every event of the stream."""
    url, headers = dataplane(sb)
    events = []
    with httpx.Client(timeout=timeout) as c, c.stream("POST", f"{url}/code", json=body, headers=headers) as r:
        assert r.status_code == 200, (r.status_code, r.read())
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.strip():
                events.append(json.loads(line.removeprefix("data:").strip()))
    return events


# ---------------------------------------------------------------- python


def test_last_expression_is_the_result(ci):
    ex = ok(ci.codes.run("result = 2 + 2\nresult"))
    assert texts(ex) == ["4"], explain(ex)
    assert ex.id, "init carries the context id"


def test_state_persists_across_runs(ci):
    ctx = ci.codes.create_context("python")
    assert ctx.id and ctx.language == "python"
    ok(ci.codes.run("counter = 10\ndef bump():\n    global counter\n    counter += 1\n    return counter", context=ctx))
    ok(ci.codes.run("bump()", context=ctx))
    ex = ok(ci.codes.run("bump()", context=ctx))
    assert texts(ex) == ["12"], explain(ex)
    ex = ok(ci.codes.run("x = 1;", context=ctx))
    assert texts(ex) == [], f"a cell ending in ';' has no value: {explain(ex)}"


def test_output_streams_in_order_before_the_result(ci):
    seen: list[tuple[str, str]] = []
    handlers = ExecutionHandlersSync(
        on_stdout=lambda m: seen.append(("stdout", m.text)),
        on_result=lambda r: seen.append(("result", r.text)),
        on_execution_complete=lambda c: seen.append(("complete", "")),
    )
    code = "import sys, time\nfor i in range(3):\n    print(i)\n    time.sleep(0.2)\nprint('err', file=sys.stderr)\n'done'"
    ex = ok(ci.codes.run(code, handlers=handlers))
    kinds = [k for k, _ in seen]
    assert "".join(t for k, t in seen if k == "stdout") == "0\n1\n2\n", seen
    assert kinds[-2:] == ["result", "complete"], seen
    assert seen[-2] == ("result", "'done'"), seen
    assert "".join(m.text for m in ex.logs.stderr) == "err\n", explain(ex)


def test_exception_then_the_context_still_works(ci):
    ctx = ci.codes.create_context("python")
    ok(ci.codes.run("before = 'kept'", context=ctx))
    ex = ci.codes.run("def f():\n    return 1 / 0\nf()", context=ctx)
    assert ex.error is not None, explain(ex)
    assert ex.error.name == "ZeroDivisionError", explain(ex)
    assert ex.error.value == "division by zero", explain(ex)
    assert any("1 / 0" in line or "f()" in line for line in ex.error.traceback), explain(ex)
    ex = ok(ci.codes.run("before + '!'", context=ctx))
    assert texts(ex) == ["'kept!'"], explain(ex)


def test_contexts_are_isolated(ci):
    a = ci.codes.create_context("python")
    b = ci.codes.create_context("python")
    assert a.id != b.id
    ok(ci.codes.run("only_in_a = 1", context=a))
    ex = ci.codes.run("only_in_a", context=b)
    assert ex.error is not None and ex.error.name == "NameError", explain(ex)
    assert texts(ok(ci.codes.run("only_in_a + 1", context=a))) == ["2"]


def test_display_results_come_before_the_value(ci):
    ex = ok(ci.codes.run("display('a')\ndisplay(2)\n3"))
    assert texts(ex) == ["'a'", "2", "3"], explain(ex)


def test_list_get_and_delete_contexts(ci):
    a = ci.codes.create_context("python")
    b = ci.codes.create_context("python")
    assert ci.codes.get_context(a.id).id == a.id
    ids = {c.id for c in ci.codes.list_contexts("python")}
    assert {a.id, b.id} <= ids, ids
    assert all(c.language == "python" for c in ci.codes.list_contexts("python"))
    assert ci.codes.list_contexts("cobol") == []

    ci.codes.delete_context(a.id)
    with pytest.raises(SandboxApiException) as e:
        ci.codes.get_context(a.id)
    assert e.value.status_code == 404, e.value
    with pytest.raises(SandboxApiException) as e:
        ci.codes.delete_context(a.id)
    assert e.value.status_code == 404, e.value
    with pytest.raises(SandboxApiException) as e:
        ci.codes.run("1", context=a)
    assert e.value.status_code == 404, e.value

    ci.codes.delete_contexts("python")
    assert ci.codes.list_contexts("python") == []
    # the default context comes back on the next run without an id
    assert texts(ok(ci.codes.run("40 + 2"))) == ["42"]
    assert len(ci.codes.list_contexts("python")) == 1


def test_context_routes_answer_json_errors(tools_sb):
    url, headers = dataplane(tools_sb)
    with httpx.Client(timeout=30, headers=headers) as c:
        r = c.get(f"{url}/code/contexts/no-such-context")
        assert (r.status_code, r.json()["code"]) == (404, "CONTEXT_NOT_FOUND"), r.text
        r = c.delete(f"{url}/code/contexts", params={"language": ""})
        assert (r.status_code, r.json()["code"]) == (400, "MISSING_QUERY"), r.text
        r = c.delete(f"{url}/code")
        assert (r.status_code, r.json()["code"]) == (400, "MISSING_QUERY"), r.text
        r = c.post(f"{url}/code/context", json={"language": "cobol"})
        assert (r.status_code, r.json()["code"]) == (400, "INVALID_REQUEST_BODY"), r.text
        r = c.post(f"{url}/code", json={"code": "1", "context": {"language": "cobol"}})
        assert (r.status_code, r.json()["code"]) == (400, "INVALID_REQUEST_BODY"), r.text


@pytest.mark.deadline(120)
def test_interrupt_a_busy_loop_and_reuse_the_context(ci):
    ctx = ci.codes.create_context("python")
    ok(ci.codes.run("kept = 'state'", context=ctx))
    started = threading.Event()
    box: dict = {}

    def busy():
        handlers = ExecutionHandlersSync(on_stdout=lambda m: started.set())
        box["ex"] = ci.codes.run("print('spinning', flush=True)\nwhile True:\n    pass", context=ctx, handlers=handlers)

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    assert started.wait(30), "the busy cell never printed"
    ci.codes.interrupt(ctx.id)
    t.join(30)
    assert not t.is_alive(), "the interrupted run's stream did not close"
    ex = box["ex"]
    assert ex.id == ctx.id, explain(ex)
    assert ex.error is not None and ex.error.name == "KeyboardInterrupt", explain(ex)
    ex = ok(ci.codes.run("kept", context=ctx))
    assert texts(ex) == ["'state'"], explain(ex)
    # interrupting an idle context is a no-op
    ci.codes.interrupt(ctx.id)
    assert texts(ok(ci.codes.run("kept", context=ctx))) == ["'state'"]


@pytest.mark.deadline(120)
def test_a_cell_ignoring_the_interrupt_is_killed_and_its_context_restarted(ci):
    ctx = ci.codes.create_context("python")
    ok(ci.codes.run("lost = 1", context=ctx))
    started = threading.Event()
    box: dict = {}

    def stubborn():
        code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('deaf', flush=True)\nwhile True:\n    pass"
        box["ex"] = ci.codes.run(code, context=ctx, handlers=ExecutionHandlersSync(on_stdout=lambda m: started.set()))

    t = threading.Thread(target=stubborn, daemon=True)
    t.start()
    assert started.wait(30), "the cell never printed"
    ci.codes.interrupt(ctx.id)
    t.join(60)
    assert not t.is_alive(), "the killed run's stream did not close"
    assert box["ex"].error is not None and box["ex"].error.name == "ContextRestarted", explain(box["ex"])
    ex = ci.codes.run("lost", context=ctx)
    assert ex.error is not None and ex.error.name == "NameError", f"a fresh interpreter: {explain(ex)}"
    assert texts(ok(ci.codes.run("1 + 1", context=ctx))) == ["2"]


def test_matplotlib_figure_is_a_png_result(tools_sb, ci):
    ctx = ci.codes.create_context("python")
    code = "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2, 3], [1, 4, 9])\nfig"
    events = raw_run(tools_sb, {"code": code, "context": {"language": "python", "id": ctx.id}})
    results = [e["results"] for e in events if e["type"] == "result"]
    errors = [e for e in events if e["type"] == "error"]
    assert not errors, f"matplotlib must be in the tools image (rebuild the test images): {errors}"
    pngs = [r["image/png"] for r in results if "image/png" in r]
    assert pngs, events
    assert base64.b64decode(pngs[-1]).startswith(PNG_MAGIC)
    assert all("text" in r and "text/plain" not in r for r in results), results


def test_pandas_frame_has_an_html_result(tools_sb):
    code = "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"
    events = raw_run(tools_sb, {"code": code, "context": {"language": "python"}})
    results = [e["results"] for e in events if e["type"] == "result"]
    assert results, events
    html = results[-1].get("text/html", "")
    assert "<table" in html and "<td>x</td>" in html, results[-1]
    assert "a" in results[-1]["text"], results[-1]


def test_stream_events_order_and_pings(tools_sb):
    events = raw_run(tools_sb, {"code": "import time\nprint('a')\ntime.sleep(6.5)\n7", "context": {"language": "python"}})
    kinds = [e["type"] for e in events]
    assert kinds[0] == "init" and kinds.count("init") == 1, kinds
    assert all(isinstance(e.get("timestamp"), int) for e in events), events
    assert kinds[-1] == "execution_complete", kinds
    assert isinstance(events[-1]["execution_time"], int), events[-1]
    assert "ping" in kinds, f"a 6.5 s cell carries at least one ping: {kinds}"
    assert all(e["text"] == "pong" for e in events if e["type"] == "ping")
    i = kinds.index("result")
    assert kinds[i - 1] == "execution_count" and events[i - 1]["execution_count"] >= 1, events
    assert events[i]["results"]["text"] == "7", events[i]
    assert kinds.index("stdout") < i, kinds


def test_contexts_run_in_parallel(ci):
    """A waits for a file B creates: serialized runs would leave A waiting out its bound."""
    a = ci.codes.create_context("python")
    b = ci.codes.create_context("python")
    started = threading.Event()
    box: dict = {}
    code_a = ("import os, time\nprint('waiting', flush=True)\nfor _ in range(600):\n"
              "    if os.path.exists('/tmp/parallel-b'):\n        break\n    time.sleep(0.05)\n"
              "os.path.exists('/tmp/parallel-b')")

    def run_a():
        box["ex"] = ci.codes.run(code_a, context=a, handlers=ExecutionHandlersSync(on_stdout=lambda m: started.set()))

    t = threading.Thread(target=run_a, daemon=True)
    t.start()
    assert started.wait(30), "context A never started"
    ok(ci.codes.run("open('/tmp/parallel-b', 'w').close()", context=b))
    t.join(60)
    assert not t.is_alive()
    assert texts(ok(box["ex"])) == ["True"], explain(box["ex"])


def test_a_busy_context_runs_the_next_cell_after_the_current_one(ci):
    ctx = ci.codes.create_context("python")
    started = threading.Event()
    box: dict = {}

    def first():
        code = "import time\nprint('first', flush=True)\ntime.sleep(1)\norder = ['first']"
        box["ex"] = ci.codes.run(code, context=ctx, handlers=ExecutionHandlersSync(on_stdout=lambda m: started.set()))

    t = threading.Thread(target=first, daemon=True)
    t.start()
    assert started.wait(30), "the first cell never started"
    ex = ok(ci.codes.run("order.append('second')\norder", context=ctx))
    t.join(30)
    ok(box["ex"])
    assert texts(ex) == ["['first', 'second']"], explain(ex)


def test_a_client_disconnect_does_not_stop_the_run(tools_sb, ci):
    ctx = ci.codes.create_context("python")
    url, headers = dataplane(tools_sb)
    code = "import time\ntime.sleep(1)\nopen('/tmp/after-disconnect', 'w').write('done')"
    body = {"code": code, "context": {"language": "python", "id": ctx.id}}
    with httpx.Client(timeout=30) as c, c.stream("POST", f"{url}/code", json=body, headers=headers) as r:
        assert r.status_code == 200
        first = json.loads(next(r.iter_lines()).removeprefix("data:").strip())
        assert first["type"] == "init", first
    # the stream is closed; the cell goes on, and the context takes the next run after it
    ex = ok(ci.codes.run("open('/tmp/after-disconnect').read()", context=ctx))
    assert texts(ex) == ["'done'"], explain(ex)


# ---------------------------------------------------------------- bash, errors


def test_bash_context_keeps_env_and_cwd(ci):
    ctx = ci.codes.create_context("bash")
    assert ctx.language == "bash"
    ok(ci.codes.run("export PVISOR_CI_VAR=hello\ncd /tmp", context=ctx))
    ex = ok(ci.codes.run("echo \"$PVISOR_CI_VAR\"; pwd", context=ctx))
    assert stdout_text(ex) == "hello\n/tmp", explain(ex)
    ex = ci.codes.run("false", context=ctx)
    assert ex.error is not None, f"a failing bash cell is an error: {explain(ex)}"
    assert {c.id for c in ci.codes.list_contexts("bash")} >= {ctx.id}
    ci.codes.delete_contexts("bash")
    assert ci.codes.list_contexts("bash") == []


def test_unknown_language_is_a_400(ci):
    with pytest.raises(SandboxApiException) as e:
        ci.codes.run("print(1)", context=CodeContextSync(language="cobol"))
    assert e.value.status_code == 400, e.value
    with pytest.raises(SandboxApiException) as e:
        ci.codes.create_context("cobol")
    assert e.value.status_code == 400, e.value


def test_missing_interpreter_is_a_400_naming_it(sandbox):
    sb = sandbox(PYTHON)
    interp = CodeInterpreterSync.create(sb)
    try:
        with pytest.raises(SandboxApiException) as e:
            interp.codes.create_context("javascript")
        assert e.value.status_code == 400, e.value
        assert "node" in str(e.value), e.value
        with pytest.raises(SandboxApiException) as e:
            interp.codes.run("1 + 1", language="javascript")
        assert e.value.status_code == 400 and "node" in str(e.value), e.value
        assert texts(ok(interp.codes.run("1 + 1"))) == ["2"], "python still works there"
    finally:
        interp.close()


# ---------------------------------------------------------------- javascript


def test_javascript_state_and_result(sandbox, pvisor_server):
    if not (images_dir() / NODE_ARCHIVE).is_file():
        pytest.skip(f"{NODE} was not built ({images_dir() / NODE_ARCHIVE} missing): "
                    f"rerun images/testdata/build-test-images.sh")
    sb = sandbox(NODE, resource=RESOURCE)
    interp = CodeInterpreterSync.create(sb)
    try:
        ctx = interp.codes.create_context("javascript")
        ok(interp.codes.run("var a = 40;\nfunction add(x) { return a + x; }", context=ctx))
        ex = ok(interp.codes.run("console.log('hi'); add(2)", context=ctx))
        assert texts(ex) == ["42"], explain(ex)
        assert stdout_text(ex) == "hi", explain(ex)
        ex = interp.codes.run("throw new TypeError('boom')", context=ctx)
        assert ex.error is not None and ex.error.name == "TypeError" and ex.error.value == "boom", explain(ex)
        assert texts(ok(interp.codes.run("a", context=ctx))) == ["40"]
    finally:
        interp.close()


# ---------------------------------------------------------------- server proxy, vm


def test_server_proxy_mode(proxy_conn):
    f = SandboxFactory(proxy_conn)
    try:
        sb = f(PYTHON)
        interp = CodeInterpreterSync.create(sb)
        try:
            ctx = interp.codes.create_context("python")
            ok(interp.codes.run("v = 'proxied'", context=ctx))
            assert texts(ok(interp.codes.run("v", context=ctx))) == ["'proxied'"]
            assert ctx.id in {c.id for c in interp.codes.list_contexts("python")}
            interp.codes.delete_context(ctx.id)
            with pytest.raises(SandboxApiException) as e:
                interp.codes.get_context(ctx.id)
            assert e.value.status_code == 404
        finally:
            interp.close()
    finally:
        f.cleanup()


@pytest.mark.deadline(600)
def test_vm_backend_smoke(tmp_path_factory):
    from vm_util import VM_ENV, guest_kernel

    kernel = guest_kernel()  # skips visibly without a guest kernel or QEMU
    srv = _start_server(tmp_path_factory, "vm-code", ["python-3.11-slim.tar"],
                        {**VM_ENV, "PVISOR_GUEST_KERNEL": str(kernel)}, ["--backend", "vm"])
    f = SandboxFactory(_make_conn(srv.addr))
    try:
        sb = f(PYTHON, timeout=timedelta(minutes=10))
        interp = CodeInterpreterSync.create(sb, ready_timeout=timedelta(seconds=120))
        try:
            ex = ok(interp.codes.run("result = 2 + 2\nresult"))
            assert texts(ex) == ["4"], explain(ex)
        finally:
            interp.close()
    finally:
        f.cleanup()
        srv.stop()
