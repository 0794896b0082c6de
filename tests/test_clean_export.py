"""Clean data at export (hermes_batch/export/clean/): duplicates and near-duplicates planted in real
runs of the scripted model are found and one of each group kept by the user's rule; a benchmark
whose task shows in a tool result is caught with its span, a row that only shares common words is
not; keys, tokens and personal data planted in tool results and answers are masked, the same value
by the same placeholder, and the run's own API key reaches no exported row even unscrubbed; token
rows re-tokenised where masked load in `datasets` and say they are no longer exact; every export's
dataset card loads as one and its counts are the rows'."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from tests.conftest import CLI, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel, script
from tests.test_export_and_view import export_cmd

datasets = pytest.importorskip("datasets")
pytest.importorskip("datasketch")

NOTES = ("The quarterly notes cover the migration of the billing service to the new cluster the rollback plan "
         "the owners of each step the open questions about storage quotas and the schedule agreed with the "
         "support team for the weekend of the change. Before the move every queue is drained and the nightly "
         "export is paused so that no invoice is written twice; after it the dashboards are checked by the on-call "
         "engineer who signs off in the channel, and finance confirms that the totals of the first day match the "
         "ledger kept by the old system. Risks: a slow database restore, a certificate that expires during the "
         "window, and the vendor's webhook that retries too eagerly. Each has an owner and a way back.")
BENCH_TASK = ("Given a list of integers return the running maximum of the list where element i of the result is "
              "the largest value among the first i plus one elements and an empty list gives an empty list")
RUN_KEY = "sk-or-v1-" + "5f3a9c1e7b2d4f6a8c0e1b3d5f7a9c2e4b6d8f0a1c3e5b7d9f2a4c6e8b0d1f3a"


def writes(path: str, answer: object, text: str) -> str:
    """A prompt whose agent writes the notes to `path`, counts their words, and answers."""
    return script({"calls": [["write_file", {"path": path, "content": NOTES}]]},
                  {"calls": [["terminal", {"command": f"wc -w {path}"}]]}, {"answer": answer}, text=text)


def printed(text: str) -> str:
    """A command whose output is `text` but whose arguments do not hold it (as a page or file the agent read)."""
    return f"echo {base64.b64encode(text.encode()).decode()} | base64 -d"


def export(cli: CLI, *flags: str, runs: str = "dups", output: str = "out.jsonl", env: dict | None = None):
    args = [f"--run_name={runs}", f"--output_dir={cli.out}", f"--output={cli.workdir / output}", *flags]
    res = export_cmd("export", *args, cwd=cli.workdir) if env is None else _with_env(cli, args, env)
    assert res.returncode == 0, res.stderr[-3000:]
    return res, (read_jsonl(cli.workdir / output) if output.endswith(".jsonl") else [])


def _with_env(cli: CLI, args: list[str], env: dict):
    import subprocess
    import sys

    from tests.conftest import ROOT

    return subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "export", *args], cwd=cli.workdir,
                          capture_output=True, text=True, timeout=300, env=env)


def meta(row: dict) -> dict:
    return json.loads(row["metadata"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """`dups`: a prompt whose 3 samples answer alike but for a file name (one passes), two prompts whose
    agents do the same but for a file name, and one unlike the others; `again`: the unlike one in a
    run of its own (the same task resumed elsewhere)."""
    tmp = tmp_path_factory.mktemp("clean")
    answers = [f"Saved the notes to notes_{n}.txt and counted their words; {NOTES}" + (" ALL-GOOD" if n == 1 else "")
               for n in (1, 2, 3)]
    rows = [
        {"prompt": writes("notes.txt", answers, "Write the notes and count them."), "expected": "ALL-GOOD",
         "match": "contains"},
        {"prompt": writes("report_a.txt", f"The report report_a.txt is written; {NOTES}", "Write report A.")},
        {"prompt": writes("report_b.txt", f"The report report_b.txt is written; {NOTES}", "Write report B.")},
        {"prompt": script({"calls": [["terminal", {"command": "echo unlike"}]]},
                          {"answer": "Something else entirely: the printer on floor three is out of toner again."},
                          text="Say something else.")},
    ]
    with ScriptedModel() as model:
        cli = CLI(tmp, model)
        res = cli.run("dups", write_jsonl(tmp / "d.jsonl", rows), toolsets="terminal,file", samples=3,
                      temperature=0.7, max_turns=4)
        assert res.returncode == 0, res.stderr[-3000:]
        res = cli.run("again", write_jsonl(tmp / "again.jsonl", rows[3:]), toolsets="terminal,file", max_turns=4)
        assert res.returncode == 0, res.stderr[-3000:]
    return cli, read_jsonl(cli.run_dir("dups") / "trajectories.jsonl")


def test_near_duplicates_leave_one_per_group_and_the_passing_one_stays(runs):
    cli, records = runs
    first = [r for r in records if r["prompt_index"] == 0]
    assert len(records) == 12 and any(r["verification"]["status"] == "pass" for r in first)
    res, rows = export(cli, "--dedup=near")
    # one of the notes prompt's samples; one of reports a and b (alike but a file name); one unlike
    assert len(rows) == 3, res.stderr
    kept = {meta(r)["prompt_index"]: r for r in rows}
    assert set(kept) == {0, 1, 3} or set(kept) == {0, 2, 3}
    assert meta(kept[0])["verification"]["status"] == "pass"  # --dedup_keep=passing (the default)
    assert "duplicates (near): 9 left out of 12" in res.stderr and "6 within a prompt, 3 across prompts" in res.stderr
    # only the samples of one prompt compared: reports a and b both stay
    res, rows = export(cli, "--dedup=near", "--dedup_scope=prompt")
    assert sorted(meta(r)["prompt_index"] for r in rows) == [0, 1, 2, 3]
    # the first of each group, whatever its verdict
    _, rows = export(cli, "--dedup=near", "--dedup_keep=first")
    assert {r["id"] for r in rows} >= {next(r["id"] for r in first if r["sample"] == 0)}


def test_exact_duplicates_are_the_same_conversation_and_a_file_name_keeps_them_apart(runs):
    cli, records = runs
    answers = {r["id"]: r["conversations"][-1]["content"] for r in records if r["prompt_index"] == 0}
    res, rows = export(cli, "--dedup=exact")
    # reports a and b differ by a file name: both stay; each prompt's samples alike in every word go
    per_prompt = {i: sum(meta(r)["prompt_index"] == i for r in rows) for i in range(4)}
    assert per_prompt == {0: len(set(answers.values())), 1: 1, 2: 1, 3: 1}, res.stderr


def test_the_same_task_resumed_into_a_second_run_is_written_once(runs):
    cli, records = runs
    unlike = [r for r in records if r["prompt_index"] == 3]
    res, rows = export(cli, runs="dups,again")
    ids = [r["id"] for r in rows]
    assert len(rows) == 13 and len(set(ids)) == 13  # an id the first run has is written <id>@again
    assert f"{unlike[0]['id']}@again" in ids
    res, rows = export(cli, "--dedup=exact", runs="dups,again")
    assert not any(i.endswith("@again") for i in (r["id"] for r in rows))  # the first run's copy kept
    assert "across prompts" in res.stderr and sum(meta(r)["prompt_index"] == 3 for r in rows) == 1


def test_a_benchmark_task_in_a_tool_result_is_caught_with_its_span_and_common_words_are_not(tmp_path):
    common = ("Return the list and the largest value of the result when the list is empty and the first element of "
              "the list is an integer given by the user")
    rows = [{"prompt": script({"calls": [["terminal", {"command": printed(f"Page text: {BENCH_TASK}. Thanks.")}]]},
                              {"answer": "I found the task."}, text="Read the page.")},
            {"prompt": script({"calls": [["terminal", {"command": printed(common)}]]},
                              {"answer": "Nothing to see."}, text="Read the other page.")}]
    bench = write_jsonl(tmp_path / "bench.jsonl", [
        {"task_id": "Bench/0", "prompt": "Print the numbers from one to ten, each on its own line.",
         "canonical_solution": "for i in range(1, 11): print(i)"},
        {"task_id": "Bench/7", "prompt": f"def running_max(xs):\n    \"\"\"{BENCH_TASK}\"\"\"",
         "canonical_solution": "out=[]\nfor x in xs: out.append(max(out[-1], x) if out else x)\nreturn out"}])
    env = {**os.environ, "HERMES_BATCH_CACHE": str(tmp_path / "cache")}
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        assert cli.run("bench", write_jsonl(tmp_path / "d.jsonl", rows), toolsets="terminal").returncode == 0
    res, kept = export(cli, f"--decontaminate={bench}", runs="bench", env=env)
    assert len(kept) == 1 and "Nothing to see." in json.dumps(kept)  # the common words stay
    assert f"1 of 2 rows share a 13-gram with {bench}" in res.stderr and "index built" in res.stderr
    res, flagged = export(cli, f"--decontaminate={bench}", "--contaminated=flag", runs="bench", env=env)
    assert "index cached" in res.stderr and len(flagged) == 2
    found = [meta(r)["cleaning"]["contamination"] for r in flagged if "cleaning" in meta(r)]
    assert len(found) == 1
    assert found[0]["item"] == "Bench/7" and found[0]["where"] == "tool result (terminal)"
    assert found[0]["span"].startswith("Given a list of integers") and found[0]["words"] == len(BENCH_TASK.split())
    assert list((tmp_path / "cache" / "benchmarks").glob("*.npz"))  # the index, kept outside the repo
    # a Harbor task directory: its instruction and solution are the benchmark's text
    task = tmp_path / "harbor" / "running-max"
    (task / "solution").mkdir(parents=True)
    (task / "instruction.md").write_text(f"# Running max\n\n{BENCH_TASK}\n")
    (task / "solution" / "solve.sh").write_text("python3 -c 'print(1)'\n")
    res, kept = export(cli, f"--decontaminate={tmp_path / 'harbor'}", runs="bench", env=env)
    assert len(kept) == 1 and "harbor" in res.stderr and "1 of 2 rows" in res.stderr


SECRETS = {
    "aws": "AKIAZ7QMVE4HXP2LKN3W",
    "github": "ghp_R8tYv2Lq9Wm4Xc7Bn1Kd5Fg3Hs6Jp0Az8Qe2",
    "slack": "xoxb-482039571642-5519283746102-q8WnR4tL2vB9xK7mP3cZ6yHd",
    "stripe": "sk_live_51Hq8Zr2eZvKYlo2C7Xw9Lm3Np",
    "jwt": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiI0MjQyIiwibmFtZSI6IkFkYSJ9.h3Mq8v1X0k6r2Vn9Pz4Wc7Ty5Bd3Lf8Ga1Hs6Je2Ku",
}
PRIVATE_KEY = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7q2v9Yx3Lr8Wm4Xc7Bn1Kd5Fg3Hs6Jp0Az8Qe2R8tYv2Lq9\n"
               "Wm4Xc7Bn1Kd5Fg3Hs6Jp0Az8Qe2R8tYv2Lq9Wm4Xc7Bn1Kd5Fg3Hs6Jp0Az8Qe2\n-----END RSA PRIVATE KEY-----")
EMAILS = ("ada.lovelace@example.org", "ops-team@mail.example.com")
PHONES = ("+1 415-555-0132", "+44 20 7946 0958")


@pytest.fixture(scope="module")
def leaky(tmp_path_factory):
    """A run whose tool saw a config file and an environment dump (the run's own key among them) and
    whose answer repeats some of it."""
    tmp = tmp_path_factory.mktemp("leaky")
    config = (f"aws_access_key_id = {SECRETS['aws']}\ngithub: {SECRETS['github']}\nslack: {SECRETS['slack']}\n"
              f"stripe: {SECRETS['stripe']}\nsession: {SECRETS['jwt']}\n{PRIVATE_KEY}\n"
              f"contact {EMAILS[0]} or {EMAILS[1]}, call {PHONES[0]} or {PHONES[1]}\n"
              f"OPENROUTER_API_KEY={RUN_KEY}\nPATH=/usr/bin\n")
    answer = (f"The AWS key is {SECRETS['aws']}; write to {EMAILS[0]} (again: {EMAILS[0]}) or call {PHONES[0]}. "
              "The sum is 5050 and the files are 1 2 3 4 5 6 7 8 9 10.")
    rows = [{"prompt": script({"calls": [["terminal", {"command": printed(config)}]]}, {"answer": answer},
                              text="Read the config.")},
            {"prompt": script({"calls": [["terminal", {"command": "seq 1 12"}]]}, {"answer": "Twelve numbers."},
                              text="Count.")}]
    with ScriptedModel() as model:
        cli = CLI(tmp, model)
        res = cli.run("leaky", write_jsonl(tmp / "d.jsonl", rows), toolsets="terminal", api_key=RUN_KEY)
        assert res.returncode == 0, res.stderr[-3000:]
    assert RUN_KEY in (cli.run_dir("leaky") / "trajectories.jsonl").read_text()  # the agent saw it
    assert RUN_KEY not in (cli.run_dir("leaky") / "key_prints.json").read_text()
    return cli


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("OPENROUTER_API_KEY", "OPENAI_API_KEY")}


def test_the_run_s_own_key_reaches_no_exported_row_even_unscrubbed(leaky):
    cli = leaky
    for fmt, output in (("openai", "k.jsonl"), ("sharegpt", "k.sharegpt.jsonl"), ("openai", "k.parquet"),
                        ("sts", "k_sts"), ("atif", "k_atif")):
        export(cli, f"--format={fmt}", runs="leaky", output=output, env=clean_env())  # the key is not in this shell
        path = cli.workdir / output
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        assert files and not any(RUN_KEY.encode() in p.read_bytes() for p in files), fmt
        assert any(b"<SECRET:run_api_key>" in p.read_bytes() for p in files), fmt
    # without --scrub, nothing else is touched
    rows = read_jsonl(cli.workdir / "k.jsonl")
    assert SECRETS["aws"] in json.dumps(rows) and EMAILS[0] in json.dumps(rows)


def test_secrets_and_personal_data_are_masked_the_same_value_by_the_same_placeholder(leaky):
    cli = leaky
    res, rows = export(cli, "--scrub=secrets,pii", runs="leaky", output="s.jsonl", env=clean_env())
    text = json.dumps(rows, ensure_ascii=False)
    for value in (*SECRETS.values(), PRIVATE_KEY, *EMAILS, *PHONES, RUN_KEY, "MIIEowIBAAKCAQEA"):
        assert value not in text and json.dumps(value)[1:-1] not in text, value
    row = next(r for r in rows if "config" in r["messages"][1]["content"])
    result = next(m["content"] for m in row["messages"] if m["role"] == "tool")
    answer = row["messages"][-1]["content"]
    for placeholder in ("<SECRET:aws_key>", "<SECRET:github_token>", "<SECRET:slack_token>", "<SECRET:stripe_key>",
                        "<SECRET:jwt>", "<SECRET:private_key>", "<SECRET:run_api_key>", "<EMAIL_1>", "<EMAIL_2>",
                        "<PHONE_1>", "<PHONE_2>"):
        assert placeholder in result, placeholder
    # the answer repeats the key, the first address (twice) and the first number: their placeholders
    assert answer.startswith("The AWS key is <SECRET:aws_key>; write to <EMAIL_1> (again: <EMAIL_1>) or call <PHONE_1>.")
    assert "The sum is 5050 and the files are 1 2 3 4 5 6 7 8 9 10." in answer  # numbers that are no one's stay
    assert meta(row)["cleaning"]["masked"]["email"] == 2
    other = next(r for r in rows if r is not row)
    assert "cleaning" not in meta(other)  # nothing done, nothing said: its bytes as before
    assert "masked (the run's keys, secrets, pii): " in res.stderr and "in 1 rows" in res.stderr
    # a dry run lists what would change, never a value whole, and writes nothing
    dry, _ = export(cli, "--scrub=secrets,pii", "--dry_run", runs="leaky", output="dry.jsonl", env=clean_env())
    assert "dry run: " in dry.stderr and "<SECRET:aws_key> in place of AKIA…" in dry.stderr
    assert SECRETS["aws"] not in dry.stderr and not (cli.workdir / "dry.jsonl").exists()


def test_the_card_loads_as_a_dataset_card_and_its_counts_are_the_rows(runs):
    from huggingface_hub import DatasetCard

    cli, records = runs
    res, rows = export(cli, "--dedup=near", output="carded.jsonl")
    card = DatasetCard.load(cli.workdir / "carded.README.md")
    facts = card.data.to_dict()["hermes_batch"]
    assert facts["rows"] == len(rows) == facts["trajectories"] == 3
    statuses = [meta(r)["verification"]["status"] for r in rows]
    assert facts["verdicts"] == {s: statuses.count(s) for s in ("pass", "fail", "error", "skipped")}
    assert facts["runs"] == ["dups"] and facts["models"] == {"scripted": 3}
    dedup = facts["cleaning"]["dedup"]
    assert dedup["surveyed"] == len(records) and dedup["removed"] == len(records) - len(rows)
    assert "## Cleaning" in card.text and "9 removed of 12" in card.text
    assert f"dataset card: {cli.workdir / 'carded.README.md'}" in res.stderr
    _, _ = export(cli, output="carded_ds")  # a datasets directory: its card beside it, the directory only rows
    assert DatasetCard.load(Path(cli.workdir / "carded_ds.README.md")).data.to_dict()["hermes_batch"]["rows"] == 12
    assert not (cli.workdir / "carded_ds" / "README.md").exists()
    assert datasets.load_from_disk(str(cli.workdir / "carded_ds")).num_rows == 12


def test_token_rows_are_re_tokenised_where_masked_and_say_they_are_no_longer_exact(tmp_path):
    from hermes_batch.tokens import TokenTrace
    from tests.llamacpp_double import LlamaCppDouble, detokenize, tokenizer_json
    from tests.test_tokens import run_exact

    pytest.importorskip("tokenizers")
    leak = f"owner: {EMAILS[0]}"
    rows = [{"prompt": script({"calls": [["terminal", {"command": printed(leak)}]]},
                              {"answer": f"It belongs to {EMAILS[0]}."}, text="Whose is it?"), "expected": "belongs",
             "match": "contains"},
            {"prompt": script({"calls": [["terminal", {"command": "echo plain"}]]}, {"answer": "plain"},
                              text="Echo plain."), "expected": "plain"}]
    with LlamaCppDouble() as double:
        cli, records = run_exact(tmp_path, double, rows, name="tok", max_turns=4)
    tok = tokenizer_json(tmp_path / "tokenizer.json")
    _, exact = export(cli, "--format=tokens", runs="tok", output="exact.jsonl")
    _, masked = export(cli, "--format=tokens", "--scrub=pii", f"--tokenizer={tok}", runs="tok", output="m.jsonl")
    res, _ = export(cli, "--format=tokens", "--scrub=pii", f"--tokenizer={tok}", runs="tok", output="m.parquet")
    assert "1 token rows re-tokenised" in res.stderr
    leaky = next(r for r in records if EMAILS[0] in json.dumps(r))
    before = next(r for r in exact if r["id"] == leaky["id"])
    after = next(r for r in masked if r["id"] == leaky["id"])
    assert before["token_exact"] is True and after["token_exact"] is False
    text = detokenize(after["input_ids"])
    # the address in the prompt (its script), the tool's result and the answer
    assert EMAILS[0] not in text and text.count("<EMAIL_1>") == 3 and text == detokenize(before["input_ids"]).replace(
        EMAILS[0], "<EMAIL_1>")
    # the new ids: not trained on, no log-probability; every other id, mask and log-probability as the rollout's
    n = len(EMAILS[0])  # the double's vocabulary is bytes: the changed stretch is the address's bytes
    changed = [i for i, lp in enumerate(after["logprobs"]) if lp is None]
    assert len(changed) == 3 * len("<EMAIL_1>") and all(after["loss_mask"][i] == 0 for i in changed)
    assert len(after["input_ids"]) == len(before["input_ids"]) + 3 * (len("<EMAIL_1>") - n)
    first, last = changed[0], len(after["input_ids"]) - changed[-1] - 1
    assert after["input_ids"][:first] == before["input_ids"][:first] and first > 0
    assert after["input_ids"][-last:] == before["input_ids"][-last:] and after["loss_mask"][-last:] == before["loss_mask"][-last:]
    assert sum(after["loss_mask"]) == sum(before["loss_mask"]) - n  # the answer's address is no longer trained on
    plain = next(r for r in masked if r["id"] != leaky["id"])
    assert plain == next(r for r in exact if r["id"] == plain["id"])  # untouched: exactly as it was
    loaded = datasets.load_dataset("parquet", data_files=str(cli.workdir / "m.parquet"))["train"]
    assert loaded.num_rows == 2 and sorted(loaded["token_exact"]) == [False, True]
    assert TokenTrace.from_json(leaky["tokens"]).segments == 1
    # without the run's vocabulary the masked row cannot be re-tokenised: left out, said
    res, rows = export(cli, "--format=tokens", "--scrub=pii", "--tokenizer=" + str(tmp_path / "nowhere.json"),
                       runs="tok", output="none.jsonl")
    assert [r["id"] for r in rows] == [plain["id"]] and "left out" in res.stderr


def test_a_rollout_whose_text_holds_the_run_s_key_is_not_handed_to_a_trainer(tmp_path):
    """TRLRollouts' own runs: the step's run keeps its key prints as any run does, and a rollout
    whose tool printed the key gives the trainer no ids and no reward (the others are untouched)."""
    from hermes_batch.export.clean.run_keys import RunKeys
    from hermes_batch.rollout.engine import _rollout
    from hermes_batch.store.key_prints import record_keys
    from hermes_batch.tokens import TokenCall, TokenTrace

    record_keys(tmp_path, {"OPENROUTER_API_KEY": RUN_KEY})
    trace = TokenTrace("exact", "t", "t", [TokenCall(0, [1, 5, 6], [7, 8, 2], [-0.1, -0.2, -0.3], "stop")],
                       plain_text=True)

    def record(rid: str, said: str) -> dict:
        turns = [{"from": "system", "value": "s", "content": "s"}, {"from": "human", "value": "q", "content": "q"},
                 {"from": "gpt", "value": said, "content": said, "reasoning": None, "tool_calls": None}]
        return {"id": rid, "conversations": turns, "tokens": trace.to_json(),
                "verification": {"status": "pass", "score": 1.0}}

    records = {"a": record("a", f"env: OPENROUTER_API_KEY={RUN_KEY}"), "b": record("b", "nothing secret")}
    keys = RunKeys([tmp_path])
    leaked, fine = (_rollout(r, "p", 0, 0, records, {}, keys) for r in ("a", "b"))
    assert leaked.error and "own API keys" in leaked.error and leaked.reward is None and not leaked.completion_ids
    assert fine.error is None and fine.reward == 1.0 and fine.completion_ids == [7, 8, 2]
