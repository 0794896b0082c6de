"""The Hermes Agent's own batch runner (hermes-agent 0.19.0 from PyPI, installed once into the user's
cache as --agent=hermes installs it: hermes_batch/harness/install.py) and this product's CLI run the
same dataset against the same scripted endpoint; what each records is compared field by field.

Tool turns must be the same bytes, but for what differs by nature (the call ids the endpoint draws,
the work directory: the reference's is a directory of this machine, ours the sandbox's) and for the
values that are each product's own prose (an error's or a hint's words), whose type alone must match.
Assistant turns are the same bytes; the system turn has the same frame and tools; the metadata the
reference writes has the same types in ours; one `datasets` call loads both files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hermes_batch.record.reference import REFERENCE_VERSION
from tests.backend_harness import unavailable
from tests.conftest import CLI, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel, script

PROSE = {"message", "error", "hint", "_hint", "exit_code_meaning", "timeout_note"}  # each product's own words
OURS_ONLY_PARAMETERS = {("patch", "mode")}  # (tool, parameter) the product offers that the reference lacks
BLOCK = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)

STEPS = [
    {"calls": [["terminal", {"command": "echo hi; echo oops >&2; printf 'a\\nb\\n'"}]]},
    {"calls": [["write_file", {"path": "notes/hello.txt", "content": "one\ntwo\nthree\n"}]]},
    {"calls": [["read_file", {"path": "notes/hello.txt"}]]},
    {"calls": [["patch", {"path": "notes/hello.txt", "old_string": "two", "new_string": "TWO"}]]},
    {"calls": [["search_files", {"pattern": "TWO", "path": "notes"}]]},
    {"calls": [["terminal", {"command": "cat notes/hello.txt"}],  # two calls in one turn
               ["read_file", {"path": "notes/hello.txt", "offset": 2, "limit": 1}]]},
    {"calls": [["terminal", {"command": "exit 3"}], ["read_file", {"path": "missing.md"}]]},
    {"calls": [["write_file", {"path": "code.py", "content": "x = 1\n"}]]},
    {"calls": [["patch", {"path": "code.py", "old_string": "nothere", "new_string": "y"}],
               ["terminal", {"command": "grep zzz code.py"}]]},
    {"answer": "All done."},
]


def reference_site() -> Path:
    """The directory the reference is installed in (pip --target), installed now if it is not yet."""
    from hermes_batch.errors import UserError
    from hermes_batch.harness import HarnessSettings, harness_dir

    try:
        site = harness_dir(HarnessSettings(agent="hermes", agent_version=REFERENCE_VERSION), progress=False)
    except UserError as exc:
        unavailable("hermes", f"hermes-agent=={REFERENCE_VERSION} could not be installed: {exc}")
    assert site is not None
    return Path(site)


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> dict[str, Any]:
    site = reference_site()
    tmp = tmp_path_factory.mktemp("parity")
    data = write_jsonl(tmp / "d.jsonl", [{"prompt": script(*STEPS, text="Parity: files and commands.")}])
    (tmp / "ref").mkdir()
    with ScriptedModel() as model:
        # its terminal and file tools work where it runs (TERMINAL_ENV unset: this machine)
        ref = subprocess.run([sys.executable, "-m", "batch_runner", f"--dataset_file={data}", "--batch_size=1",
                              "--run_name=ref", "--distribution=terminal_only", "--model=scripted",
                              f"--base_url={model.base_url}", "--api_key=k", "--max_turns=12", "--num_workers=1"],
                             cwd=tmp / "ref", capture_output=True, text=True, timeout=600,
                             env={**os.environ, "HERMES_HOME": str(tmp / "ref-home"), "PYTHONPATH": str(site)})
        assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
        ours = CLI(tmp, model).run("ours", data, distribution="terminal_only", max_turns=12, num_workers=1)
        assert ours.returncode == 0, ours.stderr[-3000:]
    ref_file, ours_file = tmp / "ref" / "data" / "ref" / "trajectories.jsonl", tmp / "out" / "ours" / "trajectories.jsonl"
    [ref_rec], [ours_rec] = read_jsonl(ref_file), read_jsonl(ours_file)
    return {"ref": ref_rec, "ours": ours_rec, "ref_file": ref_file, "ours_file": ours_file,
            "ref_workdir": str((tmp / "ref").resolve()), "tmp": tmp}


def _normalised(body: Any, ids: dict[str, str], workdir: str, target: str) -> Any:
    """A result with its call id named by position, `workdir` read as `target`, and prose as its type."""
    if isinstance(body, dict):
        return {k: (f"<{type(v).__name__}>" if k in PROSE and isinstance(v, str) else
                    ids.get(v, v) if k == "tool_call_id" else _normalised(v, ids, workdir, target))
                for k, v in body.items()}
    if isinstance(body, list):
        return [_normalised(v, ids, workdir, target) for v in body]
    if isinstance(body, str):
        return body.replace(workdir, target)
    return body


def _blocks(turn: dict[str, Any]) -> list[str]:
    return BLOCK.findall(turn["value"])


def test_tool_turns_are_the_reference_s_bytes(both):
    ref, ours = both["ref"]["conversations"], both["ours"]["conversations"]
    assert [t["from"] for t in ours] == [t["from"] for t in ref]
    assert [t["from"] for t in ref].count("tool") == len(STEPS) - 1  # a turn per reply, two calls or one
    for n, (r, o) in enumerate(zip(ref, ours, strict=True)):
        if r["from"] != "tool":
            continue
        r_blocks, o_blocks = _blocks(r), _blocks(o)
        assert len(r_blocks) == len(o_blocks) and "\n".join(f"<tool_response>\n{b}\n</tool_response>" for b in o_blocks) \
            == o["value"], n
        for rb, ob in zip(r_blocks, o_blocks, strict=True):
            r_body, o_body = json.loads(rb), json.loads(ob)
            # the same serialisation: a block is its JSON written as json.dumps writes it
            assert rb == json.dumps(r_body, ensure_ascii=False) and ob == json.dumps(o_body, ensure_ascii=False)
            ids = {r_body["tool_call_id"]: "call", o_body["tool_call_id"]: "call"}
            r_norm = _normalised(r_body, ids, both["ref_workdir"], "/workspace")
            o_norm = _normalised(o_body, ids, "/workspace", "/workspace")
            assert json.dumps(o_norm, ensure_ascii=False) == json.dumps(r_norm, ensure_ascii=False), (n, rb, ob)
        # the structured fields pair each result with its call, by id
        calls = ours[n - 1]["tool_calls"]
        assert [x["tool_call_id"] for x in o["tool_results"]] == [c["id"] for c in calls]
        assert [json.loads(b)["tool_call_id"] for b in o_blocks] == [c["id"] for c in calls]


def test_assistant_and_user_turns_are_the_same_bytes(both):
    for r, o in zip(both["ref"]["conversations"], both["ours"]["conversations"], strict=True):
        if r["from"] in ("gpt", "human"):
            assert o["value"] == r["value"]


def test_the_system_turn_has_the_reference_s_frame_and_tools(both):
    ref, ours = both["ref"]["conversations"][0]["value"], both["ours"]["conversations"][0]["value"]

    def frame(value: str) -> tuple[list[Any], str]:
        head, rest = value.split("<tools>\n", 1)
        tools, tail = rest.split("\n</tools>\n", 1)
        return json.loads(tools), tail

    (ref_tools, ref_tail), (ours_tools, ours_tail) = frame(ref), frame(ours)
    # the call's schema line and the example are a format; the sentences around them each product's own
    assert ref_tail.split("\n")[1] == ours_tail.split("\n")[1] and "'title': 'FunctionCall'" in ours_tail
    assert ref_tail.endswith("Example:\n<tool_call>\n{'name': <function-name>,'arguments': <args-dict>}\n</tool_call>")
    assert ours_tail.endswith("Example:\n<tool_call>\n{'name': <function-name>,'arguments': <args-dict>}\n</tool_call>")
    by_name = {t["name"]: t for t in ref_tools}
    for tool in ours_tools:
        assert list(tool) == ["name", "description", "parameters", "required"] and tool["required"] is None
        theirs = by_name.get(tool["name"])
        assert theirs is not None, f"{tool['name']} is not a tool of the reference's"
        mine, their = tool["parameters"]["properties"], theirs["parameters"]["properties"]
        for name, spec in mine.items():
            if (tool["name"], name) in OURS_ONLY_PARAMETERS:
                continue
            assert name in their, (tool["name"], name)
            assert spec.get("type") == their[name].get("type"), (tool["name"], name, spec, their[name])
            assert spec.get("enum", their[name].get("enum")) == their[name].get("enum") or \
                set(spec["enum"]) <= set(their[name]["enum"]), (tool["name"], name)


def test_the_record_s_fields_and_their_types_are_the_reference_s(both):
    ref, ours = both["ref"], both["ours"]
    for key, value in ref.items():
        assert key in ours and type(ours[key]) is type(value), key
    for key, value in ref["metadata"].items():
        assert key in ours["metadata"] and type(ours["metadata"][key]) is type(value), key
    assert (ours["completed"], ours["partial"], ours["api_calls"]) == (ref["completed"], ref["partial"], ref["api_calls"])
    assert sorted(ours["toolsets_used"]) == sorted(ref["toolsets_used"])
    assert set(ref["tool_stats"]) <= set(ours["tool_stats"]) and set(ref["tool_error_counts"]) <= set(ours["tool_error_counts"])
    used = {name for name, s in ref["tool_stats"].items() if s["count"]}
    assert {n: ours["tool_stats"][n] for n in used} == {n: ref["tool_stats"][n] for n in used}


def test_one_datasets_call_loads_both_files(both, monkeypatch):
    """`datasets` takes a file's columns and struct fields from the first file it reads and fills the
    ones a later file lacks (never the reverse): ours first, the reference's rows load beside them."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(both["tmp"] / "hf"))
    table = datasets.load_dataset("json", data_files=[str(both["ours_file"]), str(both["ref_file"])], split="train",
                                  cache_dir=str(both["tmp"] / "hf-cache"))
    assert table.num_rows == 2
    assert table.features["metadata"]["timestamp"].dtype == "string"
    ours, ref = table[0], table[1]
    assert ref["prompt_index"] == both["ref"]["prompt_index"] and ref["metadata"]["timestamp"] == both["ref"]["metadata"]["timestamp"]
    assert [t["value"] for t in ref["conversations"]] == [t["value"] for t in both["ref"]["conversations"]]
    assert ours["id"] == both["ours"]["id"] and ref["id"] is None  # the product's own fields kept, null in theirs


def test_the_side_by_side_benchmark_runs_both_and_finds_every_trajectory_in_each(tmp_path):
    """benchmarks/bench_reference.py, small: the reference's batch runner and this product both
    write every trajectory, each completed with its command's output, and the figures are printed
    (their size is the benchmark's business, not a test's)."""
    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_reference.py"
    res = subprocess.run([sys.executable, str(bench), "--prompts=4", "--workers=2"], capture_output=True, text=True,
                         timeout=900, cwd=tmp_path)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    rows = {line.split("  ")[0].strip(): line.split()[-3:] for line in res.stdout.splitlines() if "  " in line}
    assert rows["trajectories"][:2] == ["4.00", "4.00"], res.stdout
    assert rows["completed, with the output"][:2] == ["4.00", "4.00"], res.stdout
    assert float(rows["CPU, s"][2]) > 0, res.stdout
