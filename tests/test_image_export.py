"""Images in exports: a real run whose tools made and saw pictures (loopback doubles of the image
provider and the vision model) exported in TRL's vision layout, inline, by reference or dropped, and
loaded with `datasets` as pictures; what a damaged run directory or the size cap does to a row."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import CLI, read_jsonl, tool_results_in, write_jsonl
from tests.media_doubles import MediaDouble, bomb_png
from tests.scripted_model import ScriptedModel, script
from tests.test_export_and_view import export_cmd

datasets = pytest.importorskip("datasets")
Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two prompts that drew a picture each and looked at it, and one that only talked."""
    tmp = tmp_path_factory.mktemp("images")
    drew = [script({"calls": [["image_generate", {"prompt": f"a {colour} square", "aspect_ratio": shape}]]},
                   {"calls": [["terminal", {"command": "cp images/*.png pic.png"}]]},
                   {"calls": [["vision_analyze", {"image_url": "pic.png", "question": "Which colour?"}]]},
                   {"answer": "done"}, text=f"Draw {colour}.")
            for colour, shape in (("red", "portrait"), ("blue", "landscape"))]
    rows = [{"prompt": p} for p in drew] + [{"prompt": script({"answer": "no pictures"}, text="Just answer.")}]
    with ScriptedModel() as model, MediaDouble() as media:
        res = CLI(tmp, model).run("pics", write_jsonl(tmp / "d.jsonl", rows), toolsets="terminal,vision,image_gen",
                                  require_reasoning=False, vision_model="double-vision",
                                  vision_base_url=f"{media.base_url}/v1", image_provider="openai",
                                  image_base_url=f"{media.base_url}/v1", env={"IMAGE_API_KEY": "ik"})
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp, tmp / "out" / "pics"


def export(tmp: Path, output: str, *flags: str, run_dir: Path | None = None):
    out_dir = (run_dir or tmp / "out" / "pics").parent
    return export_cmd("export", f"--run_name={(run_dir or tmp / 'out' / 'pics').name}", f"--output_dir={out_dir}",
                      "--format=vision", f"--output={tmp / output}", *flags, cwd=tmp)


def refs_by_prompt(run_dir: Path) -> dict[str, list[dict]]:
    """Each record's image refs, in the order of its tool turns."""
    return {r["id"]: [i for t in tool_results_in(r) for i in t["images"] or []]
            for r in read_jsonl(run_dir / "trajectories.jsonl")}


def image_parts(row) -> int:
    return sum(1 for m in row["messages"] for p in m["content"] if p["type"] == "image")


def test_a_run_s_pictures_load_in_datasets_as_pictures_in_trl_s_vision_layout(run):
    tmp, run_dir = run
    for output in ("v.parquet", "v_ds", "v.jsonl"):
        res = export(tmp, output)
        assert res.returncode == 0 and "3 trajectories exported" in res.stderr, res.stderr[-3000:]
    refs = refs_by_prompt(run_dir)
    parquet = datasets.load_dataset("parquet", data_files=str(tmp / "v.parquet"))["train"]
    on_disk = datasets.load_from_disk(str(tmp / "v_ds"))
    assert isinstance(parquet.features["images"].feature, datasets.Image) and parquet.features == on_disk.features
    sizes = set()
    for table in (parquet, on_disk):
        for row in table:
            # the picture drawn, then the same picture given to vision: two parts, two images, in order
            assert image_parts(row) == len(row["images"]) == len(refs[row["id"]])
            for picture, ref in zip(row["images"], refs[row["id"]], strict=True):
                assert isinstance(picture, Image.Image)  # a decoded picture, not a path or bytes
                assert picture.size == Image.open(run_dir / "images" / f"{ref['sha256']}.png").size
                sizes.add(picture.size)
            for m in row["messages"]:  # every message opens with its text, as the model read it
                assert m["content"][0]["type"] == "text" and m["content"][0]["text"] is not None
    assert sizes == {(64, 96), (96, 64)}  # portrait and landscape, as drawn
    assert sum(len(r) for r in refs.values()) == 4 and sum(1 for r in refs.values() if not r) == 1
    # JSON lines: data: URLs of the very bytes the run kept
    for line in read_jsonl(tmp / "v.jsonl"):
        assert image_parts(line) == len(line["images"]) == len(refs[line["id"]])
        for url, ref in zip(line["images"], refs[line["id"]], strict=True):
            head, data = url.split(",", 1)
            assert head == "data:image/png;base64" and hashlib.sha256(base64.b64decode(data)).hexdigest() == ref["sha256"]
    # rows that train as they read: the openai row's messages, with the same text
    openai = export_cmd("export", "--run_name=pics", f"--output_dir={tmp / 'out'}", f"--output={tmp / 'o.jsonl'}",
                        cwd=tmp)
    assert openai.returncode == 0, openai.stderr
    text = {r["id"]: [m["content"] for m in r["messages"]] for r in read_jsonl(tmp / "o.jsonl")}
    for line in read_jsonl(tmp / "v.jsonl"):
        assert [m["content"][0]["text"] for m in line["messages"]] == text[line["id"]]


def test_images_by_reference_or_dropped(run):
    tmp, run_dir = run
    assert export(tmp, "r.parquet", "--images=reference").returncode == 0
    assert export(tmp, "d.jsonl", "--images=drop").returncode == 0
    refs = refs_by_prompt(run_dir)
    raw = datasets.load_dataset("parquet", data_files=str(tmp / "r.parquet"))["train"].cast_column(
        "images", datasets.Sequence(datasets.Image(decode=False)))
    for row in raw:
        assert [Path(i["path"]) for i in row["images"]] == [run_dir.resolve() / "images" / f"{r['sha256']}.png"
                                                             for r in refs[row["id"]]]
        assert all(i["bytes"] is None for i in row["images"])  # a path, not a copy
    decoded = datasets.load_dataset("parquet", data_files=str(tmp / "r.parquet"))["train"]
    assert sorted(p.size for row in decoded for p in row["images"]) == [(64, 96), (64, 96), (96, 64), (96, 64)]
    for line in read_jsonl(tmp / "d.jsonl"):
        assert line["images"] == [] and image_parts(line) == 0


def test_an_image_over_the_cap_is_named_not_inlined(run):
    tmp, _ = run
    res = export(tmp, "c.jsonl", "--max_image_bytes=64")
    assert res.returncode == 0 and "4 images over --max_image_bytes named, not inlined" in res.stderr, res.stderr
    for line in read_jsonl(tmp / "c.jsonl"):
        assert line["images"] == [] and image_parts(line) == 0
    named = [p["text"] for line in read_jsonl(tmp / "c.jsonl") for m in line["messages"] for p in m["content"][1:]]
    assert len(named) == 4 and all("not inlined: over --max_image_bytes" in n for n in named)


def test_a_row_whose_image_is_gone_or_changed_is_left_out_and_said(run, tmp_path):
    tmp, run_dir = run
    copy = tmp_path / "out" / "pics"
    shutil.copytree(run_dir, copy)
    refs = refs_by_prompt(copy)
    damaged, missing = [rid for rid, r in refs.items() if r]
    (copy / "images" / f"{refs[damaged][0]['sha256']}.png").write_bytes(b"\x89PNG\r\n\x1a\nnot the picture")
    (copy / "images" / f"{refs[missing][0]['sha256']}.png").unlink()
    for mode in ("inline", "reference"):
        res = export(tmp_path, f"{mode}.jsonl", f"--images={mode}", run_dir=copy)
        assert res.returncode == 0, res.stderr
        assert res.stderr.count("no longer holds as it was") == 2, res.stderr
        written = {r["id"] for r in read_jsonl(tmp_path / f"{mode}.jsonl")}
        assert missing not in written and damaged not in written  # a path is read and checked, as a loader reads it
        assert f"{len(written)} trajectories exported" in res.stderr


def test_an_image_whose_header_states_more_pixels_than_a_loader_takes_is_left_out_and_said(run, tmp_path):
    """From a review: a 69-byte PNG whose header says 30000×30000 was inlined by --format=vision, and
    the trainer's loader raised DecompressionBombError on the export."""
    tmp, run_dir = run
    copy = tmp_path / "out" / "pics"
    shutil.copytree(run_dir, copy)
    bomb = bomb_png()
    (copy / "images" / f"{hashlib.sha256(bomb).hexdigest()}.png").write_bytes(bomb)
    records = read_jsonl(copy / "trajectories.jsonl")
    edited = next(r for r in records if any(t["images"] for t in tool_results_in(r)))
    next(t for t in tool_results_in(edited) if t["images"])["images"] = [
        {"sha256": hashlib.sha256(bomb).hexdigest(), "mime": "image/png", "bytes": len(bomb)}]
    (copy / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (copy / ".merged.json").unlink(missing_ok=True)
    for mode in ("inline", "reference"):
        res = export(tmp_path, f"{mode}.parquet", f"--images={mode}", run_dir=copy)
        assert res.returncode == 0 and "states 30000x30000 pixels, more than 40,000,000" in res.stderr, res.stderr
        loaded = datasets.load_dataset("parquet", data_files=str(tmp_path / f"{mode}.parquet"))["train"]
        assert edited["id"] not in loaded["id"] and len(loaded) == len(records) - 1
        assert sum(len(row["images"]) for row in loaded) == 2  # the others' pictures, decoded as a trainer decodes them


def test_images_is_refused_for_a_text_format(run):
    tmp, _ = run
    res = export_cmd("export", "--run_name=pics", f"--output_dir={tmp / 'out'}", f"--output={tmp / 'x.jsonl'}",
                     "--images=inline", cwd=tmp)
    assert res.returncode != 0 and "--images is for --format=vision" in res.stderr, res.stderr
    assert not (tmp / "x.jsonl").exists()
    res = export(tmp, "y.jsonl", "--images=sometimes")
    assert res.returncode != 0 and "images" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_the_report_shows_the_pictures_in_headless_chromium(run, tmp_path):
    from tests.test_export_and_view import CHROMIUM, opened_in_chromium

    assert CHROMIUM, "the report is checked in a real Chromium (apt-get install chromium)"
    tmp, run_dir = run
    page = tmp_path / "report.html"
    res = export_cmd("view", "--run_name=pics", f"--output_dir={tmp / 'out'}", f"--output={page}", cwd=tmp)
    assert res.returncode == 0, res.stderr[-2000:]
    rec = next(r for r in read_jsonl(run_dir / "trajectories.jsonl") if r["prompt_index"] == 0)
    names = [f"images/{i['sha256']}.png" for t in tool_results_in(rec) for i in t["images"] or []]
    dom = opened_in_chromium(page, rec["id"], tmp_path / "profile")
    detail = dom.split('id="detail"', 1)[1]
    # each picture decoded in the page itself (its size read by the browser once it loaded), no file beside it
    assert detail.count('<img class="shot"') == 2, detail[:3000]
    for name in names:
        assert f'title="64×96 · {name}"' in detail, detail[:3000]
    assert '<div id="errors"></div>' in dom


def test_a_record_whose_image_refs_were_edited_exports_and_shows_without_a_traceback(run, tmp_path):
    tmp, run_dir = run
    copy = tmp_path / "out" / "pics"
    shutil.copytree(run_dir, copy)
    records = read_jsonl(copy / "trajectories.jsonl")
    edited = next(r for r in records if any(t["images"] for t in tool_results_in(r)))
    tools = [t for t in tool_results_in(edited) if t["images"]]
    tools[0]["images"] = "not a list"
    tools[1]["images"] = [{**tools[1]["images"][0], "bytes": -1}]
    (copy / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (copy / ".merged.json").unlink(missing_ok=True)
    res = export(tmp_path, "e.jsonl", run_dir=copy)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert edited["id"] not in {r["id"] for r in read_jsonl(tmp_path / "e.jsonl")}  # a bad ref leaves its row out
    page = tmp_path / "r.html"
    res = export_cmd("view", "--run_name=pics", f"--output_dir={tmp_path / 'out'}", f"--output={page}", cwd=tmp_path)
    assert res.returncode == 0 and "Traceback" not in res.stderr and page.exists(), res.stderr
