"""A real `runner mcp` process over stdio, driven through the MCP SDK's client: what an agent's MCP host does.
Import it after `pytest.importorskip("mcp")`."""
from __future__ import annotations

import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

REPO = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def mcp_session(state: Path, *flags: str, cwd: Path = REPO, env: dict | None = None):
    """An initialised client session of `runner mcp FLAGS` run from `cwd`, its state dir `state` (the CLI's too,
    when they share it); its stderr goes to server-stderr.log beside the state dir."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "runner", "mcp", *flags], cwd=str(cwd),
                                   env={"RUNNER_STATE_DIR": str(state), "PYTHONPATH": str(REPO),
                                        "PATH": os.environ["PATH"], **(env or {})})
    with open(state.parent / "server-stderr.log", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as client:
                await client.initialize()
                yield client
