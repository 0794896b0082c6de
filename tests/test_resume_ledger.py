"""Resume reads the ledger, not every record; the merge appends instead of rewriting; the dataset's
ids are kept between invocations. What a user sees stays the same: every prompt once, true stats."""

from __future__ import annotations

import json

from hermes_batch.dataset.rows import load_dataset
from tests.conftest import ledger_ids, read_jsonl, write_jsonl


def rows(n: int, start: int = 0) -> list[dict]:
    return [{"prompt": f"ledger prompt {i}"} for i in range(start, start + n)]


def _stats_without_times(run) -> dict:
    stats = json.loads((run / "statistics.json").read_text())
    for key in ("completed_at", "duration_seconds", "seconds"):
        stats.pop(key)
    return stats


def test_records_written_after_the_ledger_ends_are_found_not_run_again(cli, tmp_path):
    """A crash between the records' fsync and the ledger's leaves records the ledger does not name."""
    data = write_jsonl(tmp_path / "d.jsonl", rows(12))
    assert cli.run("tail", data, batch_size=5).returncode == 0
    run = cli.run_dir("tail")
    ledger = (run / "ledger.tsv").read_text().splitlines(keepends=True)
    kept = [line for line in ledger if not line.startswith("d\t")][:1] + [line for line in ledger if line.startswith("d\t")][:7]
    (run / "ledger.tsv").write_text("".join(kept))  # 5 done prompts no longer in the ledger
    (run / "trajectories.jsonl").unlink()
    res = cli.run("tail", data, resume=True, batch_size=5)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "12 already done" in res.stderr and "0 to run" in res.stderr
    assert sorted(ledger_ids(run)) == sorted(r["id"] for r in read_jsonl(run / "trajectories.jsonl"))
    assert len(ledger_ids(run)) == 12  # the tails went back into the ledger, once each


def test_a_run_made_before_the_ledger_resumes_and_gets_one(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", rows(9))
    assert cli.run("old", data, batch_size=4).returncode == 0
    run = cli.run_dir("old")
    before = sorted(ledger_ids(run))
    for name in ("ledger.tsv", ".merged.json", ".dataset_index"):
        (run / name).unlink()  # what a run of an earlier version holds
    write_jsonl(data, rows(11))
    res = cli.run("old", data, resume=True, batch_size=4)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "9 already done" in res.stderr and "2 to run" in res.stderr
    assert sorted(ledger_ids(run)) == sorted([*before, *ledger_ids(run)[9:]]) and len(ledger_ids(run)) == 11
    assert [r["prompt_index"] for r in read_jsonl(run / "trajectories.jsonl")] == list(range(11))


def test_a_resume_appends_to_the_merge_and_its_statistics_match_a_full_recount(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", rows(10))
    assert cli.run("grow", data, batch_size=4).returncode == 0
    run = cli.run_dir("grow")
    first = (run / "trajectories.jsonl").read_bytes()
    inode = (run / "trajectories.jsonl").stat().st_ino
    write_jsonl(data, rows(13))
    assert cli.run("grow", data, resume=True, batch_size=4).returncode == 0
    merged = (run / "trajectories.jsonl").read_bytes()
    assert merged.startswith(first) and (run / "trajectories.jsonl").stat().st_ino == inode  # appended, not rewritten
    assert [r["prompt_index"] for r in read_jsonl(run / "trajectories.jsonl")] == list(range(13))
    appended = _stats_without_times(run)
    assert appended["trajectories"] == appended["merged_trajectories"] == 13
    (run / ".merged.json").unlink()  # the next merge must count every record again
    assert cli.run("grow", data, resume=True, batch_size=4).returncode == 0
    assert (run / "trajectories.jsonl").read_bytes() == merged
    assert _stats_without_times(run) == appended


def test_a_merge_cut_short_is_done_again_whole(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", rows(6))
    assert cli.run("cut", data).returncode == 0
    run = cli.run_dir("cut")
    whole = (run / "trajectories.jsonl").read_bytes()
    with open(run / "trajectories.jsonl", "ab") as f:
        f.write(whole[:100])  # an append that died midway: the file no longer matches the merge's mark
    assert cli.run("cut", data, resume=True).returncode == 0
    assert (run / "trajectories.jsonl").read_bytes() == whole


def test_the_dataset_index_gives_the_same_rows_and_is_dropped_when_the_file_changes(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [*rows(3), "not json", {"prompt": "x", "cwd": "/w", "topic": "t"}, *rows(2)])
    index = tmp_path / "index"
    parsed = load_dataset(data, index=index)
    parsed.write_index(index)
    cached = load_dataset(data, index=index)
    assert cached.from_index and not parsed.from_index
    assert cached.records == parsed.records and cached.ids == parsed.ids
    assert [(p.line, p.message) for p in cached.problems] == [(p.line, p.message) for p in parsed.problems]
    assert cached.records_at([3])[0].extra == {"topic": "t"} and cached.records_at([3])[0].cwd == "/w"
    # rows appended: only they are read, and the ids come out as a full read gives them
    write_jsonl(data, [*rows(3), "not json", {"prompt": "x", "cwd": "/w", "topic": "t"}, *rows(2), *rows(2), {"prompt": "y"}])
    grown = load_dataset(data, index=index)
    assert sorted(grown.parsed) == [6, 7, 8] and grown.ids == load_dataset(data).ids
    assert grown.ids[6] == grown.ids[0][:-1] + "2"  # a third "ledger prompt 0": numbered on from the indexed ones
    # same size, other content: read again whole, not trusted
    grown.write_index(index)
    data.write_text(data.read_text().replace("ledger prompt 0", "ledger prompt 9"))
    again = load_dataset(data, index=index)
    assert not again.from_index and len(again.parsed) == len(again.ids) and again.records[0].prompt == "ledger prompt 9"


def test_a_blank_or_foreign_line_in_the_ledger_is_repaired_not_a_traceback(cli, tmp_path):
    """A blank line in ledger.tsv (an editor's) was an IndexError on every --resume."""
    data = write_jsonl(tmp_path / "d.jsonl", rows(6))
    assert cli.run("blank", data).returncode == 0
    run = cli.run_dir("blank")
    ledger = (run / "ledger.tsv").read_text()
    for damaged in (ledger + "\n", ledger.replace("\n", "\n\nnot a ledger line\n", 1)):
        (run / "ledger.tsv").write_text(damaged)
        res = cli.run("blank", data, resume=True)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert "6 already done" in res.stderr and "0 to run" in res.stderr
    assert "rebuilt from the records" in res.stderr  # the foreign line: said, and the ledger made again
    assert sorted(ledger_ids(run)) == sorted(r["id"] for r in read_jsonl(run / "trajectories.jsonl"))


def test_internal_files_changed_by_hand_neither_trace_back_nor_duplicate(cli, tmp_path):
    """A ledger line written twice, a merge mark that says nothing was merged, a checkpoint whose
    config is not an object, a record overwritten with blanks: each gave a traceback on every
    --resume, or every trajectory twice."""
    data = write_jsonl(tmp_path / "d.jsonl", rows(4))
    assert cli.run("hand", data, batch_size=2).returncode == 0
    run = cli.run_dir("hand")
    ids = sorted(r["id"] for r in read_jsonl(run / "trajectories.jsonl"))
    damage = [
        lambda: (run / "ledger.tsv").write_text("".join(
            line * (2 if i == 1 else 1) for i, line in enumerate((run / "ledger.tsv").read_text().splitlines(True)))),
        lambda: (run / ".merged.json").write_text(json.dumps({**json.loads((run / ".merged.json").read_text()), "ledger": 0})),
        lambda: (run / "checkpoint.json").write_text(json.dumps({"config": "x"})),
    ]
    for hurt in damage:
        hurt()
        res = cli.run("hand", data, resume=True, batch_size=2)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert sorted(r["id"] for r in read_jsonl(run / "trajectories.jsonl")) == ids  # each once
    batch = run / "batch_0.jsonl"
    first = batch.read_bytes().split(b"\n", 1)[0]
    batch.write_bytes(b" " * len(first) + batch.read_bytes()[len(first):])  # a record blanked in place
    (run / ".merged.json").unlink()
    res = cli.run("hand", data, resume=True, batch_size=2)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "is not a record" in res.stderr and len(read_jsonl(run / "trajectories.jsonl")) == 3
