"""vision_analyze and image_generate against loopback doubles of the vision model and of both image
providers (answering deterministically), through the real runner; and what a run refuses."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re

import pytest

from tests.conftest import read_jsonl, tool_results_in, write_jsonl
from tests.media_doubles import MediaDouble, bomb_png, png
from tests.scripted_model import script


@pytest.fixture()
def double():
    with MediaDouble() as d:
        yield d


def tool_results(record: dict) -> list:
    out = []
    for turn in record["conversations"]:
        if turn["from"] == "tool":
            for body in re.findall(r"<tool_response>\n(.*?)\n</tool_response>", turn["value"], re.S):
                out.append(json.loads(body)["content"])
    return out


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_a_picture_is_made_into_the_sandbox_and_the_vision_model_sees_its_bytes(cli, tmp_path, double, backend):
    from tests.backend_harness import TEST_IMAGE, docker_status, unavailable

    on = {"backend": backend}
    if backend == "docker":
        if why := docker_status():
            unavailable("docker", why)
        on["image"] = TEST_IMAGE
    prompt = script(
        {"calls": [["image_generate", {"prompt": "a red square", "aspect_ratio": "portrait"}]]},
        {"calls": [["terminal", {"command": "cp images/*.png pic.png && sha256sum pic.png | cut -c1-16"}]]},
        {"calls": [["vision_analyze", {"image_url": "pic.png", "question": "What colour is it?"}]]},
        {"calls": [["image_generate", {"prompt": "the same in green", "aspect_ratio": "square", "image_url": "pic.png"}]]},
        {"answer": "{last_tool}"})
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt}])
    res = cli.run("media", data, toolsets="terminal,vision,image_gen", require_reasoning=False, **on,
                  vision_model="double-vision", vision_base_url=f"{double.base_url}/v1", image_provider="openai",
                  image_base_url=f"{double.base_url}/v1", env={"IMAGE_API_KEY": "ik", "VISION_API_KEY": "vk"})
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("media") / "trajectories.jsonl")
    made, copied, seen, edited = tool_results(record)
    assert made["success"] and re.fullmatch(r"/workspace/images/[0-9a-f]{16}\.png", made["image_path"]), made
    assert made["mime"] == "image/png"
    sha = copied["output"]
    assert seen["success"] and f"sha256={sha}" in seen["analysis"], (seen, sha)  # the bytes it drew, through the sandbox
    assert "size=64x96" in seen["analysis"] and "question: What colour is it?" in seen["analysis"]
    assert edited["success"] and edited["image_path"] != made["image_path"]
    gen, vision, edit = double.requests
    assert gen["path"] == "/v1/images/generations" and gen["body"]["size"] == "1024x1536"
    assert gen["headers"]["Authorization"] == "Bearer ik" and vision["headers"]["Authorization"] == "Bearer vk"
    assert vision["body"]["model"] == "double-vision" and vision["body"]["temperature"] == 0.1
    assert edit["path"] == "/v1/images/edits" and edit["body"]["images_given"] == 1
    assert sorted(record["toolsets_used"]) == ["image_gen", "terminal", "vision"]
    assert "test-key" not in json.dumps(double.requests)  # the run's own key went to neither
    # each picture is kept once in the run directory, by its hash; the tool turns name them, the text stays text
    made_ref, seen_ref, edited_ref = [t["images"][0] for t in tool_results_in(record) if t["images"]]
    assert made_ref == seen_ref and made_ref["sha256"].startswith(sha) and edited_ref != made_ref
    kept = sorted(p.name for p in (cli.run_dir("media") / "images").iterdir())
    assert kept == sorted(f"{r['sha256']}.png" for r in (made_ref, edited_ref))
    for r in (made_ref, edited_ref):
        data = (cli.run_dir("media") / "images" / f"{r['sha256']}.png").read_bytes()
        assert hashlib.sha256(data).hexdigest() == r["sha256"] and len(data) == r["bytes"]
    assert all("base64" not in t["value"] for t in record["conversations"])


def test_fal_answers_with_a_data_url_and_the_picture_keeps_its_shape(tmp_path, double):
    from hermes_batch.tools.image_gen import make_provider

    async def main():
        import httpx

        async with httpx.AsyncClient() as http:
            fal = make_provider("fal", f"{double.base_url}/fal", None, "fk", http, None)
            return await fal.generate("a blue sky", "landscape", [])

    picture = asyncio.run(main())
    assert picture == png(64, 48, (20, 20, 220))
    [req] = double.requests
    assert req["path"] == "/fal/fal-ai/flux/dev" and req["headers"]["Authorization"] == "Key fk"
    assert req["body"]["sync_mode"] is True and req["body"]["image_size"] == "landscape_4_3"


def test_images_are_read_by_their_bytes_bounded_and_converted(tmp_path):
    from hermes_batch.tools import ToolContext, ToolError
    from hermes_batch.tools.media import MAX_IMAGE_BYTES, as_image, load_image
    from hermes_batch.tools.netguard import guarded_client

    red = png(4, 3, (255, 0, 0))
    assert as_image(red, "x").mime == "image/png"
    with pytest.raises(ToolError, match="SVG drawing; render it to PNG"):
        as_image(b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"/>', "a.svg")
    with pytest.raises(ToolError, match="is not an image"):
        as_image(b"hello", "notes.txt")
    with pytest.raises(ToolError, match="larger than 20 MB"):
        as_image(b"\x89PNG\r\n\x1a\n" + b"\0" * MAX_IMAGE_BYTES, "big.png")
    import io

    from PIL import Image as Pillow  # BMP: converted to PNG, the same pixels

    bmp = io.BytesIO()
    Pillow.new("RGB", (5, 2), (0, 0, 255)).save(bmp, format="BMP")
    converted = as_image(bmp.getvalue(), "a.bmp")
    assert converted.mime == "image/png" and Pillow.open(io.BytesIO(converted.data)).size == (5, 2)

    async def load(ref):
        async with guarded_client() as fetch:
            ctx = ToolContext(get_sandbox=None, fetch_http=fetch)  # type: ignore[arg-type]
            return await load_image(ref, ctx)

    assert asyncio.run(load("data:image/png;base64," + base64.b64encode(red).decode())).data == red
    with pytest.raises(ToolError, match="internal address"):  # the host's loopback is never fetched
        asyncio.run(load("http://127.0.0.1:9/x.png"))
    with pytest.raises(ToolError, match="internal address"):
        asyncio.run(load("http://169.254.169.254/latest/meta-data/"))


def test_an_image_whose_header_states_too_many_pixels_or_none_is_refused_unread():
    """From a review: a 69-byte PNG whose header says 30000×30000 passed the image check (its magic
    bytes only), to be inlined by an export and refused by the trainer's loader. Each format's
    header is read as Pillow reads it, and nothing past it."""
    import io
    import struct

    from PIL import Image as Pillow

    from hermes_batch.tools import ToolError
    from hermes_batch.tools.media import as_image
    from hermes_batch.util.image_size import dimensions

    assert len(bomb_png()) < 70
    with pytest.raises(Pillow.DecompressionBombError):
        Pillow.open(io.BytesIO(bomb_png()))  # what a trainer's loader does with it
    for size in ((1, 1), (37, 5), (300, 1201)):
        for fmt, options in (("PNG", {}), ("JPEG", {"exif": Pillow.Exif()}), ("GIF", {}), ("WEBP", {}),
                             ("WEBP", {"lossless": True}), ("BMP", {})):
            out = io.BytesIO()
            Pillow.new("RGB", size, (200, 10, 10)).save(out, format=fmt, **options)
            assert dimensions(out.getvalue()) == Pillow.open(out).size == size, (fmt, options)
            assert as_image(out.getvalue(), "x").data
        out = io.BytesIO()
        Pillow.new("RGBA", size, (1, 2, 3, 4)).save(out, format="WEBP", exif=b"Exif\0\0")  # an extended header (VP8X)
        assert out.getvalue()[12:16] == b"VP8X" and dimensions(out.getvalue()) == size

    def sof(w, h):  # a JPEG frame header
        return b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, h, w, 1) + b"\x01\x11\x00"

    bombs = {
        "a PNG": bomb_png(),
        "a JPEG": b"\xff\xd8\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0" + b"\0" * 9 + sof(30000, 30000),
        "a GIF": b"GIF89a" + struct.pack("<HHBBB", 30000, 30000, 0, 0, 0) + b";",
        "a GIF frame beyond its screen": (b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0, 0, 0)
                                          + b"!\xf9\x04\x00\x00\x00\x00\x00" + b","
                                          + struct.pack("<HHHHB", 0, 0, 30000, 30000, 0)),
        "a WebP": b"RIFF" + struct.pack("<I", 22) + b"WEBPVP8X" + struct.pack("<I", 10) + b"\0" * 4
                  + (29999).to_bytes(3, "little") * 2,
        "a BMP": b"BM" + b"\0" * 12 + struct.pack("<Iii", 40, 30000, -30000),
    }
    for name, data in bombs.items():
        assert dimensions(data) == (30000, 30000), name
        with pytest.raises(ToolError, match="states 30000x30000 pixels, more than 40,000,000"):
            as_image(data, name)
    for cut in (b"\x89PNG\r\n\x1a\n" + b"\0" * 20, b"\xff\xd8\xff\xda\0\x02", b"RIFF\0\0\0\0WEBPVP8 "):
        with pytest.raises(ToolError, match="states no width and height"):
            as_image(cut, "a cut image")


def test_a_toolset_without_its_model_or_key_is_refused_or_left_out_and_said(cli, tmp_path, double):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p"}])
    res = cli.run("novision", data, toolsets="terminal,vision")
    assert res.returncode == 1 and "--toolsets includes vision, but no vision model is configured" in res.stderr
    res = cli.run("nofal", data, toolsets="image_gen", image_provider="fal", env={"FAL_KEY": ""})
    assert res.returncode == 1 and "--image_provider=fal needs FAL_KEY" in res.stderr
    dist = tmp_path / "seeing.toml"
    dist.write_text('description = "d"\n[toolsets]\nterminal = 100\nvision = 100\nimage_gen = 100\n')
    res = cli.run("leftout", data, distribution=str(dist), require_reasoning=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "offers no vision tools in this run: no vision model" in res.stderr
    assert "offers no image_gen tools in this run: no image provider" in res.stderr
    [record] = read_jsonl(cli.run_dir("leftout") / "trajectories.jsonl")
    assert record["toolsets_used"] == ["terminal"]
    stats = json.loads((cli.run_dir("leftout") / "statistics.json").read_text())
    assert stats["toolsets_left_out"] == ["image_gen", "vision"]


REAL = {  # opt-in: each real service, with its key
    "openai-images": ("IMAGE_API_KEY", "OPENAI_API_KEY"),
    "fal": ("FAL_KEY",),
    "vision": ("VISION_API_KEY",),
}


@pytest.mark.parametrize("service", sorted(REAL))
def test_against_the_real_service(service, tmp_path):
    import os

    key = next((os.environ[v] for v in REAL[service] if os.environ.get(v)), None)
    if os.environ.get("HERMES_BATCH_MEDIA_REAL") != "1" or not key:
        pytest.skip(f"the real {service} service is not configured here: set HERMES_BATCH_MEDIA_REAL=1 and "
                    f"{' or '.join(REAL[service])} (vision: also HERMES_BATCH_VISION_MODEL and VISION_BASE_URL)")
    import httpx

    from hermes_batch.tools.image_gen import make_provider
    from hermes_batch.tools.media import as_image
    from hermes_batch.tools.vision import VisionClient

    async def main():
        async with httpx.AsyncClient(timeout=180) as http:
            if service == "vision":
                client = VisionClient(os.environ["VISION_BASE_URL"], os.environ["HERMES_BATCH_VISION_MODEL"], key, http)
                return await client.describe(as_image(png(32, 32, (220, 20, 20)), "red"), "What colour is this square?")
            provider = make_provider("openai" if service == "openai-images" else "fal", None, None, key, http, None)
            return as_image(await provider.generate("a small red circle on white", "square", []), "made").mime

    answer = asyncio.run(main())
    assert ("red" in answer.lower()) if service == "vision" else answer in ("image/png", "image/jpeg", "image/webp")


def test_the_runs_own_key_goes_to_no_other_endpoint(cli, tmp_path, double):
    """Without VISION_API_KEY, a vision model elsewhere than --base_url is asked with no key (the run's
    went there, as did OPENAI_API_KEY to any --image_base_url)."""
    prompt = script({"calls": [["image_generate", {"prompt": "red"}]]},
                    {"calls": [["terminal", {"command": "cp images/*.png p.png"}]]},
                    {"calls": [["vision_analyze", {"image_url": "p.png", "question": "q"}]]}, {"answer": "done"})
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt}])
    res = cli.run("keys", data, toolsets="terminal,vision,image_gen", require_reasoning=False,
                  vision_model="v", vision_base_url=f"{double.base_url}/v1", image_provider="openai",
                  image_base_url=f"{double.base_url}/v1",
                  env={"VISION_API_KEY": "", "IMAGE_API_KEY": "", "OPENAI_API_KEY": "sk-openai"})
    assert res.returncode == 1 and "--image_provider=openai needs IMAGE_API_KEY" in res.stderr, res.stderr[-2000:]
    res = cli.run("keys", data, toolsets="terminal,vision,image_gen", require_reasoning=False,
                  vision_model="v", vision_base_url=f"{double.base_url}/v1", image_provider="openai",
                  image_base_url=f"{double.base_url}/v1", env={"VISION_API_KEY": "", "IMAGE_API_KEY": "ik"})
    assert res.returncode == 0, res.stderr[-2000:]
    gen, vision = double.requests
    assert "Authorization" not in vision["headers"] and gen["headers"]["Authorization"] == "Bearer ik"


def test_with_vision_model_main_the_run_s_own_model_is_shown_the_image(cli, tmp_path, double):
    """--vision_model=main: no vision model is asked; the image goes to the run's own model in a message
    after the tool's answer (a tool message holds text only), and the record keeps the text and names
    the image as shown."""
    picture = png(5, 3, (20, 200, 20))
    prompt = script(
        {"calls": [["terminal", {"command": f"echo {base64.b64encode(picture).decode()} | base64 -d > pic.png"}]]},
        {"calls": [["vision_analyze", {"image_url": "pic.png", "question": "What colour?"}]]},
        {"answer": "green"})
    res = cli.run("native", write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt}]), toolsets="terminal,vision",
                  require_reasoning=False, vision_model="main")
    assert res.returncode == 0, res.stderr[-3000:]
    assert double.requests == []
    *_, answer, showing = cli.model.requests[-1]["messages"]
    assert answer["role"] == "tool" and json.loads(answer["content"]) == {
        "success": True, "question": "What colour?", "image": "shown after the tool results: look at it to answer"}
    assert showing["role"] == "user" and showing["content"][1]["image_url"]["url"] == \
        "data:image/png;base64," + base64.b64encode(picture).decode()
    assert all(isinstance(m["content"], str) for r in cli.model.requests for m in r["messages"] if m["role"] == "tool")
    [record] = read_jsonl(cli.run_dir("native") / "trajectories.jsonl")
    turn = tool_results_in(record)[-1]
    assert turn["content"] == answer["content"] and turn["images"] == [
        {"sha256": hashlib.sha256(picture).hexdigest(), "mime": "image/png", "bytes": len(picture), "shown": True}]
    assert [t["from"] for t in record["conversations"]].count("human") == 1  # the showing is the model's, not the data's
