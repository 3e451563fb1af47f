"""An example MCP server for aptix-worker's server tools, written with the official Python SDK
(`pip install mcp==2.3.0`). The tools file beside it (tools.json) has each worker start it over
stdio. Its two tools show how annotations decide what a worker may repeat after a crash:
`forecast` says it is read-only (repeated freely), `log_request` says nothing (MCP's defaults:
"may destroy, not idempotent"), so a call of it whose outcome a crash left unknown is never made
again — the model is told instead. Every call carries `_meta.idempotencyKey`, which a server
that changes things can use to recognise a call it already ran.
"""

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("weather")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def forecast(city: str) -> str:
    """Tomorrow's weather in a city."""
    return f"{city}: 21 °C and sunny tomorrow."


@server.tool()
def log_request(city: str, note: str) -> str:
    """Records that someone asked about a city (a side effect)."""
    return f"recorded a request for {city}"


if __name__ == "__main__":
    server.run("stdio")
