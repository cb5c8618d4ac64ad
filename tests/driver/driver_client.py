"""A stand-in for the agent's side of the Python driver protocol (agent/src/code/PROTOCOL.md).

It starts `agent/src/code/python/driver.py` exactly as the agent does (`python3 -u -c
<source>`, fd 0 /dev/null, fds 1/2 pipes, fd 3 control in, fd 4 control out, its own
process group, MPLBACKEND=Agg) and reads the pipes the way the agent must: on each control
message it first drains whatever is readable on fds 1/2 without blocking, so the events it
records keep the order the protocol promises.

Environment: PVISOR_DRIVER_PYTHON picks the interpreter (default: /usr/bin/python3, else
`python3` on PATH).
"""

import fcntl
import json
import os
import selectors
import shutil
import signal
import subprocess
from pathlib import Path

DRIVER = Path(__file__).resolve().parents[2] / "agent" / "src" / "code" / "python" / "driver.py"
# A safety net so a broken driver fails the test instead of hanging it; not a timing check.
WAIT = 60.0


def interpreter():
    """The driver's interpreter: the system's own python3 (Debian's, as in the images) by default."""
    system = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else None
    python = os.environ.get("PVISOR_DRIVER_PYTHON") or system or shutil.which("python3")
    if not python:
        raise RuntimeError("no python3 on PATH (set PVISOR_DRIVER_PYTHON)")
    return python


class DriverError(Exception):
    pass


class Driver:
    """One driver process and the events it produced, in the order an agent sees them."""

    def __init__(self, python=None, env=None):
        control_in_r, self._control_in_w = os.pipe()
        self._control_out_r, control_out_w = os.pipe()

        def place_control_fds():
            # Runs in the child before exec: put the pipe ends on fds 3 and 4.
            high_in = fcntl.fcntl(control_in_r, fcntl.F_DUPFD, 10)
            high_out = fcntl.fcntl(control_out_w, fcntl.F_DUPFD, 10)
            os.dup2(high_in, 3)
            os.dup2(high_out, 4)
            os.setpgid(0, 0)

        environment = dict(os.environ if env is None else env)
        environment["MPLBACKEND"] = "Agg"
        environment["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [python or interpreter(), "-u", "-c", DRIVER.read_text()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(3, 4),
            preexec_fn=place_control_fds,
            env=environment,
        )
        os.close(control_in_r)
        os.close(control_out_w)
        for fd in (self.proc.stdout.fileno(), self.proc.stderr.fileno(), self._control_out_r):
            os.set_blocking(fd, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout.fileno(), selectors.EVENT_READ, "stdout")
        self._selector.register(self.proc.stderr.fileno(), selectors.EVENT_READ, "stderr")
        self._selector.register(self._control_out_r, selectors.EVENT_READ, "control")
        self._control_buffer = b""
        self._open = {"stdout", "stderr", "control"}
        self.events = []  # every event ever seen: ("stdout"|"stderr", text) or ("control", message)
        self.ready = self.next_message()
        if self.ready.get("t") != "ready":
            raise DriverError("expected ready, got %r" % (self.ready,))

    # -- reading

    def _drain(self, name, fd):
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                self._open.discard(name)
                self._selector.unregister(fd)
                return
            self.events.append((name, chunk.decode("utf-8", "replace")))

    def _drain_output(self):
        self._drain("stdout", self.proc.stdout.fileno()) if "stdout" in self._open else None
        self._drain("stderr", self.proc.stderr.fileno()) if "stderr" in self._open else None

    def _pop_message(self):
        newline = self._control_buffer.find(b"\n")
        if newline < 0:
            return None
        line, self._control_buffer = self._control_buffer[:newline], self._control_buffer[newline + 1 :]
        # The agent's rule: before handling a control message, emit the output already written.
        self._drain_output()
        message = json.loads(line)
        self.events.append(("control", message))
        return message

    def next_message(self, wait=WAIT):
        """The next control message (output read meanwhile is recorded); None at EOF."""
        message = self._pop_message()
        if message is not None:
            return message
        while "control" in self._open:
            ready = self._selector.select(wait)
            if not ready:
                raise DriverError("no control message within %ss; events so far: %r" % (wait, self.events[-10:]))
            for key, _ in ready:
                if key.data == "control":
                    chunk = b""
                    try:
                        chunk = os.read(self._control_out_r, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        self._open.discard("control")
                        self._selector.unregister(self._control_out_r)
                    self._control_buffer += chunk
                else:
                    self._drain(key.data, key.fd)
            message = self._pop_message()
            if message is not None:
                return message
        return None

    # -- requests

    def send(self, request):
        os.write(self._control_in_w, (json.dumps(request) + "\n").encode())

    def start(self, code):
        """Send one cell; return the index in `events` where its events begin."""
        mark = len(self.events)
        self.send({"op": "exec", "code": code})
        return mark

    def finish(self, mark):
        """Read until the cell's `done`; return its events."""
        while True:
            message = self.next_message()
            if message is None:
                raise DriverError("control pipe closed before done; events: %r" % (self.events[mark:],))
            if message.get("t") == "done":
                return Cell(self.events[mark:])

    def run(self, code):
        return self.finish(self.start(code))

    def wait_stdout(self, mark, text):
        """Read until `text` shows up in the stdout written since `mark` (cell sync point)."""
        while text not in "".join(t for name, t in self.events[mark:] if name == "stdout"):
            if not self._selector.get_map():
                raise DriverError("pipes closed before %r was printed" % (text,))
            ready = self._selector.select(WAIT)
            if not ready:
                raise DriverError("%r not printed within %ss; events: %r" % (text, WAIT, self.events[mark:]))
            for key, _ in ready:
                if key.data == "control":
                    message = self.next_message()
                    if message is not None and message.get("t") == "done":
                        raise DriverError("cell ended before printing %r: %r" % (text, self.events[mark:]))
                else:
                    self._drain(key.data, key.fd)

    def interrupt(self):
        os.kill(self.proc.pid, signal.SIGINT)

    def wait_signal_taken(self):
        """Wait until the driver has taken its pending signals and sleeps again (idle)."""
        status = Path("/proc/%d/status" % self.proc.pid)
        while True:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
            if not pending and fields["State"].strip().startswith("S"):
                return
            os.sched_yield()

    def close_control(self):
        os.close(self._control_in_w)
        self._control_in_w = None

    def wait_exit(self, wait=WAIT):
        code = self.proc.wait(wait)
        self._drain_output()
        return code

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if self._control_in_w is not None:
            os.close(self._control_in_w)
            self._control_in_w = None
        self._selector.close()
        os.close(self._control_out_r)
        self.proc.stdout.close()
        self.proc.stderr.close()


class Cell:
    """The events of one cell, from its `exec` to its `done`."""

    def __init__(self, events):
        self.events = events
        self.messages = [event[1] for event in events if event[0] == "control"]
        self.done = self.messages[-1]
        self.results = [m for m in self.messages if m.get("t") == "result"]
        self.main = [m for m in self.results if m.get("main")]
        errors = [m for m in self.messages if m.get("t") == "error"]
        self.error = errors[0] if errors else None
        self.stdout = "".join(text for name, text in events if name == "stdout")
        self.stderr = "".join(text for name, text in events if name == "stderr")

    @property
    def value(self):
        """The main result's text/plain, or None."""
        return self.main[0]["data"]["text/plain"] if self.main else None

    def kinds(self):
        """The event sequence in short form: stdout, stderr, result, main, error, done."""
        out = []
        for name, item in self.events:
            if name != "control":
                kind = name
            elif item.get("t") == "result":
                kind = "main" if item.get("main") else "result"
            else:
                kind = item.get("t")
            if not out or out[-1] != kind or kind not in ("stdout", "stderr"):
                out.append(kind)
        return out
