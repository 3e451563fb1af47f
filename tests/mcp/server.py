"""An MCP server for the tests, written with the official Python SDK (PyPI `mcp`, 2.x).

Run as `server.py http PORT STATE_DIR` (Streamable HTTP at http://127.0.0.1:PORT/mcp) or
`server.py stdio STATE_DIR`. Every call is appended to STATE_DIR/calls.jsonl (tool, arguments, the request's
`_meta.idempotencyKey` and `_meta.traceparent`, the HTTP request's `traceparent` header, the server's pid), so a test sees from outside what ran and how often. A
call with `delay_ms` first writes STATE_DIR/started-<tool> and then waits: a test kills the
worker while the call is in flight.

Tools: `lookup` (read-only, structured output), `mark` (idempotent), `add` (a side-effecting
counter: no annotations, so MCP's defaults say "may destroy, not idempotent"), `fail` (answers
with isError), `nap` (read-only; sleeps, for timeouts), `grow` (adds the tool `extra` and tells
connected clients the list changed).
"""

import asyncio
import json
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

STATE = Path(sys.argv[3] if sys.argv[1:2] == ["http"] else sys.argv[2])
server = MCPServer("aptix-test-tools")


def meta_value(ctx: Context, key: str) -> str | None:
    rc = ctx.request_context
    for meta in (rc.meta, (rc.params or {}).get("_meta")):
        if meta is None:
            continue
        if isinstance(meta, dict):
            found = meta.get(key)
        else:
            found = getattr(meta, key, None) or (getattr(meta, "model_extra", None) or {}).get(key)
        if found:
            return found
    return None


def header(ctx: Context, name: str) -> str | None:
    """A header of the HTTP request that carried the call (None over stdio)."""
    headers = getattr(getattr(ctx.request_context, "request", None), "headers", None)
    return headers.get(name) if headers is not None else None


async def record(ctx: Context, tool: str, args: dict, delay_ms: int = 0) -> None:
    line = {
        "tool": tool,
        "args": args,
        "key": meta_value(ctx, "idempotencyKey"),
        "metaTraceparent": meta_value(ctx, "traceparent"),
        "traceparent": header(ctx, "traceparent"),
        "pid": os.getpid(),
    }
    with open(STATE / "calls.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")
    if delay_ms:
        (STATE / f"started-{tool}").write_text(str(os.getpid()))
        await asyncio.sleep(delay_ms / 1000)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def lookup(city: str, ctx: Context) -> dict:
    """The weather in a city."""
    await record(ctx, "lookup", {"city": city})
    return {"city": city, "temperatureC": 21}


@server.tool(annotations=ToolAnnotations(idempotentHint=True, destructiveHint=False))
async def mark(key: str, ctx: Context, delay_ms: int = 0) -> str:
    """Marks a key as seen (doing it twice changes nothing more)."""
    await record(ctx, "mark", {"key": key}, delay_ms)
    return f"marked {key}"


@server.tool()
async def add(amount: int, ctx: Context, delay_ms: int = 0) -> str:
    """Adds to a counter (each call adds again)."""
    await record(ctx, "add", {"amount": amount}, delay_ms)
    return f"added {amount}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def fail(reason: str, ctx: Context) -> str:
    """Always answers with an error."""
    await record(ctx, "fail", {"reason": reason})
    raise ToolError(f"cannot do it: {reason}")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def nap(ms: int, ctx: Context) -> str:
    """Sleeps, then answers."""
    await record(ctx, "nap", {"ms": ms})
    await asyncio.sleep(ms / 1000)
    return "rested"


async def extra(ctx: Context) -> str:
    """A tool that appears once `grow` ran."""
    await record(ctx, "extra", {})
    return "extra ran"


@server.tool(annotations=ToolAnnotations(idempotentHint=True, destructiveHint=False))
async def grow(ctx: Context) -> str:
    """Adds the tool `extra` and tells the client its list changed."""
    await record(ctx, "grow", {})
    server.add_tool(extra, annotations=ToolAnnotations(readOnlyHint=True))
    await ctx.session.send_tool_list_changed()
    return "grown"


if __name__ == "__main__":
    STATE.mkdir(parents=True, exist_ok=True)
    if sys.argv[1:2] == ["stdio"]:
        server.run("stdio")
    else:
        import uvicorn

        port = int(sys.argv[2])
        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")
