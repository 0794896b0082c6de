"""The `browser` toolset: a real Chromium inside the prompt's sandbox, driven by agent-browser.

agent-browser (npm, Apache-2.0, the reference's local driver) ships one static binary per
platform. `python -m hermes_batch.tools.browser prepare` fetches the pinned release from the npm
registry once, checks it against the pinned hash and keeps the binary in the user's cache; each
backend that can bind a host directory read-only shows it to the sandbox at `DRIVER_MOUNT`
(local, docker, singularity). Every tool call is one driver command run in the sandbox, as the
prompt's user: its first starts a small daemon there, which starts the sandbox's Chromium; both
are the prompt's processes, ended before a check runs and with the sandbox. The runner touches
no page itself and reads only the driver's JSON answer.

Every sandbox has a network of its own: the browser reaches what the prompt serves on the
sandbox's own loopback (and `file:` pages in its work directory), its DevTools port is on that
loopback (no other prompt's), and with --network everything else goes through the sandbox's one
way out, the runner's network guard (public addresses only).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import io
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from ...flags import flag
from ..base import Tool, ToolContext, ToolError, ToolResult, confine
from ..media import MAX_IMAGE_BYTES, as_image
from ..toolset import Opening, Toolset
from ..vision import looked_at

DRIVER_VERSION = "0.41.2"
DRIVER_TARBALL = f"https://registry.npmjs.org/agent-browser/-/agent-browser-{DRIVER_VERSION}.tgz"
# the registry's own integrity field for that tarball (sha512, base64)
DRIVER_INTEGRITY = "/agCKB5rw1EEK8SKWo4zid7a5kOwlclqALC0P3c69buJvKdhrl/dJkKdfLqGGaiNIbWzRdqqT0PxZVkwVEf2fg=="

DRIVER_NAME = "agent-browser"
SNAPSHOT_CHARS = 15_000  # of a snapshot in a reply; the whole one is saved where read_file reads it
SNAPSHOT_DIR = ".browser"  # in the work directory
START_TIMEOUT = 60.0  # seconds for the first command (the daemon and Chromium start)
COMMAND_TIMEOUT = 30.0  # seconds for any later one
LOAD_WAIT = 5.0  # seconds a snapshot, a click or a key waits at most for the page to load; then it reads what is there
SCROLL_PIXELS = 500
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
# Chromium's own sandbox needs namespaces the jail and containers do not give; /dev/shm is small there
CHROMIUM_ARGS = "--no-sandbox,--disable-dev-shm-usage,--disable-gpu,--no-first-run,--no-default-browser-check"


def _chromium_args(proxy: str | None) -> str:
    """With --network, every request through the sandbox's way out (the network guard), and no UDP
    of WebRTC's or QUIC's around it. Chromium by itself sends loopback and link-local addresses (the
    metadata address) past a proxy: `<-loopback>` ends that; the sandbox's own loopback (its own
    network's, not this machine's) is then named to go direct."""
    if proxy is None:
        return CHROMIUM_ARGS
    direct = "<-loopback>;localhost;127.0.0.1/8;[::1]"
    return ",".join([CHROMIUM_ARGS, f"--proxy-server={proxy}", f"--proxy-bypass-list={direct}", "--disable-quic",
                     "--force-webrtc-ip-handling-policy=disable_non_proxied_udp"])


def _binary_name() -> str:
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    if arch is None or not sys.platform.startswith("linux"):
        raise ToolError(f"the browser driver has no build for {sys.platform}/{platform.machine()}")
    return f"agent-browser-linux-musl-{arch}"  # static: runs in any Linux image


def driver_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hermes-batch" / f"agent-browser-{DRIVER_VERSION}"


def driver_ready() -> bool:
    return (driver_dir() / DRIVER_NAME).is_file()


def prepare(progress: bool = True) -> Path:
    """Fetch, check and keep the pinned driver (once; later calls return at once)."""
    target = driver_dir()
    if (target / DRIVER_NAME).is_file():
        return target
    member = f"package/bin/{_binary_name()}"
    if progress:
        print(f"fetching agent-browser {DRIVER_VERSION} from the npm registry", file=sys.stderr)
    with urllib.request.urlopen(DRIVER_TARBALL, timeout=300) as resp:  # a fixed URL, never a prompt's
        blob = resp.read()
    digest = base64.b64encode(hashlib.sha512(blob).digest()).decode()
    if digest != DRIVER_INTEGRITY:
        raise RuntimeError(f"{DRIVER_TARBALL} has sha512 {digest}, not the pinned {DRIVER_INTEGRITY}")
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        found = tar.extractfile(member)
        if found is None:
            raise RuntimeError(f"{DRIVER_TARBALL} has no {member}")
        data = found.read()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".agent-browser-", dir=target.parent))
    (staging / DRIVER_NAME).write_bytes(data)
    (staging / DRIVER_NAME).chmod(0o755)
    staging.chmod(0o755)
    try:
        staging.rename(target)  # whole or not at all, also against a second `prepare` beside this one
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / DRIVER_NAME).is_file():
            raise
    return target


def chromium_on_host() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


@functools.cache
def chromium_version() -> str:
    """This machine's Chromium, as it names itself ("Chromium 156.0.8078.114 built on Debian ...")."""
    path = chromium_on_host()
    if path is None:
        return "none"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return " ".join(out.split()[:2]) or "unknown"


# --- one driver command in the sandbox ---------------------------------------------------------
# Finds Chromium on the sandbox's PATH, then runs the driver: with the arguments as argv ("$@"), or batched.
_RUN = r'''b={bin}; [ -x "$b" ] || {{ echo "no browser driver in this sandbox" >&2; exit 96; }}
for c in {names}; do p=$(command -v "$c" 2>/dev/null) && break; done
[ -n "$p" ] || {{ echo "no Chromium in this sandbox's image (looked for {names})" >&2; exit 97; }}
mkdir -p "$AGENT_BROWSER_SOCKET_DIR" && chmod 700 "$AGENT_BROWSER_SOCKET_DIR"
export AGENT_BROWSER_EXECUTABLE_PATH=$p
'''
# The driver reads a flag anywhere in its argv; its batch mode takes each command as a JSON array of
# words, never the driver's flags: how text the model wrote (browser_type's) reaches it. A one-line
# JSON (ASCII, newlines escaped) cannot end the quoted here-document early.
_ARGV = 'exec "$b" --json "$@"\n'
_BATCH = "exec \"$b\" --json batch --omit-command <<'HB_BROWSER_COMMANDS'\n{commands}\nHB_BROWSER_COMMANDS\n"

# A click or a key sends the page elsewhere in the page's next task (a form's submission), after the
# driver has answered; once that navigation has started, Chromium holds the driver's next commands
# until the new document commits. So after one the page is let run its next tasks, then waited for
# until it has loaded (LOAD_WAIT at most): what is read next is the page the action led to, whole.
_LOADED = ("wait", "--load", "load", "--timeout", str(int(LOAD_WAIT * 1000)))
_SETTLED = (("eval", "new Promise(done => setTimeout(done, 50))"), _LOADED)


async def _drive(ctx: ToolContext, *args: str, literal: bool = False, before: tuple[tuple[str, ...], ...] = (),
                 after: tuple[tuple[str, ...], ...] = ()) -> dict[str, Any]:
    """One agent-browser command; its `data` on success, a ToolError with its message otherwise.
    `literal`: every word is data (none read as a flag), for a command that takes none. `before`,
    `after`: commands run with it, whose own failure (a wait that timed out) is not its."""
    sandbox = await ctx.get_sandbox()
    where = getattr(sandbox, "driver_dir", None)
    if not where:
        raise ToolError("this sandbox has no browser: the browser toolset runs on the local, docker and "
                        "singularity backends")
    state = ctx.state.setdefault("browser", {"started": False, "snapshots": 0})
    if not state["started"]:
        await ctx.hold(ctx.toolsets.get("browser"))  # a place among the browsers open at once, until the prompt ends
    scratch = getattr(sandbox, "scratch", "/tmp")
    # the arguments as quoted words: the shell takes them literally, none is evaluated
    script = _RUN.format(bin=shlex.quote(f"{where}/{DRIVER_NAME}"), names=" ".join(CHROMIUM_NAMES))
    commands = [*before, args, *after]
    if literal or len(commands) > 1:
        script += _BATCH.format(commands=json.dumps(commands))
    else:
        script = f"set -- {' '.join(shlex.quote(a) for a in args)}\n" + script + _ARGV
    env = {
        "HOME": f"{scratch}/browser", "AGENT_BROWSER_SOCKET_DIR": f"{scratch}/browser/run",
        # with --network, the sandbox's way out (the proxy its commands are pointed at)
        "AGENT_BROWSER_SESSION": "prompt",
        "AGENT_BROWSER_ARGS": _chromium_args(getattr(sandbox, "network_env", {}).get("http_proxy")),
        "AGENT_BROWSER_NO_VERSION_CHECK": "1", "AGENT_BROWSER_NO_WEBMCP": "1",
        "AGENT_BROWSER_DEFAULT_TIMEOUT": str(int(COMMAND_TIMEOUT * 1000 * 0.8)),
        "AGENT_BROWSER_SCREENSHOT_DIR": f"{scratch}/browser/shots",
    }
    timeout = COMMAND_TIMEOUT if state["started"] else START_TIMEOUT
    res = await sandbox.exec(script, language="shell", timeout=timeout, env=env)
    if res.exit_code in (96, 97):
        raise ToolError(res.stderr.strip())
    if res.timed_out:
        raise ToolError(f"the browser did not answer within {timeout:g} s")
    state["started"] = True
    try:
        answer = json.loads(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else None
    except (json.JSONDecodeError, IndexError):
        answer = None
    if isinstance(answer, list) and len(answer) == len(commands) and isinstance(answer[len(before)], dict):
        mine = answer[len(before)]
        answer = {**mine, "data": mine.get("result")}  # its answer in the batch's, as argv mode writes it
    if not isinstance(answer, dict):
        raise ToolError(f"the browser failed: {(res.stderr or res.stdout).strip()[-500:] or 'no answer'}")
    if not answer.get("success"):
        raise ToolError(str(answer.get("error") or "the browser refused the command"))
    data = answer.get("data")
    return data if isinstance(data, dict) else {"result": data}


def _ok(**payload: Any) -> ToolResult:
    return ToolResult(True, json.dumps({"success": True, **payload}, ensure_ascii=False), structured=True)


def _ref(ref: str) -> str:
    ref = ref.strip()
    if not ref.lstrip("@").isalnum():
        raise ToolError(f"{ref!r} is not an element ref from the snapshot (like @e5)")
    return "@" + ref.lstrip("@")


async def _snapshot(ctx: ToolContext, full: bool = False) -> dict[str, Any]:
    """The page as an accessibility tree with refs; a long one is cut at a line, saved whole."""
    # a page still loading (back's, one slower than an action's wait) is waited for first
    data = await _drive(ctx, "snapshot", *([] if full else ["-c"]), before=(_LOADED,))
    text = str(data.get("snapshot", ""))
    out: dict[str, Any] = {"url": data.get("origin"), "snapshot": text}
    if len(text) > SNAPSHOT_CHARS:
        state = ctx.state["browser"]
        state["snapshots"] += 1
        name = f"{SNAPSHOT_DIR}/snapshot-{state['snapshots']}.txt"
        sandbox = await ctx.get_sandbox()
        await sandbox.write_file(f"{sandbox.workdir}/{name}", text.encode())
        cut = text.rfind("\n", 0, SNAPSHOT_CHARS)
        out["snapshot"] = text[: cut if cut > 0 else SNAPSHOT_CHARS]
        out["truncated"] = True
        out["full_snapshot_file"] = name
        out["note"] = (f"the snapshot has {len(text)} characters; the first {len(out['snapshot'])} are shown, "
                       f"all of them are in {name} (read_file pages through it)")
    return out


class NavigateArgs(BaseModel):
    url: str = Field(description="The address to open (http://, https:// or file://).")


class BrowserNavigateTool:
    name = "browser_navigate"
    toolset = "browser"
    description = ("Open a web page in the browser and get its snapshot: the page as an accessibility tree "
                   "whose interactive elements carry refs (like @e5) for the other browser tools.")
    Args = NavigateArgs

    async def run(self, args: NavigateArgs, ctx: ToolContext) -> ToolResult:
        if not args.url.strip() or args.url.strip().startswith("-"):  # never read as one of the driver's flags
            raise ToolError(f"{args.url!r} is not an address")
        opened = await _drive(ctx, "open", args.url.strip())
        return _ok(title=opened.get("title"), **await _snapshot(ctx))


class SnapshotArgs(BaseModel):
    full: bool = Field(False, description="The whole tree, not only its compact form.")


class BrowserSnapshotTool:
    name = "browser_snapshot"
    toolset = "browser"
    description = "The current page as an accessibility tree with element refs (like @e5)."
    Args = SnapshotArgs

    async def run(self, args: SnapshotArgs, ctx: ToolContext) -> ToolResult:
        return _ok(**await _snapshot(ctx, args.full))


class RefArgs(BaseModel):
    ref: str = Field(description="The element's ref from the latest snapshot, like @e5.")


class BrowserClickTool:
    name = "browser_click"
    toolset = "browser"
    description = "Click an element of the page by its ref from the snapshot."
    Args = RefArgs

    async def run(self, args: RefArgs, ctx: ToolContext) -> ToolResult:
        await _drive(ctx, "click", _ref(args.ref), after=_SETTLED)
        return _ok(clicked=_ref(args.ref))


class TypeArgs(BaseModel):
    ref: str = Field(description="The input's ref from the latest snapshot, like @e3.")
    text: str = Field(description="What to type; the field is cleared first.")


class BrowserTypeTool:
    name = "browser_type"
    toolset = "browser"
    description = "Type text into an input of the page, found by its ref (the field is cleared first)."
    Args = TypeArgs

    async def run(self, args: TypeArgs, ctx: ToolContext) -> ToolResult:
        await _drive(ctx, "fill", _ref(args.ref), args.text, literal=True)  # text that looks like a flag is text
        return _ok(typed=args.text, ref=_ref(args.ref))


class ScrollArgs(BaseModel):
    direction: Literal["up", "down"] = Field(description="Which way to scroll the page.")


class BrowserScrollTool:
    name = "browser_scroll"
    toolset = "browser"
    description = f"Scroll the page up or down by {SCROLL_PIXELS} pixels."
    Args = ScrollArgs

    async def run(self, args: ScrollArgs, ctx: ToolContext) -> ToolResult:
        await _drive(ctx, "scroll", args.direction, str(SCROLL_PIXELS))
        return _ok(scrolled=args.direction)


class NoArgs(BaseModel):
    pass


class BrowserBackTool:
    name = "browser_back"
    toolset = "browser"
    description = "Go back to the previous page in the browser's history."
    Args = NoArgs

    async def run(self, args: NoArgs, ctx: ToolContext) -> ToolResult:
        await _drive(ctx, "back")
        return _ok(**await _snapshot(ctx))


class PressArgs(BaseModel):
    key: str = Field(description="A key or combination, like Enter, Tab, Escape, ArrowDown or Control+a.")


class BrowserPressTool:
    name = "browser_press"
    toolset = "browser"
    description = "Press a key in the page (on the element that has the focus)."
    Args = PressArgs

    async def run(self, args: PressArgs, ctx: ToolContext) -> ToolResult:
        if not args.key.strip() or args.key.strip().startswith("-"):  # never read as one of the driver's flags
            raise ToolError(f"{args.key!r} is not a key")
        await _drive(ctx, "press", args.key.strip(), after=_SETTLED)
        return _ok(pressed=args.key.strip())


_IMAGES_JS = ("JSON.stringify(Array.from(document.images).map(i => ({src: i.currentSrc || i.src, alt: i.alt, "
              "width: i.naturalWidth || i.width, height: i.naturalHeight || i.height})))")


class BrowserGetImagesTool:
    name = "browser_get_images"
    toolset = "browser"
    description = "List the page's images: their address, alt text, width and height."
    Args = NoArgs

    async def run(self, args: NoArgs, ctx: ToolContext) -> ToolResult:
        data = await _drive(ctx, "eval", _IMAGES_JS)
        try:
            images = json.loads(data.get("result") or "[]")
        except (TypeError, json.JSONDecodeError):
            images = []
        return _ok(images=images, count=len(images))


class ConsoleArgs(BaseModel):
    clear: bool = Field(False, description="Clear the messages after reading them.")
    expression: str | None = Field(None, description="A JavaScript expression to evaluate in the page instead; "
                                                     "its value is returned.")


class BrowserConsoleTool:
    name = "browser_console"
    toolset = "browser"
    description = ("Read the page's console messages and uncaught errors, or evaluate a JavaScript expression "
                   "in the page.")
    Args = ConsoleArgs

    async def run(self, args: ConsoleArgs, ctx: ToolContext) -> ToolResult:
        if args.expression is not None:
            code = base64.b64encode(args.expression.encode()).decode()
            data = await _drive(ctx, "eval", "-b", code)
            return _ok(result=data.get("result"))
        clear = ["--clear"] if args.clear else []
        console = await _drive(ctx, "console", *clear)
        errors = await _drive(ctx, "errors", *clear)
        return _ok(messages=console.get("messages", []), errors=errors.get("errors", []))


class VisionArgs(BaseModel):
    question: str = Field(min_length=1, description="What to find out from how the page looks.")
    annotate: bool = Field(False, description="Number the interactive elements on the picture ([N] is ref @eN).")


class BrowserVisionTool:
    name = "browser_vision"
    toolset = "browser"
    needs = "vision"  # offered only when the run has a vision model
    description = ("Take a screenshot of the current page and have it looked at: answers a question about what the "
                   "page shows (layout, pictures, text drawn in images). The screenshot is saved in your work "
                   "directory.")
    Args = VisionArgs

    async def run(self, args: VisionArgs, ctx: ToolContext) -> ToolResult:
        if ctx.toolsets.get("vision") is None:
            raise ToolError("browser_vision is unavailable: no vision model is configured for this run")
        state = ctx.state.setdefault("browser", {"started": False, "snapshots": 0})
        state["screenshots"] = state.get("screenshots", 0) + 1
        name = f"{SNAPSHOT_DIR}/screenshot-{state['screenshots']}.png"
        sandbox = await ctx.get_sandbox()
        path = f"{sandbox.workdir}/{name}"  # the runner's own path: the driver writes it as the prompt's user
        await sandbox.write_file(path, b"")  # makes its directory, as the sandbox makes files
        shot = await _drive(ctx, "screenshot", path, *(["--annotate"] if args.annotate else []))
        # read as any file the model names is: the agent may have put a link where the picture was
        _, real = await confine(ctx, name)
        image = await asyncio.to_thread(as_image, await sandbox.read_file(real, MAX_IMAGE_BYTES + 1), "the screenshot")
        extra: dict[str, Any] = {"screenshot_path": name}
        if args.annotate and isinstance(shot.get("annotations"), list):
            extra["annotations"] = shot["annotations"]
        return await looked_at(image, args.question, ctx, **extra)


BROWSER_TOOLS: list[Tool] = [BrowserNavigateTool(), BrowserSnapshotTool(), BrowserClickTool(), BrowserTypeTool(),
                 BrowserScrollTool(), BrowserBackTool(), BrowserPressTool(), BrowserGetImagesTool(),
                 BrowserConsoleTool(), BrowserVisionTool()]


BROWSER_BACKENDS = ("local", "docker", "singularity")  # those that bind the driver into a sandbox
BROWSER_MEMORY = 512 * 1024 * 1024  # a browser's allowance when --max_browsers is not given (Chromium: 150-300 MB a page)


class BrowserSettings(BaseModel):
    max_browsers: int | None = flag(None, "browsers open at once across all workers (default: one per 512 MB of "
                                          "this machine's memory; at least one per worker)", ge=1)


class Browser(Toolset):
    name = "browser"
    tools = tuple(BROWSER_TOOLS)
    Settings = BrowserSettings

    def why_not(self, config: Any) -> str | None:
        if config.backend not in BROWSER_BACKENDS:
            return f"the browser runs in local, docker and singularity sandboxes, not {config.backend}'s"
        if config.backend == "local" and getattr(config.sandbox, "local_isolation", "bwrap") == "none":
            return ("the browser needs the local jail (--local_isolation=bwrap): unisolated, it would reach this "
                    "machine's network")
        if not driver_ready():
            return (f"its driver (agent-browser {DRIVER_VERSION}) is not installed: python -m hermes_batch.tools.browser "
                    "prepare (18 MB from the npm registry, once)")
        if config.backend == "local" and not chromium_on_host():
            return "no Chromium on this machine for the local sandboxes (apt-get install chromium)"
        return None

    def fingerprint(self, config: Any, use: str) -> dict[str, Any]:
        if use != "offered":
            return {}
        out = {"browser_driver": f"agent-browser {DRIVER_VERSION}"}  # who browsed: the driver, and the local Chromium
        if config.backend == "local":  # elsewhere the image says which (and is fingerprinted)
            out["chromium"] = chromium_version()
        return out

    def sandbox_settings(self, config: Any) -> dict[str, Any]:
        return {"driver_dir": str(driver_dir())}  # its sandboxes see the driver, read-only

    async def open(self, opening: Opening) -> Any:
        """The worker's share of --max_browsers: a prompt holds a place from its first browser call."""
        config = opening.config
        total = config.max_browsers or max(1, _memory_bytes() // BROWSER_MEMORY)
        share = max(1, min(opening.sandboxes, total * opening.sandboxes // (config.max_sandboxes or config.concurrency)))
        return asyncio.Semaphore(share)


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 4 * 1024**3


def _main(argv: list[str]) -> None:
    if argv != ["prepare"]:
        raise SystemExit("usage: python -m hermes_batch.tools.browser prepare")
    try:
        print(prepare())
    except (OSError, RuntimeError, ToolError) as exc:
        raise SystemExit(f"error: the browser driver could not be had: {exc}") from None

