"""export --max_tokens: a trajectory over a token budget keeps its first turns and its last ones
byte for byte, and only as much of its middle as needed becomes one summary; counted by a real
tokenizer (a tokenizer.json here; the embedded model's own vocabulary in test_local_model.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hermes_batch.export.compress import SUMMARY_HEADER, SUMMARY_PROMPT, FileTokenizer
from tests.conftest import CLI, ROOT, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel, script

tokenizers = pytest.importorskip("tokenizers")
STEPS = 8


def make_tokenizer(path) -> str:
    """A word-level tokenizer.json, trained here: a real tokenizer file the library reads back."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["the agent ran a command and read its output " * 3], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(str(path))
    return str(path)


def grader(messages):
    """The summary model: a short summary when asked for one."""
    return "It listed numbers several times; nothing else matters." if SUMMARY_PROMPT in str(messages) else None


def long_and_short(tmp, cli, run_name: str, last: int) -> None:
    """A run of two prompts: one of STEPS commands that print `last` lines at most, and a short one."""
    long = script(*[{"calls": [["terminal", {"command": f"seq {i} {last}"}]]} for i in range(STEPS)],
                  {"answer": "All done: the numbers are listed."}, text=f"List numbers many times ({run_name}).")
    short = script({"answer": "short"}, text=f"A short one ({run_name}).")
    res = cli.run(run_name, write_jsonl(tmp / f"{run_name}.jsonl", [{"prompt": long}, {"prompt": short}]),
                  toolsets="terminal", max_turns=STEPS + 2)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compress")
    model = ScriptedModel(grader=grader)
    model.start()
    cli = CLI(tmp, model)
    long_and_short(tmp, cli, "long", 400)
    yield tmp, cli, model
    model.stop()


def export(tmp, cli, model, output: str, **flags) -> subprocess.CompletedProcess:
    args = {"run_name": "long", "output_dir": cli.out, "output": tmp / output, "summary_model": "scripted",
            "summary_base_url": model.base_url, "tokenizer": make_tokenizer(tmp / "tokenizer.json"), **flags}
    return subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "export", *(f"--{k}={v}" for k, v in args.items())],
                          # the embedded model's summary of a 4.7k-token middle took 150 s idle, over 300 s busy
                          capture_output=True, text=True, timeout=900, env={**os.environ, "SUMMARY_API_KEY": "x"})


def tokens(tmp, row) -> int:
    from hermes_batch.export.rows import Checker

    return FileTokenizer(str(tmp / "tokenizer.json")).count(Checker().render(row))


def test_a_long_row_is_brought_under_the_budget_keeping_its_ends_and_a_short_one_is_untouched(long_run):
    tmp, cli, model = long_run
    res = export(tmp, cli, model, "full.jsonl", max_tokens=100_000)
    assert res.returncode == 0, res.stderr[-3000:]
    full = {json.loads(r["metadata"])["prompt_index"]: r for r in read_jsonl(tmp / "full.jsonl")}
    size = tokens(tmp, full[0])
    budget = size * 2 // 3
    asked = len(model.requests)
    res = export(tmp, cli, model, "fit.jsonl", max_tokens=budget, keep_last=4)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "1 compressed to fit --max_tokens" in res.stderr, res.stderr
    rows = {json.loads(r["metadata"])["prompt_index"]: r for r in read_jsonl(tmp / "fit.jsonl")}
    assert rows[1] == full[1]  # under the budget: as it was
    long, before = rows[0]["messages"], full[0]["messages"]
    assert tokens(tmp, rows[0]) <= budget < size  # counted again here, by the tokenizer itself
    assert long[:4] == before[:4]  # the system prompt, the prompt, the first reply and its result
    assert long[-4:] == before[-4:]  # the last four
    summaries = [m for m in long if m["role"] == "user" and m["content"].startswith(SUMMARY_HEADER)]
    assert len(summaries) == 1 and long.index(summaries[0]) == 4 and "listed numbers" in summaries[0]["content"]
    kept = long[5:]  # after the summary: whole replies with their results, as they were
    assert kept == before[len(before) - len(kept):]
    info = json.loads(rows[0]["metadata"])["compressed"]
    assert info["tokens_before"] == size and info["tokens_after"] == tokens(tmp, rows[0])
    assert info["turns_replaced"] == len(before) - len(long) + 1 and info["summary_model"] == "scripted"
    assert len(model.requests) == asked + 1  # one summary, for the one long row


def test_sharegpt_records_are_compressed_as_their_openai_rows_are(long_run):
    """The reference's compressor reads ShareGPT: --format=sharegpt --max_tokens gives the same
    compression in Hermes turns (the ends byte for byte, one human turn of summary, said in metadata)."""
    from hermes_batch.record import messages

    tmp, cli, model = long_run
    assert export(tmp, cli, model, "whole.sharegpt.jsonl", format="sharegpt").returncode == 0
    whole = {r["prompt_index"]: r for r in read_jsonl(tmp / "whole.sharegpt.jsonl")}
    assert export(tmp, cli, model, "all.openai.jsonl", max_tokens=100_000).returncode == 0
    size = tokens(tmp, next(r for r in read_jsonl(tmp / "all.openai.jsonl") if json.loads(r["metadata"])["prompt_index"] == 0))
    budget = size * 2 // 3
    assert export(tmp, cli, model, "fit.openai.jsonl", max_tokens=budget).returncode == 0
    res = export(tmp, cli, model, "fit.sharegpt.jsonl", max_tokens=budget, format="sharegpt")
    assert res.returncode == 0 and "1 compressed to fit --max_tokens" in res.stderr, res.stderr[-3000:]
    fitted = {r["prompt_index"]: r for r in read_jsonl(tmp / "fit.sharegpt.jsonl")}
    row = next(r for r in read_jsonl(tmp / "fit.openai.jsonl") if json.loads(r["metadata"])["prompt_index"] == 0)
    assert fitted[1] == whole[1]  # under the budget: as it was
    turns, before = fitted[0]["conversations"], whole[0]["conversations"]
    assert messages(fitted[0]) == row["messages"]  # the same conversation the openai row holds
    assert turns[:4] == before[:4] and turns[-4:] == before[-4:]
    [summary] = [t for t in turns if t["from"] == "human" and t["value"].startswith(SUMMARY_HEADER)]
    assert turns.index(summary) == 4 and summary["content"] == summary["value"] and len(turns) < len(before)
    assert fitted[0]["metadata"]["compressed"] == json.loads(row["metadata"])["compressed"]


def test_a_row_that_cannot_fit_is_left_out_and_counted(long_run):
    tmp, cli, model = long_run
    assert export(tmp, cli, model, "all.jsonl", max_tokens=100_000).returncode == 0
    short = next(r for r in read_jsonl(tmp / "all.jsonl") if json.loads(r["metadata"])["prompt_index"] == 1)
    res = export(tmp, cli, model, "tiny.jsonl", max_tokens=tokens(tmp, short) + 10)  # the short row fits, no more
    assert res.returncode == 0, res.stderr[-3000:]
    assert "1 over --max_tokens even with its middle summarised" in res.stderr, res.stderr
    assert len(read_jsonl(tmp / "tiny.jsonl")) == 1
    wrong = export(tmp, cli, model, "x.jsonl", max_tokens=1000, tokenizer=tmp / "missing.json")
    assert wrong.returncode != 0 and "not a tokenizer.json" in wrong.stderr
    other = export(tmp, cli, model, "x", max_tokens=1000, format="sts")
    assert other.returncode != 0 and "--max_tokens compresses openai, sharegpt" in other.stderr and "not sts" in other.stderr


@pytest.mark.embedded_model
def test_the_embedded_model_writes_the_summary_and_its_own_vocabulary_counts(long_run):
    """Offline, as a user without an endpoint would: the GGUF's vocabulary through llama.cpp counts,
    the embedded model summarises."""
    from tests.backend_harness import unavailable
    from tests.test_local_model import _real_model_status

    why = _real_model_status()
    if why:
        unavailable("local-model", why)
    from hermes_batch.export.compress import ServerTokenizer
    from hermes_batch.export.rows import Checker
    from hermes_batch.llm.local_model import embedded_endpoint

    tmp, cli, model = long_run
    long_and_short(tmp, cli, "medium", 100)  # a middle of 1.7k tokens to read: 65 s here, not 170
    assert export(tmp, cli, model, "whole.jsonl", run_name="medium").returncode == 0
    whole = next(r for r in read_jsonl(tmp / "whole.jsonl") if json.loads(r["metadata"])["prompt_index"] == 0)
    with embedded_endpoint(None, threads=None, ctx=2048, parallel=1, log_path=tmp / "lm.log", say=print) as url:
        size = ServerTokenizer(url, "gguf").count(Checker().render(whole))
    budget = size * 3 // 4
    asked = len(model.requests)
    res = export(tmp, cli, model, "local.jsonl", run_name="medium", max_tokens=budget, summary_model="local",
                 tokenizer="local")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "1 compressed to fit --max_tokens" in res.stderr, res.stderr
    row = next(r for r in read_jsonl(tmp / "local.jsonl") if json.loads(r["metadata"])["prompt_index"] == 0)
    info = json.loads(row["metadata"])["compressed"]
    assert info["tokenizer"] == "local:gguf" and info["summary_model"] == "local"
    assert info["tokens_after"] <= budget < info["tokens_before"] == size
    [summary] = [m for m in row["messages"] if m["role"] == "user" and m["content"].startswith(SUMMARY_HEADER)]
    assert len(summary["content"]) > len(SUMMARY_HEADER) + 20  # the model wrote something
    assert len(model.requests) == asked  # nothing went to the scripted endpoint


def test_a_summary_model_that_cannot_be_reached_is_named_and_leaves_no_file(long_run):
    """A review: a traceback, and a temporary file left beside the output."""
    tmp, cli, model = long_run
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/v1"  # nothing listens once this closes
    assert export(tmp, cli, model, "whole.jsonl", max_tokens=100_000).returncode == 0
    whole = {json.loads(r["metadata"])["prompt_index"]: r for r in read_jsonl(tmp / "whole.jsonl")}
    out = tmp / "unreached"
    out.mkdir()
    res = export(tmp, cli, model, "unreached/u.jsonl", max_tokens=tokens(tmp, whole[0]) * 2 // 3,
                 summary_base_url=closed)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "the summary model scripted at " + closed in res.stderr and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert list(out.iterdir()) == []


def test_a_middle_longer_than_the_summary_model_reads_is_summarised_in_pieces(long_run):
    """Issue 49: the embedded model (8,192 tokens of context) could not shorten a row whose middle is
    longer than that: the one request was refused, or the row left out. Here the scripted model is
    said to read 1,024 tokens at once."""
    tmp, cli, model = long_run
    assert export(tmp, cli, model, "whole.jsonl", max_tokens=100_000).returncode == 0
    whole = {json.loads(r["metadata"])["prompt_index"]: r for r in read_jsonl(tmp / "whole.jsonl")}
    asked = len(model.requests)
    res = export(tmp, cli, model, "pieces.jsonl", max_tokens=tokens(tmp, whole[0]) * 2 // 3,
                 summary_context=1024)
    assert res.returncode == 0 and "1 compressed to fit --max_tokens" in res.stderr, res.stderr[-3000:]
    requests = [str(r) for r in model.requests[asked:]]
    combined = [r for r in requests if "PART 1:" in r]
    assert len(requests) > 2 and combined, len(requests)  # the pieces, then their summaries together
    [row] = [r for r in read_jsonl(tmp / "pieces.jsonl") if json.loads(r["metadata"])["prompt_index"] == 0]
    [summary] = [m for m in row["messages"] if m["role"] == "user" and m["content"].startswith(SUMMARY_HEADER)]
    assert "listed numbers" in summary["content"]


def test_an_export_whose_rows_all_fit_starts_no_model_and_says_so(long_run):
    """Issue 49: `export --max_tokens` started the embedded model (to count, and to summarise) when no
    row needed shortening, and did not say how many it shortened. The embedded model's vocabulary is
    read from its GGUF file."""
    from tests.backend_harness import unavailable
    from tests.test_local_model import _real_model_status

    if why := _real_model_status():
        unavailable("local-model", why)
    tmp, cli, model = long_run
    res = export(tmp, cli, model, "fits.jsonl", max_tokens=100_000, tokenizer="local", summary_model="local")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "0 compressed to fit --max_tokens=100000 (none was over it: no model was started)" in res.stderr
    assert "local model" not in res.stderr and len(read_jsonl(tmp / "fits.jsonl")) == 2
