"""pvisor's Python interpreter driver: one long-lived process per code context.

The agent embeds this file and runs it as ``python3 -u -c <source>`` with the
image's own interpreter (standard library only), then speaks the JSON-lines
protocol of ``agent/src/code/PROTOCOL.md`` with it: ``exec`` requests come in
on fd 3, ``ready``/``result``/``error``/``done`` go out on fd 4, and the user's
output goes to fd 1 and fd 2 unchanged.

A cell runs with notebook (REPL) semantics: the source is parsed with ``ast``;
when the last statement is an expression and the cell does not end in ``;`` it
is evaluated on its own and its value (when not ``None``) becomes the cell's
main result and ``builtins._``. Cells compile with top-level ``await`` allowed
and such cells run on one persistent event loop. User globals live in a fresh
``__main__`` module registered in ``sys.modules`` (pickle, dataclasses and
``if __name__ == "__main__"`` work), cell sources are registered in
``linecache`` as ``<cell-N>`` so tracebacks show the user's lines, and the
driver's own frames are stripped from tracebacks.

Rich results come from the object's display hooks (``_repr_mimebundle_``,
``_repr_html_``, ...), matplotlib figures are rendered to PNG; ``plt.show()``
and the end of every cell display the open pyplot figures, as Jupyter's inline
backend does. ``display(*objs)`` is a builtin. SIGINT interrupts a running cell
with ``KeyboardInterrupt`` and is ignored while idle; ``SystemExit`` in a cell
is reported as an error and the context lives on; EOF on fd 3 ends the driver.

A cell that is not valid Python gets IPython's escapes: ``!cmd`` (and
``x = !cmd``), the line magics ``%pip %cd %pwd %env %time %timeit`` (and
``%matplotlib`` as a no-op), the cell magics ``%%bash %%sh %%writefile %%time``.

Written for Python 3.7+ syntax (top-level ``await`` needs 3.8); heavy modules (asyncio, traceback, pprint,
tokenize) are imported only when a cell needs them, to keep start-up short.
"""

import __future__
import ast
import builtins
import fcntl
import json
import linecache
import os
import signal
import sys
import threading
import types

# The agent hands us the control pipes on these fds (PROTOCOL.md).
_CONTROL_IN_FD = 3
_CONTROL_OUT_FD = 4
# The pipes are moved above the fds user code is likely to use or close.
_CONTROL_FD_FLOOR = 64

_CO_COROUTINE = 0x0080  # inspect.CO_COROUTINE, without importing inspect
_TOP_LEVEL_AWAIT = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
# Flags of the `from __future__` features a cell can switch on for later cells.
_FUTURE_MASK = getattr(getattr(__future__, "annotations", None), "compiler_flag", 0)

# MIME types whose values travel base64-encoded.
_BINARY_MIMES = ("image/png", "image/jpeg", "image/gif", "application/pdf")
# Display hooks, in the order their MIME types are filled in.
_REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
    ("_repr_javascript_", "application/javascript"),
    ("_repr_pdf_", "application/pdf"),
)

_DRIVER_GLOBALS = globals()
# The driver's own module object; kept so its globals stay alive once the
# user's module replaces it as `__main__`.
_DRIVER_MODULE = sys.modules.get("__main__")


class _State:
    """Mutable driver state shared by the cell runner and the SIGINT handler."""

    in_cell = False  # SIGINT raises KeyboardInterrupt only while this is set
    active = False  # from an exec until its done: results may be sent
    critical = 0  # >0 while a control message is being written: SIGINT waits
    pending_interrupt = False
    count = 0
    compile_flags = _TOP_LEVEL_AWAIT
    loop = None
    namespace = None  # the user's globals
    shown_figures = None  # ids of figures already displayed in this cell


# ---------------------------------------------------------------- control I/O

_in_fd = -1
_out_fd = -1
_out_lock = threading.Lock()


def _move_control_fd(fd):
    """Duplicate `fd` close-on-exec above the usual fds and close the original."""
    try:
        moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _CONTROL_FD_FLOOR)
    except OSError:  # a tiny RLIMIT_NOFILE: keep the fd where it is, close-on-exec
        os.set_inheritable(fd, False)
        return fd
    os.close(fd)
    return moved


def _flush_user_streams():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass


def _send(message):
    """Write one control message, after flushing the user's output (ordering contract)."""
    if _out_fd < 0:
        return  # a forked child of user code: the control pipe is the parent's
    line = (json.dumps(message, ensure_ascii=False) + "\n").encode("utf-8", "replace")
    # SIGINT is handled on the main thread: there a KeyboardInterrupt must not
    # cut a message in half, so it waits until the line is written.
    on_main = threading.current_thread() is threading.main_thread()
    with _out_lock:
        if on_main:
            _State.critical += 1
        try:
            _flush_user_streams()
            view = memoryview(line)
            while view:
                written = os.write(_out_fd, view)
                view = view[written:]
        finally:
            if on_main:
                _State.critical -= 1
    if on_main and _State.pending_interrupt and _State.in_cell:
        _State.pending_interrupt = False
        raise KeyboardInterrupt


def _read_requests(fd):
    """Yield the request lines from the control pipe until EOF (or until it is gone)."""
    buffer = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except KeyboardInterrupt:
            continue  # a SIGINT handler set by user code raised while idle
        except OSError:
            return
        if not chunk:
            return
        buffer += chunk
        while True:
            newline = buffer.find(b"\n")
            if newline < 0:
                break
            line, buffer = buffer[:newline], buffer[newline + 1 :]
            if line.strip():
                yield line


def _forget_control_fds():
    """In a child forked by user code: close the parent's control pipes, send nothing."""
    global _out_fd, _in_fd
    for fd in (_in_fd, _out_fd):
        try:
            os.close(fd)
        except OSError:
            pass
    _in_fd = _out_fd = -1


def _restore_sigint():
    """Put the driver's SIGINT handler back if a cell reset it to one that kills or raises idle."""
    try:
        if signal.getsignal(signal.SIGINT) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(signal.SIGINT, _on_sigint)
    except (ValueError, TypeError):
        pass


def _on_sigint(signum, frame):
    """Interrupt a running cell; a SIGINT while idle is dropped."""
    if not _State.in_cell:
        return
    if _State.critical:
        _State.pending_interrupt = True
        return
    raise KeyboardInterrupt


# ------------------------------------------------------------------ results


def _encode(mime, value):
    """One MIME value as the protocol's string, or None to drop it."""
    if value is None:
        return None
    if mime in _BINARY_MIMES:
        if isinstance(value, (bytes, bytearray, memoryview)):
            import base64

            return base64.b64encode(bytes(value)).decode("ascii")
        return str(value)
    if mime == "application/json" or mime.endswith("+json"):
        if isinstance(value, str):
            return value
        return json.dumps(value, default=repr)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else str(value)


def _warn(what, exc):
    try:
        sys.stderr.write("pvisor: %s failed: %s: %s\n" % (what, type(exc).__name__, exc))
    except Exception:
        pass


def _hook(obj, name):
    """The bound display hook `name` of `obj`, or None (also when looking it up fails)."""
    try:
        method = getattr(obj, name, None)
    except Exception:
        return None
    return method if callable(method) else None


def _call_hook(obj, name, *args, **kwargs):
    """Call a display hook; a broken one only loses its MIME types (with a note on stderr)."""
    method = _hook(obj, name)
    if method is None:
        return None
    try:
        value = method(*args, **kwargs)
    except Exception as exc:
        _warn("%s.%s()" % (type(obj).__name__, name), exc)
        return None
    if isinstance(value, tuple) and len(value) == 2:  # (data, metadata)
        value = value[0]
    return value


def _add_bundle(data, bundle):
    """Encode the MIME types of `bundle` not yet in `data`."""
    for mime, value in bundle.items():
        mime = str(mime)
        if mime not in data:
            encoded = _encode(mime, value)
            if encoded is not None:
                data[mime] = encoded


def _plain_text(obj):
    text = repr(obj)
    # Long builtin containers are pretty-printed, as IPython does (up to a size where
    # pprint's own cost would show).
    if 79 < len(text) < 100000 and type(obj) in (list, tuple, dict, set, frozenset):
        try:
            import pprint

            if sys.version_info >= (3, 8):
                text = pprint.pformat(obj, width=79, sort_dicts=False)
            else:
                text = pprint.pformat(obj, width=79)
        except Exception:
            pass
    return text


def _figure_png(fig):
    import base64
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _is_figure(obj):
    figure_module = sys.modules.get("matplotlib.figure")
    return figure_module is not None and isinstance(obj, figure_module.Figure)


def _format(obj):
    """The MIME bundle of `obj`: its display hooks' output plus `text/plain`."""
    data = {}
    # Classes carry the hooks as plain functions, and objects that answer every
    # attribute (mocks, proxies) would answer them too: both get repr only.
    rich = not isinstance(obj, type) and _hook(obj, "_ipython_canary_method_should_not_exist_") is None
    if rich:
        bundle = _call_hook(obj, "_repr_mimebundle_", include=None, exclude=None)
        if isinstance(bundle, dict):
            _add_bundle(data, bundle)
        for name, mime in _REPR_METHODS:
            if mime not in data:
                encoded = _encode(mime, _call_hook(obj, name))
                if encoded is not None:
                    data[mime] = encoded
        if "image/png" not in data and _is_figure(obj):
            try:
                data["image/png"] = _figure_png(obj)
            except Exception as exc:
                _warn("rendering the figure", exc)
    if "text/plain" not in data:
        data["text/plain"] = _plain_text(obj)
    return data


def _emit_result(obj, main):
    if _is_figure(obj) and _State.shown_figures is not None:
        _State.shown_figures.add(id(obj))
    _emit_bundle(_format(obj), main)


def _emit_bundle(data, main):
    if not _State.active:
        return  # display() from a thread after its cell ended: no run to attach it to
    _send({"t": "result", "data": data, "main": main})


def display(*objs, **kwargs):
    """Show each object as a rich result of the running cell (IPython's `display`).

    `raw=True` takes each object as a ready MIME bundle ({mime: data}).
    Other IPython keywords (display_id, metadata, ...) are accepted and ignored.
    """
    raw = kwargs.get("raw", False)
    for obj in objs:
        if raw and isinstance(obj, dict):
            data = {}
            _add_bundle(data, obj)
            data.setdefault("text/plain", "")
            _emit_bundle(data, False)
        else:
            _emit_result(obj, False)


# --------------------------------------------------------------- matplotlib


def _flush_figures():
    """Display every open pyplot figure not yet shown in this cell, then close them all."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        from matplotlib._pylab_helpers import Gcf

        figures = [manager.canvas.figure for manager in Gcf.get_all_fig_managers()]
    except Exception as exc:
        _warn("listing the open figures", exc)
        return
    try:
        for fig in figures:
            if _State.shown_figures is None or id(fig) not in _State.shown_figures:
                _emit_result(fig, False)
    finally:
        try:
            pyplot.close("all")
        except Exception as exc:
            _warn("closing the figures", exc)


def _inline_show(*args, **kwargs):
    """`plt.show()`: display the open figures, as Jupyter's inline backend does."""
    _flush_figures()


def _patch_pyplot(module):
    module.show = _inline_show


def _patch_ipython_display(module):
    """IPython's `display()` (when the image has IPython but no kernel runs) is ours."""
    if hasattr(module, "display"):
        module.display = display


class _PostImportHooks:
    """A meta-path finder that runs a patch right after some modules first load."""

    def __init__(self, hooks):
        self.hooks = hooks
        self.busy = set()

    def find_spec(self, fullname, path=None, target=None):
        hook = self.hooks.get(fullname)
        if hook is None or fullname in self.busy:
            return None
        import importlib.util

        self.busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        except Exception:
            return None
        finally:
            self.busy.discard(fullname)
        loader = getattr(spec, "loader", None) if spec is not None else None
        exec_module = getattr(loader, "exec_module", None)
        # Only a loader instance made for this spec may be patched (never a shared class
        # such as the frozen or built-in importers).
        if exec_module is None or isinstance(loader, type):
            return spec

        def exec_then_patch(module):
            exec_module(module)
            try:
                hook(module)
            except Exception as exc:
                _warn("patching %s" % fullname, exc)

        try:
            loader.exec_module = exec_then_patch
        except Exception:
            return spec
        return spec


# --------------------------------------------------- IPython-style escapes
# Only a cell that is not valid Python is rewritten: `!cmd` and `%magic` lines become
# calls of the builtins below, a `%%magic` first line turns the cell into that magic.


class UsageError(Exception):
    """A magic used wrongly or not available (IPython's name for it)."""


def _expand(command):
    """IPython's `{expr}` and `$name` expansion in shell lines; unchanged if anything fails."""
    import re

    namespace = _State.namespace
    try:
        command = re.sub(r"(?<!\{)\{([^{}]+)\}(?!\})", lambda m: str(eval(m.group(1), namespace)), command)
    except Exception:
        return command
    command = re.sub(
        r"\$(\$|[A-Za-z_]\w*)",
        lambda m: "$" if m.group(1) == "$" else str(namespace[m.group(1)]) if m.group(1) in namespace else m.group(0),
        command,
    )
    return command.replace("{{", "{").replace("}}", "}")


def _shell_escape(command, capture=False):
    """`!cmd` runs a shell command on the cell's stdout/stderr; `x = !cmd` returns its lines."""
    import subprocess

    command = _expand(command)
    _flush_user_streams()
    if capture:
        output = subprocess.run(command, shell=True, stdout=subprocess.PIPE).stdout
        return output.decode("utf-8", "replace").splitlines()
    subprocess.call(command, shell=True)
    return None


def _clock():
    """(user CPU, system CPU, wall) seconds, for %time and %%time."""
    import resource
    import time

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime, time.perf_counter()


def _print_times(started):
    user, system, wall = (now - then for now, then in zip(_clock(), started))
    print(
        "CPU times: user %s, sys: %s, total: %s\nWall time: %s"
        % (_duration(user), _duration(system), _duration(user + system), _duration(wall))
    )


def _duration(seconds):
    for unit, scale in (("s", 1.0), ("ms", 1e3), ("µs", 1e6)):
        if seconds >= 1.0 / scale:
            return "%.3g %s" % (seconds * scale, unit)
    return "%.3g ns" % (seconds * 1e9) if seconds > 0 else "0 ns"


def _magic_time(args):
    try:
        code = compile(args, "<magic-time>", "eval", _State.compile_flags, True)
    except SyntaxError:
        code = compile(args, "<magic-time>", "exec", _State.compile_flags, True)
    started = _clock()
    try:
        return eval(code, _State.namespace)
    finally:
        _print_times(started)


def _magic_timeit(args):
    import math
    import timeit

    timer = timeit.Timer(args, globals=_State.namespace)
    loops, _ = timer.autorange()
    runs = [t / loops for t in timer.repeat(repeat=7, number=loops)]
    mean = sum(runs) / len(runs)
    deviation = math.sqrt(sum((t - mean) ** 2 for t in runs) / len(runs))
    print(
        "%s ± %s per loop (mean ± std. dev. of 7 runs, %d loop%s each)"
        % (_duration(mean), _duration(deviation), loops, "" if loops == 1 else "s")
    )


def _magic_env(args):
    if not args:
        return dict(os.environ)
    if "=" in args or " " in args.strip():
        name, _, value = args.replace("=", " ", 1).partition(" ")
        os.environ[name.strip()] = _expand(value.strip())
        print("env: %s=%s" % (name.strip(), value.strip()))
        return None
    return os.environ.get(args.strip())


def _magic_cd(args):
    target = os.path.expanduser(_expand(args.strip()) or "~")
    os.chdir(target)
    print(os.getcwd())


def _magic_pip(args):
    import shlex
    import subprocess

    words = shlex.split(_expand(args))
    _flush_user_streams()
    status = subprocess.call([sys.executable, "-m", "pip"] + words)
    if status == 0 and words[:1] in (["install"], ["uninstall"]):
        print("Note: you may need to restart the context to use updated packages.")


# Magics that mean nothing here (the inline plotting they ask for is always on).
_IGNORED_MAGICS = ("matplotlib", "load_ext", "autoreload", "config")


def _magic(line):
    """A `%name args` line magic: pip, cd, pwd, env, time, timeit; inline-plotting ones are no-ops."""
    name, _, args = line.strip().partition(" ")
    args = args.strip()
    if name == "pip":
        return _magic_pip(args)
    if name == "cd":
        return _magic_cd(args)
    if name == "pwd":
        return os.getcwd()
    if name == "env":
        return _magic_env(args)
    if name == "time":
        return _magic_time(args)
    if name == "timeit":
        return _magic_timeit(args)
    if name in _IGNORED_MAGICS:
        return None
    raise UsageError(
        "Line magic function `%%%s` not found (pvisor has %%pip, %%cd, %%pwd, %%env, %%time, %%timeit)." % name
    )


def _cell_magic(line, body):
    """A `%%name args` cell: bash/sh (the cell is a script), writefile; %%time is in _run_cell."""
    import subprocess

    name, _, args = line.strip().partition(" ")
    args = args.strip()
    if name in ("bash", "sh"):
        _flush_user_streams()
        subprocess.call([name, "-c", body])
        return None
    if name == "writefile":
        append = args.startswith("-a ") or args.startswith("--append ")
        path = os.path.expanduser(_expand(args.split(None, 1)[1] if append else args))
        exists = os.path.exists(path)
        with open(path, "a" if append else "w") as handle:
            handle.write(body)
        print("%s %s" % ("Appending to" if append else "Overwriting" if exists else "Writing", path))
        return None
    raise UsageError("Cell magic `%%%%%s` not found (pvisor has %%%%bash, %%%%sh, %%%%writefile, %%%%time)." % name)


def _transform_escapes(source):
    """Rewrite `!cmd`, `x = !cmd` and `%magic` lines into calls; None if there are none."""
    import re

    lines = source.splitlines(True)
    changed = False
    for index, line in enumerate(lines):
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        body = stripped.rstrip("\r\n")
        captured = re.match(r"([A-Za-z_][\w.]*(?:\[[^\]]*\])?)\s*=\s*!(.*)$", body)
        if captured:
            call = "%s = __pvisor_shell__(%r, capture=True)" % (captured.group(1), captured.group(2))
        elif body.startswith("!") and not body.startswith("!="):
            call = "__pvisor_shell__(%r)" % body[1:]
        elif body.startswith("%") and body[1:2].isalpha():
            call = "__pvisor_magic__(%r)" % body[1:]
        else:
            continue
        lines[index] = indent + call + line[len(indent) + len(body) :]
        changed = True
    return "".join(lines) if changed else None


def _split_cell_magic(source):
    """(magic line, rest) when the cell's first line is `%%magic ...`, else None."""
    stripped = source.lstrip("\r\n\t ")
    if not stripped.startswith("%%"):
        return None
    first, _, rest = stripped.partition("\n")
    return first[2:], rest


# ------------------------------------------------------------------ cells


def _ends_with_semicolon(source):
    """Whether the cell's last token is `;` (which suppresses its value)."""
    if ";" not in source:
        return False
    import io
    import tokenize

    last = None
    skip = (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT)
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type not in skip:
                last = token
    except Exception:
        return source.rstrip().endswith(";")
    return last is not None and last.type == tokenize.OP and last.string == ";"


def _parse(source, filename):
    """The cell's AST; `!cmd`/`%pip` lines are rewritten only if the cell is not Python."""
    flags = ast.PyCF_ONLY_AST | _State.compile_flags
    try:
        return compile(source, filename, "exec", flags, True)
    except SyntaxError as error:
        original = error
    rewritten = _transform_escapes(source)
    if rewritten is not None:
        try:
            return compile(rewritten, filename, "exec", flags, True)
        except SyntaxError:
            pass
    raise original


def _compile(tree, filename, mode):
    code = compile(tree, filename, mode, _State.compile_flags, True)
    _State.compile_flags |= code.co_flags & _FUTURE_MASK
    return code


def _event_loop():
    """The context's persistent event loop, made (or adopted) by the first `await` cell."""
    import asyncio

    loop = _State.loop
    if loop is None or loop.is_closed():
        loop = None
        # A loop that earlier sync cells set up (asyncio.get_event_loop()) is adopted,
        # so the tasks they scheduled on it run.
        try:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                current = asyncio.get_event_loop_policy().get_event_loop()
            if not current.is_closed() and not current.is_running():
                loop = current
        except Exception:
            pass
        if loop is None:
            loop = asyncio.new_event_loop()
        _State.loop = loop
    asyncio.set_event_loop(loop)
    return loop


def _run_coroutine(coroutine):
    loop = _event_loop()
    import asyncio

    task = asyncio.ensure_future(coroutine, loop=loop)
    try:
        return loop.run_until_complete(task)
    except BaseException:
        if not task.done():  # interrupted while the loop waited: end the cell's task
            task.cancel()
            try:
                loop.run_until_complete(asyncio.wait([task], timeout=1))
            except BaseException:
                pass
        raise


def _run(code, namespace):
    value = eval(code, namespace)
    if code.co_flags & _CO_COROUTINE:
        value = _run_coroutine(value)
    return value


def _run_cell(source, namespace):
    """Compile and run one cell; emits its results. Raises what the cell raised."""
    filename = "<cell-%d>" % _State.count
    lines = source.splitlines(True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"  # as a file's last line reads (inspect.getsource)
    linecache.cache[filename] = (len(source), None, lines, filename)
    magic = _split_cell_magic(source)
    if magic is None:
        value = _run_python(source, filename, namespace)
    elif magic[0].split(" ", 1)[0] == "time":
        # %%time: the rest of the cell is an ordinary cell (its line numbers kept), timed.
        started = _clock()
        try:
            value = _run_python(source[: source.index("%%")] + "\n" + magic[1], filename, namespace)
        finally:
            _print_times(started)
    else:
        value = _cell_magic(*magic)
    if value is not None:
        builtins._ = value
        if _is_figure(value):
            _State.shown_figures.add(id(value))
    _flush_figures()
    if value is not None:
        _emit_result(value, True)


def _run_python(source, filename, namespace):
    """Run a cell's Python code; the value of its last expression (None if it has none)."""
    tree = _parse(source, filename)
    body = tree.body
    last = None
    if body and isinstance(body[-1], ast.Expr) and not _ends_with_semicolon(source):
        last = body.pop()
    if body:
        module = ast.Module(body=body)
        module.type_ignores = []
        _run(_compile(module, filename, "exec"), namespace)
    if last is None:
        return None
    return _run(_compile(ast.Expression(body=last.value), filename, "eval"), namespace)


def _user_traceback(tb):
    """`tb` without the driver's frames: from the first cell frame on, driver frames dropped."""
    kept = []
    started = False
    while tb is not None:
        frame = tb.tb_frame
        if not started and frame.f_code.co_filename.startswith("<cell-"):
            started = True
        if started and frame.f_globals is not _DRIVER_GLOBALS:
            kept.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def _error_message(exc):
    import traceback

    seen = set()
    chained = exc
    while chained is not None and id(chained) not in seen:
        seen.add(id(chained))
        try:
            chained.__traceback__ = _user_traceback(chained.__traceback__)
        except Exception:
            pass
        chained = chained.__cause__ or (None if chained.__suppress_context__ else chained.__context__)
    try:
        evalue = str(exc)
    except Exception:
        evalue = "<str() of the exception failed>"
    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:
        text = "%s: %s\n" % (type(exc).__name__, evalue)
    return {"t": "error", "ename": type(exc).__name__, "evalue": evalue, "traceback": text.splitlines()}


def _execute(request, namespace):
    """One `exec` request: run the cell, then `error` if it raised, then `done`."""
    _State.count += 1
    _State.active = True
    _State.pending_interrupt = False
    failure = None
    source = request.get("code") if isinstance(request, dict) else None
    _State.shown_figures = set()
    try:
        if not isinstance(source, str):
            raise TypeError("pvisor: an exec request needs a string `code`")
        _State.in_cell = True
        try:
            _run_cell(source, namespace)
        finally:
            _State.in_cell = False
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the context lives on
        _State.in_cell = False
        failure = exc
    if failure is not None:
        try:
            _flush_figures()
        except Exception:
            pass
        message = _error_message(failure)
        # For pdb.pm() and friends, as the interactive interpreter does.
        sys.last_type, sys.last_value, sys.last_traceback = type(failure), failure, failure.__traceback__
        sys.last_exc = failure
        _send(message)
    _State.shown_figures = None
    _restore_sigint()
    _State.active = False
    _send({"t": "done", "count": _State.count})


def _user_namespace():
    """A fresh `__main__` module for the user's globals, registered in sys.modules."""
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    return module.__dict__


def main():
    global _in_fd, _out_fd
    _in_fd = _move_control_fd(_CONTROL_IN_FD)
    _out_fd = _move_control_fd(_CONTROL_OUT_FD)
    signal.signal(signal.SIGINT, _on_sigint)
    namespace = _user_namespace()
    builtins.display = display
    builtins.__pvisor_shell__ = _shell_escape
    builtins.__pvisor_magic__ = _magic
    _State.namespace = namespace
    hooks = {
        "matplotlib.pyplot": _patch_pyplot,
        "IPython.core.display_functions": _patch_ipython_display,
        "IPython.core.display": _patch_ipython_display,
    }
    sys.meta_path.insert(0, _PostImportHooks(hooks))
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget_control_fds)
    version = "%d.%d.%d" % sys.version_info[:3]
    _send({"t": "ready", "version": version})
    for line in _read_requests(_in_fd):
        try:
            request = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            request = None
        if isinstance(request, dict) and request.get("op") not in (None, "exec"):
            continue  # unknown operations are for newer drivers
        try:
            _execute(request, namespace)
        except KeyboardInterrupt:
            # A SIGINT that landed between the cell's end and its bookkeeping.
            _State.in_cell = _State.active = False
            _send({"t": "done", "count": _State.count})
    _flush_user_streams()
    sys.exit(0)


main()
