"""Every sandbox has a network of its own, with or without --network, on every backend that runs
here: no prompt reaches another prompt's loopback servers or abstract unix sockets, nor a service of
this machine; with --network its one way out is the runner's network guard on its own loopback,
which reaches public addresses only (a host of the test's own at one) and nothing internal.

A review found, with --network on the local backend, one prompt driving another prompt's browser
through its DevTools port on a shared loopback (and so forging its verdict), and reaching the
guard, the embedded model servers of other runs and the scripted model: each probe is here."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from tests.backend_harness import each_backend, run_episodes
from tests.conftest import tool_results_in, write_jsonl
from tests.scripted_model import script

SECRET = "secret-of-B"
ABSTRACT = "hb-secret-of-b"
PORT = 8123

# prompt B: a server on its loopback and on an abstract unix socket, up for a while
SERVE = f"""import socket, sys, threading, time
def serve(s):
    while True:
        c, _ = s.accept(); c.sendall(b"{SECRET}"); c.close()
tcp = socket.create_server(("127.0.0.1", {PORT}))
ab = socket.socket(socket.AF_UNIX); ab.bind("\\0{ABSTRACT}"); ab.listen()
for s in (tcp, ab):
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print(time.time(), flush=True)
time.sleep(float(sys.argv[1]))
"""

# prompt A: what its network shows and reaches, as JSON
PROBE = f"""import json, os, socket, sys, time, urllib.error, urllib.request
host_port, network = int(sys.argv[1]), sys.argv[2] == "1"
out = {{"start": time.time()}}
def listening():
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            for line in open(name).read().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A":
                    ports.add(int(f[1].rsplit(":", 1)[1], 16))
        except OSError:
            pass
    return sorted(ports)
def abstract():
    try:
        return sorted({{l.split()[-1] for l in open("/proc/net/unix").read().splitlines()[1:] if l.split()[-1].startswith("@")}})
    except OSError as e:
        return [f"unreadable: {{e}}"]
def reach(address, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(address)
        return "reached: " + s.recv(100).decode(errors="replace")
    except OSError as e:
        return f"refused: {{e}}"
    finally:
        s.close()
out["listening"], out["abstract"] = listening(), abstract()
out["b_tcp"] = reach(("127.0.0.1", {PORT}))
out["b_abstract"] = reach("\\0{ABSTRACT}", socket.AF_UNIX)
out["host_service"] = reach(("127.0.0.1", host_port))
out["direct_public"] = reach(("9.9.9.9", 8080))  # the public host, around the guard
if network:
    proxy = os.environ.get("http_proxy", "")
    out["proxy"] = proxy
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({{"http": proxy}}))
    os.environ["no_proxy"] = os.environ["NO_PROXY"] = ""  # this machine's loopback asked of the guard too
    for name, url in (("public", "http://9.9.9.9:8080/"), ("host_via_guard", f"http://127.0.0.1:{{host_port}}/"),
                      ("metadata", "http://169.254.169.254/latest/meta-data/"), ("private", "http://10.0.0.1/")):
        try:
            out[name] = opener.open(url, timeout=15).read().decode(errors="replace")[:300]
        except urllib.error.HTTPError as e:
            out[name] = f"HTTP {{e.code}}: {{e.read().decode(errors='replace')[:300]}}"
        except OSError as e:
            out[name] = f"error: {{e}}"
out["end"] = time.time()
print(json.dumps(out))
"""

backend_under_test = each_backend(["local", "docker", "docker-gvisor", "singularity"])


def _tool_outputs(settled) -> list[str]:
    record = json.loads(settled.outcome.line)
    return [t["content"] for t in tool_results_in(record)]


def _result(text: str) -> dict:
    """A tool result's output (the terminal tool answers JSON, or the text itself)."""
    with contextlib.suppress(ValueError, TypeError):
        text = json.loads(text).get("output", text)
    return json.loads(text.strip().splitlines()[-1])


@pytest.mark.parametrize("network", [False, True], ids=["no-network", "network"])
def test_no_prompt_reaches_another_prompt_or_this_machine(backend_under_test, network, model, tmp_path):
    but = backend_under_test
    if network and but.settings.runtime:
        pytest.skip("gVisor refuses --network here (test_gvisor_refuses_network_saying_why)")
    from tests.public_host import PUBLIC_TEXT, public_host, why_not

    host_port = int(model.base_url.rsplit(":", 1)[1].split("/")[0])  # the scripted model: a service of this machine
    rows = [
        {"prompt": script({"calls": [["terminal", {"command": "nohup python3 serve.py 12 > up 2>&1 & sleep 9; cat up"}]]},
                          {"answer": "done"}, text="B"), "files": {"serve.py": SERVE}},
        {"prompt": script({"calls": [["terminal", {"command": f"sleep 4; python3 probe.py {host_port} {int(network)}"}]]},
                          {"answer": "done"}, text="A"), "files": {"probe.py": PROBE}},
    ]
    public = public_host() if network and not why_not() else contextlib.nullcontext()
    with public:
        settled = run_episodes(but, model.base_url, write_jsonl(tmp_path / "d.jsonl", rows), network=network)
    assert [s.outcome.kind for s in settled] == ["done", "done"], [s.outcome.error for s in settled]
    b_up = float(json.loads(_tool_outputs(settled[0])[0]).get("output", "0").split()[0])
    seen = _result(_tool_outputs(settled[1])[0])
    assert 0 < b_up < seen["start"] and seen["end"] < b_up + 8, (b_up, seen)  # B's servers were up while A looked
    assert seen["listening"] == ([3128] if network else []), seen  # nothing of B's, the host's or the guard's
    assert f"@{ABSTRACT}" not in seen["abstract"], seen
    for name in ("b_tcp", "b_abstract", "host_service", "direct_public"):
        assert seen[name].startswith("refused"), (name, seen)
    if network:
        assert seen["proxy"] == "http://127.0.0.1:3128", seen
        for name in ("host_via_guard", "metadata", "private"):
            assert seen[name].startswith("HTTP 403") and "internal address" in seen[name], (name, seen)
        if not why_not():
            assert PUBLIC_TEXT in seen["public"], seen  # the one way out reaches the public address


def test_gvisor_refuses_network_saying_why(tmp_path):
    from tests.backend_harness import make_backend_under_test

    but = make_backend_under_test("docker-gvisor", tmp_path, {"network": True})

    async def main():
        from hermes_batch.tools.guard_proxy import GuardProxy

        backend = but.make()
        backend.egress = GuardProxy()
        try:
            await backend.setup()
        finally:
            await backend.shutdown()

    from hermes_batch.backends import SandboxError

    with pytest.raises(SandboxError, match="--network cannot be given here: .*gVisor"):
        asyncio.run(main())
