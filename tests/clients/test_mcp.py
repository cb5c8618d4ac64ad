"""The official OpenSandbox MCP server (PyPI opensandbox-mcp) pointed at pvisor.

An MCP client (PyPI `mcp`) starts it over stdio, the way an agent host does, configured by the
environment variables its users set (OPEN_SANDBOX_DOMAIN, OPEN_SANDBOX_API_KEY): it lists the
tools, creates a sandbox, runs a command, writes and reads a file, sees pvisor's errors, and
kills the sandbox, each through a tool call.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from conftest import BUSYBOX

TOOLS = {"sandbox_create", "sandbox_kill", "sandbox_get_info", "command_run", "file_read", "file_write"}


def server_params(server) -> StdioServerParameters:
    exe = Path(sys.executable).with_name("opensandbox-mcp")
    if not exe.is_file():
        pytest.fail(f"{exe} is missing: the clients venv lacks opensandbox-mcp", pytrace=False)
    return StdioServerParameters(
        command=str(exe),
        args=["--transport", "stdio", "--request-timeout-seconds", "60"],
        env={"OPEN_SANDBOX_DOMAIN": server.addr, "OPEN_SANDBOX_API_KEY": server.api_key,
             "HOME": os.environ.get("HOME", "/root"), "PATH": os.environ.get("PATH", ""),
             "COLUMNS": "500"},  # its log (rich) wraps at the terminal width
    )


def payload(result) -> dict:
    """A tool's structured result (or its JSON text content)."""
    assert not result.is_error, result.content
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


# A bound on one whole MCP conversation, so a wedged server fails the test instead of hanging it.
CONVERSATION_LIMIT_S = 120


async def session_run(server, body, errlog):
    with anyio.fail_after(CONVERSATION_LIMIT_S):
        return await _session(server, body, errlog)


async def _session(server, body, errlog):
    async with stdio_client(server_params(server), errlog=errlog) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await body(session)


@pytest.fixture
def errlog(tmp_path):
    """The MCP server's stderr (its log), as a file the test reads afterwards."""
    with open(tmp_path / "mcp-server.log", "w+") as f:
        yield f


def logged(errlog) -> str:
    errlog.flush()
    errlog.seek(0)
    return errlog.read()


def test_mcp_tools_drive_a_sandbox(server, api, errlog):
    async def body(session: ClientSession):
        tools = {t.name for t in (await session.list_tools()).tools}
        assert TOOLS <= tools, tools
        created = payload(await session.call_tool("sandbox_create", {
            "image": BUSYBOX, "resource": {"cpu": "1", "memory": "256Mi"}, "timeout_seconds": 300,
            "ready_timeout_seconds": 60, "metadata": {"via": "mcp"},
        }))
        sid = created["sandbox_id"]
        try:
            assert api.get(f"/v1/sandboxes/{sid}").json()["metadata"] == {"via": "mcp"}
            ran = payload(await session.call_tool("command_run", {
                "sandbox_id": sid, "command": "echo mcp-out; echo mcp-err >&2; echo hi > /tmp/from-cmd"}))
            text = json.dumps(ran)
            assert "mcp-out" in text and "mcp-err" in text, ran
            read = payload(await session.call_tool("file_read", {"sandbox_id": sid, "path": "/tmp/from-cmd"}))
            assert read["content"] == "hi\n", read
            payload(await session.call_tool("file_write", {
                "sandbox_id": sid, "path": "/tmp/from-mcp.txt", "content": "written by mcp", "mode": 644}))
            back = payload(await session.call_tool("file_read", {"sandbox_id": sid, "path": "/tmp/from-mcp.txt"}))
            assert back["content"] == "written by mcp"
            # The MCP server masks a failed tool's exception toward the client ("Error executing
            # tool ..."); the SDK error it logs carries pvisor's code.
            missing = await session.call_tool("file_read", {"sandbox_id": sid, "path": "/tmp/no-such-file"})
            assert missing.is_error, missing
            assert "file_read" in missing.content[0].text, missing.content
            assert "[FILE_NOT_FOUND]" in logged(errlog)
        finally:
            killed = payload(await session.call_tool("sandbox_kill", {"sandbox_id": sid}))
        assert killed["status"] == "killed"
        assert api.get(f"/v1/sandboxes/{sid}").status_code == 404

    anyio.run(session_run, server, body, errlog)


# How long the bad-image call may go unanswered before the test says so (see below).
UNANSWERED_S = 30


def test_mcp_bad_image_is_a_tool_error_with_pvisor_code(server, api, errlog):
    before = api.get("/v1/sandboxes").json()["pagination"]["totalItems"]

    async def body(session: ClientSession):
        with anyio.move_on_after(UNANSWERED_S) as scope:
            r = await session.call_tool("sandbox_create", {"image": "no-such-image/mcp:missing"})
        # pvisor's refusal reached the MCP server either way (its log quotes the body).
        assert '"code":"IMAGE_NOT_FOUND"' in logged(errlog)
        if scope.cancelled_caught:
            return False
        assert r.is_error, r
        return True

    answered = anyio.run(session_run, server, body, errlog)
    assert api.get("/v1/sandboxes").json()["pagination"]["totalItems"] == before, "a failed create left a sandbox"
    if not answered:
        # Seen with opensandbox-mcp 1.1.1 + mcp 2.3.0: a tool whose SDK call raised
        # SandboxApiException (sandbox_create, sandbox_get_info) never answers the client,
        # after logging the error; file_read's does. The client side of the error path is
        # then untestable here.
        pytest.skip(f"opensandbox-mcp never answered the refused sandbox_create within {UNANSWERED_S} s "
                    f"(it logged pvisor's 404 IMAGE_NOT_FOUND): an MCP server bug, not pvisor's")
