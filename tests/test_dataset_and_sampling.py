"""Stable prompt ids, row validation and toolset sampling."""

from __future__ import annotations

import json

import pytest

from hermes_batch import distributions
from hermes_batch.dataset.rows import load_dataset
from hermes_batch.runner.sampling import sample_toolsets
from hermes_batch.tools import OPT_IN_TOOLSETS, TOOLSETS
from tests.conftest import write_jsonl


def test_ids_are_stable_under_reordering_and_edits_elsewhere(tmp_path):
    rows = [{"prompt": "a"}, {"prompt": "b", "image": "img:1"}, {"prompt": "a"}, {"prompt": "c"}]
    first = load_dataset(write_jsonl(tmp_path / "1.jsonl", rows)).records
    shuffled = [rows[3], rows[2], {"prompt": "new"}, rows[1], rows[0]]
    second = load_dataset(write_jsonl(tmp_path / "2.jsonl", shuffled)).records
    assert {r.id for r in first} <= {r.id for r in second}
    by_prompt = {}
    for r in first:
        by_prompt.setdefault(r.prompt, []).append(r.id)
    assert len(by_prompt["a"]) == 2 and by_prompt["a"][0] != by_prompt["a"][1]  # duplicates stay distinct
    assert [r.index for r in second] == list(range(5))


def test_image_cwd_and_extra_fields(tmp_path):
    rows = [{"prompt": "p", "docker_image": "d:1", "cwd": "/app", "source": "gsm8k", "level": 3},
            {"prompt": "q", "image": "i:1", "docker_image": "d:1"}]
    a, b = load_dataset(write_jsonl(tmp_path / "d.jsonl", rows)).records
    assert (a.image, a.cwd, a.extra) == ("d:1", "/app", {"source": "gsm8k", "level": 3})
    assert b.image == "i:1" and b.extra == {}


@pytest.mark.parametrize("row,why", [
    ({"prompt": "x", "cwd": "relative/dir"}, "'cwd' must be an absolute path"),
    ({"prompt": "   "}, "'prompt' is empty"),
    ({"prompt": ["a"]}, "'prompt' must be a string, got list"),
    ({"prompt": "x", "image": 5}, "'image' must be a non-empty string"),
])
def test_bad_rows_say_why(tmp_path, row, why):
    ds = load_dataset(write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ok"}, row]))
    assert len(ds.records) == 1
    assert ds.problems[0].line == 2 and why in ds.problems[0].message


def test_max_samples_counts_valid_rows(tmp_path):
    rows = ["{broken", {"prompt": "1"}, {"nope": 1}, {"prompt": "2"}, {"prompt": "3"}]
    ds = load_dataset(write_jsonl(tmp_path / "d.jsonl", rows), max_samples=2)
    assert [r.prompt for r in ds.records] == ["1", "2"]


def test_invalid_utf8_is_a_row_problem(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "\xff\xfe"}\n')
    ds = load_dataset(path)
    assert len(ds.records) == 1 and "not valid UTF-8" in ds.problems[0].message


def test_a_lone_surrogate_is_a_row_problem_not_a_crash(tmp_path, cli):
    """`"a\\ud800b"` is valid JSON but not text: it crashed the run with a traceback, and every
    --resume after it."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": "a\\ud800b"}\n{"prompt": "fine", "notes": ["x\\udfffy"]}\n')
    ds = load_dataset(path)
    assert [r.prompt for r in ds.records] == ["ok"]
    assert [p.line for p in ds.problems] == [2, 3]
    assert "'prompt' holds a lone surrogate" in ds.problems[0].message and "'notes'" in ds.problems[1].message
    for resume in (False, True):
        res = cli.run("surrogate", path, require_reasoning=False, resume=resume)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert f"{path}:2: 'prompt' holds a lone surrogate" in res.stderr


def test_a_row_cut_short_names_the_column_where_it_ends(tmp_path):
    """The error of a row cut short was reported on the line after it: column 1."""
    row = '{"prompt": "' + "a" * 100 + '", '
    ds = load_dataset(write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ok"}, row]))
    assert ds.problems[0].line == 2 and f"at column {len(row) + 1}" in ds.problems[0].message, ds.problems


def test_rows_too_deep_or_too_big_for_json_are_row_problems(tmp_path, cli):
    """A row 2,000 arrays deep or with a 5,001-digit integer killed the run with a traceback; one
    500 objects deep was accepted and then stalled its worker until the watchdog (75 minutes)."""
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([
        '{"prompt": "fine"}', "[" * 2000 + "]" * 2000, '{"prompt": "hi", "n": ' + "1" * 5001 + "}",
        '{"prompt": "hi", "x": ' + '{"a": ' * 500 + "1" + "}" * 500 + "}"]) + "\n")
    ds = load_dataset(path)
    assert [r.prompt for r in ds.records] == ["fine"] and [p.line for p in ds.problems] == [2, 3, 4]
    # told from the text, before a parser deep in its recursion runs a finalizer the collector picks
    assert [p.message for p in ds.problems if "nested more than 64 levels deep" in p.message] == [
        ds.problems[0].message, ds.problems[2].message]
    brackets = tmp_path / "b.jsonl"  # brackets inside strings are text, not nesting
    brackets.write_text(json.dumps({"prompt": "[" * 100 + '\\"{' * 100, "x": [[["ok"]]]}) + "\n")
    assert [r.prompt for r in load_dataset(brackets).records] == ["[" * 100 + '\\"{' * 100]
    res = cli.run("deep", path, require_reasoning=False, prompt_timeout=30)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]


def test_every_shipped_distribution_names_known_toolsets():
    for name in distributions.available():
        distributions.get(name, set(TOOLSETS))
    assert set(distributions.get("default").toolsets) == set(TOOLSETS) - set(OPT_IN_TOOLSETS)
    assert not any(t in distributions.get(name).toolsets for name in distributions.available() for t in OPT_IN_TOOLSETS)


# hermes-agent 0.19.0's distributions (../shared/notes/toolsets.md); ours may add `code` to default
REFERENCE_DISTRIBUTIONS = {
    "default": dict.fromkeys(["web", "vision", "image_gen", "terminal", "file", "browser"], 100),
    "image_gen": {"image_gen": 90, "vision": 90, "web": 55, "terminal": 45},
    "research": {"web": 90, "browser": 70, "vision": 50, "terminal": 10},
    "science": {"web": 94, "terminal": 94, "file": 94, "vision": 65, "browser": 50, "image_gen": 15},
    "development": {"terminal": 80, "file": 80, "web": 30, "vision": 10},
    "safe": {"web": 80, "browser": 70, "vision": 60, "image_gen": 60},
    "balanced": dict.fromkeys(["web", "vision", "image_gen", "terminal", "file", "browser"], 50),
    "minimal": {"web": 100},
    "terminal_only": {"terminal": 100, "file": 100},
    "terminal_web": {"terminal": 100, "file": 100, "web": 100},
    "creative": {"image_gen": 90, "vision": 90, "web": 30},
    "reasoning": {"web": 90, "file": 60, "terminal": 20},
    "browser_use": {"browser": 100, "web": 80, "vision": 70},
    "browser_only": {"browser": 100},
    "browser_tasks": {"browser": 97, "vision": 12, "terminal": 15},
    "terminal_tasks": {"terminal": 97, "file": 97, "web": 97, "browser": 75, "vision": 50, "image_gen": 10},
    "mixed_tasks": {"browser": 92, "terminal": 92, "file": 92, "web": 35, "vision": 15, "image_gen": 15},
}


def test_the_reference_s_seventeen_distributions_are_shipped_under_their_names_and_percentages():
    shipped = distributions.available()
    for name, toolsets in REFERENCE_DISTRIBUTIONS.items():
        assert name in shipped, name
        ours = {t: p for t, p in shipped[name].toolsets.items() if not (name == "default" and t == "code")}
        assert ours == toolsets, (name, shipped[name].toolsets)


def test_list_distributions_marks_the_reference_s_seventeen_and_no_other_as_the_reference_s():
    """Issue 49: 13 of the reference's 17 were marked (and marked in their descriptions by hand)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "--list_distributions"], capture_output=True,
                         text=True, timeout=120).stdout
    heads = [line for line in out.splitlines() if line and not line.startswith(" ") and ": " in line]
    marked = {line.split(":")[0] for line in heads if line.endswith("(the reference's)")}
    assert marked == set(REFERENCE_DISTRIBUTIONS), sorted(marked ^ set(REFERENCE_DISTRIBUTIONS))
    assert len(heads) == len(distributions.available())


def test_sampling_is_seeded_by_prompt_and_follows_probabilities():
    dist = distributions.get("development")
    ids = [f"{i:016x}-0" for i in range(4000)]
    draws = [sample_toolsets(i, dist) for i in ids]
    assert draws == [sample_toolsets(i, dist) for i in ids]  # reproducible
    assert all(d for d in draws)  # never empty
    share = {ts: sum(ts in d for d in draws) / len(draws) for ts in dist.toolsets}
    for ts, pct in dist.toolsets.items():
        assert abs(share[ts] - pct / 100) < 0.05, (ts, share[ts])


def test_an_all_miss_draw_falls_back_to_the_most_likely_toolset(tmp_path):
    path = tmp_path / "rare.toml"
    path.write_text('description = "rare"\n[toolsets]\nweb = 1\nfile = 2\ncode = 2\n')
    dist = distributions.get(str(path), set(TOOLSETS))
    draws = [sample_toolsets(f"id-{i}", dist) for i in range(300)]
    assert draws.count(["code"]) > 250  # ties go to the alphabetically first of the most likely


def test_bad_distribution_files_are_explained(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[toolsets]\nterminal = 150\n')
    with pytest.raises(distributions.DistributionError, match="percentage in"):
        distributions.get(str(bad))
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('[toolsets]\ntelepathy = 50\n')
    with pytest.raises(distributions.DistributionError, match="unknown toolset"):
        distributions.get(str(unknown), set(TOOLSETS))
    with pytest.raises(distributions.DistributionError, match="unknown distribution 'nope'"):
        distributions.get("nope")
    json.dumps(distributions.get("default").model_dump())  # plain data


def test_leaving_web_out_draws_the_other_toolsets_exactly_as_before():
    dist = distributions.get("balanced")
    for i in range(200):
        pid = f"prompt-{i}"
        full, without = sample_toolsets(pid, dist), sample_toolsets(pid, dist, frozenset({"web"}))
        assert "web" not in without and without
        if [t for t in full if t != "web"]:
            assert without == [t for t in full if t != "web"]


def test_an_edited_files_directory_or_harbor_environment_makes_a_new_row_not_one_already_done(tmp_path):
    """A review: the row's id hashed the directory's name, not its files, so an edited fixture left
    the row "done" on --resume (and a run's index of the dataset hid the edit)."""
    from hermes_batch.checks import harbor
    from hermes_batch.dataset.rows import load_dataset

    (tmp_path / "fixture").mkdir()
    (tmp_path / "fixture" / "data.txt").write_text("v1\n")
    task = tmp_path / "tasks" / "t1"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text("Do it.")
    (task / "tests" / "test.sh").write_text("exit 0\n")
    (task / "environment" / "Dockerfile").write_text("FROM scratch\n")
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "p", "files": "fixture"}) + "\n" + json.dumps({"prompt": "q"}) + "\n")
    rows = harbor.write_rows(tmp_path / "tasks", tmp_path / "run")

    before = load_dataset(data)
    before.write_index(tmp_path / "index")
    harbor_before = load_dataset(rows)
    harbor_before.write_index(tmp_path / "harbor-index")
    assert load_dataset(data, index=tmp_path / "index").from_index  # nothing changed: the index holds

    (tmp_path / "fixture" / "data.txt").write_text("v2\n")
    (task / "environment" / "Dockerfile").write_text("FROM scratch\nENV X=1\n")
    from hermes_batch.checks import task as task_module

    task_module._directory_digest.cache_clear()  # a new invocation reads the directories afresh
    after = load_dataset(data, index=tmp_path / "index")
    harbor_after = load_dataset(harbor.write_rows(tmp_path / "tasks", tmp_path / "run"), index=tmp_path / "harbor-index")
    assert not after.from_index and after.ids[0] != before.ids[0] and after.ids[1] == before.ids[1]
    assert not harbor_after.from_index and harbor_after.ids != harbor_before.ids
