"""MiniWoB++ tasks as dataset rows, for the browser toolset: `python -m hermes_batch.dataset.miniwob
--output=data/miniwob.jsonl [--tasks=click-button,click-link]` (with `pip install miniwob`).

Each row carries its task page and the scripts and styles the page loads (`files`, under `wob/` in
the work directory; about 260 KB a row) and asks the agent to open it with the browser and do what
the page says. The page starts its episode by itself once loaded (no START cover to click) and gives
the agent an hour instead of ten seconds, since a model thinks slower than a person clicks.

MiniWoB++ scores an episode inside the page, where the agent can script it (`browser_console`
runs JavaScript), so its reward is no verdict: the rows carry no check. Tasks whose pages need
images or other binary files are left out (a row's `files` are text)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

_ASSET = re.compile(r"""(?:src|href)\s*=\s*["']([^"':]+\.(?:js|css))["']""", re.I)
_CORE = re.compile(r"""(<script[^>]*src=["'][^"']*core/core\.js["'][^>]*>\s*</script>)""", re.I)
# after the page's own onload (it shows the START cover), start the episode with an hour to do it
_START = ("<script>core.EPISODE_MAX_TIME = 3600000;"
          "window.addEventListener('load', function () { setTimeout(function () { core.startEpisodeReal(); }, 0); });"
          "</script>")
WHERE = "wob"  # in the work directory


class MiniWoBError(Exception):
    pass


def html_root() -> Path:
    """The installed miniwob package's pages, found without importing it (it pulls in gymnasium)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise MiniWoBError("the miniwob package is not installed: pip install miniwob")
    root = Path(next(iter(spec.submodule_search_locations))) / "html"
    if not (root / "miniwob").is_dir():
        raise MiniWoBError(f"{root} holds no MiniWoB++ pages")
    return root


def task_names(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "miniwob").glob("*.html"))


def task_row(root: Path, name: str) -> dict[str, object]:
    """The row of one task; MiniWoBError when it does not exist or needs a file that is not text."""
    page = root / "miniwob" / f"{name}.html"
    if not page.is_file():
        raise MiniWoBError(f"no MiniWoB++ task named {name!r}")
    html = page.read_text(encoding="utf-8")
    if not _CORE.search(html):
        raise MiniWoBError(f"{name}: the page does not load MiniWoB's core.js")
    if re.search(r"""(?:src|href)\s*=\s*["'][^"':]+\.(?:png|jpe?g|gif|svg|mp3|wav|json)["']""", html, re.I):
        raise MiniWoBError(f"{name}: the page loads images or data files (a row's files are text)")
    files = {f"{WHERE}/miniwob/{name}.html": _CORE.sub(lambda m: m.group(1) + _START, html, count=1)}
    for ref in sorted(set(_ASSET.findall(html))):
        asset = (page.parent / ref).resolve()
        if root.resolve() not in asset.parents or not asset.is_file():
            raise MiniWoBError(f"{name}: {ref} is not among the package's pages")
        files[f"{WHERE}/{asset.relative_to(root.resolve()).as_posix()}"] = asset.read_text(encoding="utf-8")
    url = f"file:///workspace/{WHERE}/miniwob/{name}.html"
    prompt = (f"Open {url} in the browser. At its top the page says what to do: do it in the page. "
              "When you have done it, say what you did.")
    return {"prompt": prompt, "files": files, "source": "miniwob++", "miniwob_task": name}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m hermes_batch.dataset.miniwob",
                                     description="Write MiniWoB++ tasks as a JSONL dataset for the browser toolset.")
    parser.add_argument("--output", required=True, help="the JSONL file to write")
    parser.add_argument("--tasks", help="comma list of task names (default: every task whose files are text)")
    args = parser.parse_args(argv)
    try:
        root = html_root()
        wanted = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else task_names(root)
        rows, skipped = [], []
        for name in wanted:
            try:
                rows.append(task_row(root, name))
            except MiniWoBError as exc:
                if args.tasks:  # asked for by name: say it, write nothing
                    raise
                skipped.append(str(exc))
    except MiniWoBError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(rows)} MiniWoB++ tasks written to {args.output}" + (f"; {len(skipped)} left out (pages that need "
          "images or data files)" if skipped else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
