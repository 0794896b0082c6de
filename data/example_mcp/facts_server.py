"""A small MCP server over stdio, for README's example: Python's standard library only, so that it
runs in any sandbox with a python3 (the `mcp` SDK is the usual way to write one: tests/mcp_fixture.py).
One tool, `lookup`: facts about made-up places, which no model can know without asking."""

import json
import sys

FACTS = {
    "Lyra City": {"population": 48213, "founded": 1871, "river": "Vell"},
    "Port Ambry": {"population": 9120, "founded": 1702, "river": "Oss"},
    "Kessel Ford": {"population": 130554, "founded": 1930, "river": "Dray"},
}
TOOL = {"name": "lookup", "description": "Facts about a town: its population, the year it was founded and its river.",
        "inputSchema": {"type": "object", "properties": {"town": {"type": "string", "description": "The town's name."}},
                        "required": ["town"]}}


def answer(request):
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        return {"protocolVersion": params.get("protocolVersion", "2025-06-18"), "capabilities": {"tools": {}},
                "serverInfo": {"name": "facts", "version": "1.0"}}
    if method == "tools/list":
        return {"tools": [TOOL]}
    if method == "tools/call":
        town = str((params.get("arguments") or {}).get("town", ""))
        found = next((v for k, v in FACTS.items() if k.lower() == town.strip().lower()), None)
        text = json.dumps({"town": town, **found}) if found else f"no town named {town!r}; known: {', '.join(FACTS)}"
        return {"content": [{"type": "text", "text": text}], "isError": found is None}
    if method == "ping":
        return {}
    raise LookupError(method)


for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:  # a notification: nothing to answer
        continue
    try:
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer(message)}
    except LookupError as exc:
        reply = {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": f"no method {exc}"}}
    print(json.dumps(reply), flush=True)
