"""Writes a stored run (tests/test_stored_run.py) with the code checked out: scripted model, local
jail, checks, two samples a prompt, a failure and two discarded samples; it stops after the first six
rows, so a later version has work left to resume. Then its exports, in every format.

    python tests/stored_runs/make_stored_run.py tests/stored_runs/NAME
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.scripted_model import ScriptedModel, script  # noqa: E402

out = Path(sys.argv[1])
shutil.rmtree(out, ignore_errors=True)
out.mkdir(parents=True)
rows = [
    {"prompt": "say hi", "expected": "hello-1", "id": "greet"},
    {"prompt": "count files " + script({"calls": [["terminal", {"command": "printf 'four\\n' > n.txt; cat n.txt"}]]}, {"answer": "four"}),
     "check": "test \"$(cat n.txt)\" = four"},
    {"prompt": "answer " + script({"answer": ["7", "8"]}), "expected": "7"},
    {"prompt": "this one is refused REFUSE-ME"},
    {"prompt": "no reasoning " + script({"answer": "plain", "reasoning": None})},
    {"prompt": "write " + script({"calls": [["write_file", {"path": "a.txt", "content": "A"}]]}, {"answer": "done"}), "check": "test -f a.txt"},
    {"prompt": "later one " + script({"answer": "x"}), "expected": "x"},
    {"prompt": "later two " + script({"answer": ["y", "z"]}), "expected": "z"},
]
(out / "dataset.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
m = ScriptedModel(fail_marker="REFUSE-ME")
m.start()
try:
    cmd = [sys.executable, str(ROOT / "batch_runner.py"), "--dataset_file=dataset.jsonl", "--run_name=old",
           "--output_dir=out", "--model=scripted", "--api_key=test-key", f"--base_url={m.base_url}",
           "--num_workers=2", "--batch_size=3", "--max_samples=6", "--samples=2", "--sandbox_root=sandboxes"]
    r = subprocess.run(cmd, cwd=out, capture_output=True, text=True, timeout=300)
    print(r.returncode, r.stderr[-3000:])
finally:
    m.stop()
shutil.rmtree(out / "sandboxes", ignore_errors=True)
(out / "out" / "old" / ".lock").unlink(missing_ok=True)
for fmt in ("openai", "sharegpt", "atif", "sts"):
    target = out / "exports" / (fmt if fmt in ("atif", "sts") else f"{fmt}.jsonl")
    subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "export", "--run_name=old", "--output_dir=out",
                    f"--format={fmt}", f"--output={target.relative_to(out)}"], cwd=out, check=True)
