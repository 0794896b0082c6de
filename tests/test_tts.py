"""text_to_speech (the opt-in tts toolset) through the real runner: espeak-ng inside the local jail
and a Docker container, speaking for real; an OpenAI-compatible speech endpoint at a loopback double;
what a run without a voice refuses."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct

import pytest

from tests.conftest import read_jsonl, tool_results_in, write_jsonl
from tests.media_doubles import MediaDouble, wav
from tests.scripted_model import script

BROWSER_IMAGE = os.environ.get("HERMES_BATCH_BROWSER_IMAGE", "hermes-batch-browser:bookworm")


def results(record: dict) -> list:
    return [json.loads(t["content"]) if t["content"].startswith("{") else t["content"] for t in tool_results_in(record)]


def wav_seconds(header_and_data: bytes) -> float:
    assert header_and_data[:4] == b"RIFF" and header_and_data[8:12] == b"WAVE", header_and_data[:16]
    channels, rate = struct.unpack("<HI", header_and_data[22:28])
    bits = struct.unpack("<H", header_and_data[34:36])[0]
    return (len(header_and_data) - 44) / (rate * channels * bits // 8)


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_espeak_speaks_inside_the_sandbox_and_the_text_is_never_an_option(cli, tmp_path, backend):
    from tests.backend_harness import docker_status, unavailable

    on: dict = {"backend": backend}
    if backend == "local" and not shutil.which("espeak-ng"):
        unavailable("espeak", "no espeak-ng on this machine (apt-get install espeak-ng)")
    if backend == "docker":
        if why := docker_status():
            unavailable("docker", why)
        on["image"] = BROWSER_IMAGE
    prompt = script(
        {"calls": [["text_to_speech", {"text": "Hello from inside the sandbox. " * 3}]]},
        {"calls": [["text_to_speech", {"text": "-w /tmp/owned.wav --help", "output_path": "speech/flags.wav"}]]},
        {"calls": [["text_to_speech", {"text": "hi", "output_path": "../outside.wav"}]]},
        {"calls": [["text_to_speech", {"text": "hi", "output_path": "speech/hi.mp3"}]]},
        {"calls": [["terminal", {"command": "ls speech audio; test -e /tmp/owned.wav && echo OWNED; "
                                            "python3 -c \"import sys; print(open(sys.argv[1],'rb').read(4))\" speech/flags.wav"}]]},
        {"answer": "spoken"})
    res = cli.run("speak", write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt}]), toolsets="terminal,tts",
                  require_reasoning=False, **on)
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("speak") / "trajectories.jsonl")
    spoken, flags, outside, mp3, listing = results(record)
    assert spoken["success"] and re.fullmatch(r"/workspace/audio/[0-9a-f]{16}\.wav", spoken["file_path"]), spoken
    assert spoken["mime"] == "audio/wav" and spoken["bytes"] > 50_000  # seconds of real speech, not a header
    assert flags["success"] and flags["file_path"] == "/workspace/speech/flags.wav", flags
    assert "outside the work directory" in outside["error"]
    assert "espeak-ng writes WAV" in mp3["error"]
    assert "OWNED" not in listing["output"] and "b'RIFF'" in listing["output"], listing  # the flags were said, not obeyed
    assert record["tool_stats"]["text_to_speech"] == {"count": 4, "success": 2, "failure": 2}
    assert record["toolsets_used"] == ["terminal", "tts"]


def test_a_sandbox_without_espeak_says_so(cli, tmp_path):
    from tests.backend_harness import TEST_IMAGE, docker_status, unavailable

    if why := docker_status():
        unavailable("docker", why)
    prompt = script({"calls": [["text_to_speech", {"text": "hello"}]]}, {"answer": "{last_tool}"})
    res = cli.run("mute", write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt}]), toolsets="tts",
                  require_reasoning=False, backend="docker", image=TEST_IMAGE)
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("mute") / "trajectories.jsonl")
    assert "no espeak-ng in this sandbox's image (apt-get install espeak-ng)" in results(record)[0]["error"]


def test_an_openai_compatible_speech_endpoint_speaks_into_the_sandbox(cli, tmp_path):
    prompt = script(
        {"calls": [["text_to_speech", {"text": "Read this aloud."}]]},
        {"calls": [["text_to_speech", {"text": "And this.", "output_path": "out/this.wav"}]]},
        {"calls": [["terminal", {"command": "sha256sum audio/*.mp3 out/this.wav | cut -c1-64"}]]},
        {"answer": "done"})
    with MediaDouble() as double:
        res = cli.run("openai-tts", write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt}]), toolsets="terminal,tts",
                      require_reasoning=False, tts_provider="openai", tts_base_url=f"{double.base_url}/v1",
                      tts_voice="nova", env={"TTS_API_KEY": "tk", "OPENAI_API_KEY": "not-for-this-endpoint"})
        requests = double.requests
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("openai-tts") / "trajectories.jsonl")
    mp3, this, sums = results(record)
    assert mp3["mime"] == "audio/mpeg" and mp3["file_path"].endswith(".mp3") and this["mime"] == "audio/wav"
    first, second = requests
    assert first["body"] == {"model": "gpt-4o-mini-tts", "input": "Read this aloud.", "voice": "nova",
                             "response_format": "mp3"}
    assert second["body"]["response_format"] == "wav" and first["headers"]["Authorization"] == "Bearer tk"
    import hashlib

    assert sums["output"].split() == [hashlib.sha256(b"mp3:Read this aloud.").hexdigest(),
                                      hashlib.sha256(wav(100 * len("And this."))).hexdigest()]  # the bytes, in the sandbox
    assert "test-key" not in json.dumps(requests)  # the run's own key stays with the run's model


def test_a_run_without_a_voice_refuses_tts_before_any_model_call(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p"}])
    res = cli.run("nokey", data, toolsets="tts", tts_provider="openai", tts_base_url="http://127.0.0.1:9/v1",
                  env={"TTS_API_KEY": "", "OPENAI_API_KEY": "only-for-openai"})
    assert res.returncode == 1 and "--toolsets includes tts, but --tts_provider=openai needs TTS_API_KEY" in res.stderr, \
        res.stderr[-2000:]
    assert cli.model.requests == []


@pytest.mark.skipif(os.environ.get("HERMES_BATCH_MEDIA_REAL") != "1"
                    or not (os.environ.get("TTS_API_KEY") or os.environ.get("OPENAI_API_KEY")),
                    reason="the real OpenAI speech service is not configured here: set HERMES_BATCH_MEDIA_REAL=1 and "
                           "TTS_API_KEY or OPENAI_API_KEY")
def test_against_the_real_speech_service(cli, tmp_path):
    prompt = script({"calls": [["text_to_speech", {"text": "Hello.", "output_path": "hello.wav"}]]},
                    {"calls": [["terminal", {"command": "head -c 4 hello.wav"}]]}, {"answer": "done"})
    res = cli.run("real-tts", write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt}]), toolsets="terminal,tts",
                  require_reasoning=False, tts_provider="openai", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("real-tts") / "trajectories.jsonl")
    spoken, head = results(record)
    assert spoken["success"] and spoken["bytes"] > 1000 and head["output"] == "RIFF", (spoken, head)
