"""`text_to_speech` (the opt-in `tts` toolset, as the reference's): text spoken into an audio file in
the prompt's work directory (`audio/` unless the model names a path); the answer is its path there.

- `espeak` (the default, offline): Debian's `espeak-ng` run inside the sandbox as the prompt's user,
  the text on its standard input (never read as one of its options); a WAV file.
- `openai`: any OpenAI-compatible `/audio/speech` (`--tts_base_url`, `--tts_model`, `--tts_voice`),
  the audio written into the sandbox.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shlex
import shutil
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..flags import flag
from .base import ToolContext, ToolError, ToolResult, confine
from .toolset import Opening, Toolset

MAX_TEXT = 4096  # characters one call speaks (OpenAI's own limit)
MAX_AUDIO_BYTES = 25 * 1024 * 1024
SPEAK_TIMEOUT = 120.0
DEFAULTS = {"openai": ("https://api.openai.com/v1", "gpt-4o-mini-tts", "alloy")}
KEY_VARIABLES = ("TTS_API_KEY", "OPENAI_API_KEY")  # OPENAI_API_KEY only for OpenAI's own endpoint
FORMATS = {".wav": ("wav", "audio/wav"), ".mp3": ("mp3", "audio/mpeg"), ".flac": ("flac", "audio/flac"),
           ".opus": ("opus", "audio/ogg"), ".aac": ("aac", "audio/aac")}

# the text arrives as "$1", the file as "$2": printf hands the text over as data, espeak-ng writes the file
_ESPEAK = r'''command -v espeak-ng >/dev/null 2>&1 || { echo "no espeak-ng in this sandbox's image (apt-get install espeak-ng)" >&2; exit 97; }
mkdir -p -- "$(dirname -- "$2")" && printf '%s' "$1" | espeak-ng --stdin -w "$2" && wc -c < "$2"
'''


class Espeak:
    extension = ".wav"

    def describe(self) -> str:
        return "espeak-ng"

    async def speak(self, text: str, path: str, ctx: ToolContext) -> int:
        """Writes `path` in the sandbox; its size."""
        if not path.endswith(".wav"):
            raise ToolError("espeak-ng writes WAV audio: give output_path a .wav name")
        sandbox = await ctx.get_sandbox()
        res = await sandbox.exec(f"set -- {shlex.quote(text)} {shlex.quote(path)}\n{_ESPEAK}", language="shell",
                                 timeout=SPEAK_TIMEOUT)
        if res.exit_code == 97:
            raise ToolError(res.stderr.strip())
        if res.timed_out:
            raise ToolError(f"espeak-ng did not finish within {SPEAK_TIMEOUT:g} s")
        if res.exit_code != 0 or not res.stdout.strip().isdigit():
            raise ToolError(f"espeak-ng failed: {(res.stderr or res.stdout).strip()[-300:]}")
        return int(res.stdout.strip())


class OpenAISpeech:
    extension = ".mp3"

    def __init__(self, base_url: str | None, model: str | None, voice: str | None, api_key: str | None, http: Any):
        default_url, default_model, default_voice = DEFAULTS["openai"]
        self.base, self.model = (base_url or default_url).rstrip("/"), model or default_model
        self.voice, self.http = voice or default_voice, http
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}

    def describe(self) -> str:
        return f"{self.model} ({self.voice})"

    async def speak(self, text: str, path: str, ctx: ToolContext) -> int:
        fmt = FORMATS.get(posixpath.splitext(path)[1].lower())
        if fmt is None:
            raise ToolError(f"output_path must end in one of {', '.join(FORMATS)}")
        body = {"model": self.model, "input": text, "voice": self.voice, "response_format": fmt[0]}
        audio = bytearray()
        try:
            async with self.http.stream("POST", f"{self.base}/audio/speech", headers=self.headers, json=body) as res:
                if res.status_code >= 400:
                    raise ToolError(f"the speech endpoint answered HTTP {res.status_code}: "
                                    f"{(await res.aread())[:300].decode(errors='replace')}")
                async for chunk in res.aiter_bytes():
                    audio += chunk
                    if len(audio) > MAX_AUDIO_BYTES:
                        raise ToolError(f"the speech endpoint answered with more than {MAX_AUDIO_BYTES} bytes of audio")
        except ToolError:
            raise
        except Exception as exc:
            raise ToolError(f"the speech endpoint could not be reached: {type(exc).__name__}: {exc}") from None
        if not audio:
            raise ToolError("the speech endpoint answered with no audio")
        sandbox = await ctx.get_sandbox()
        await sandbox.write_file(path, bytes(audio))
        return len(audio)


def make_speech(provider: str, base_url: str | None, model: str | None, voice: str | None, api_key: str | None,
                http: Any) -> Espeak | OpenAISpeech:
    return Espeak() if provider == "espeak" else OpenAISpeech(base_url, model, voice, api_key, http)


class SpeechArgs(BaseModel):
    text: str = Field(min_length=1, max_length=MAX_TEXT, description="What to say.")
    output_path: str | None = Field(None, description="Where to save the audio, in your work directory (default: "
                                                      "audio/<name>; .wav, or the endpoint's format).")


class TextToSpeechTool:
    name = "text_to_speech"
    toolset = "tts"
    description = ("Speak a text aloud into an audio file in your work directory. Returns JSON {success, file_path, "
                   "mime, bytes}.")
    Args = SpeechArgs

    async def run(self, args: SpeechArgs, ctx: ToolContext) -> ToolResult:
        speech = ctx.toolsets.get("tts")
        if speech is None:
            raise ToolError("text_to_speech is unavailable: no speech provider is configured for this run")
        wanted = args.output_path or f"audio/{hashlib.sha256(args.text.encode()).hexdigest()[:16]}{speech.extension}"
        _, path = await confine(ctx, wanted)  # `audio` may be the agent's link
        size = await speech.speak(args.text, path, ctx)
        mime = FORMATS.get(posixpath.splitext(path)[1].lower(), ("", "application/octet-stream"))[1]
        return ToolResult(True, json.dumps({"success": True, "file_path": path, "mime": mime, "bytes": size}),
                          structured=True)


def speech_key(base_url: str | None) -> str | None:
    """The speech endpoint's key, from the environment: OPENAI_API_KEY only for OpenAI's own endpoint."""
    names = KEY_VARIABLES[:1 if base_url else None]
    return next((os.environ[v] for v in names if os.environ.get(v)), None)


class TtsSettings(BaseModel):
    tts_provider: Literal["espeak", "openai"] = flag(
        "espeak", "text_to_speech's provider (the tts toolset, offered only when asked for: --toolsets=...,tts): "
                  "espeak (espeak-ng in the sandbox, offline) or openai, any /audio/speech (key in TTS_API_KEY, else "
                  "OPENAI_API_KEY at OpenAI's own)")
    tts_base_url: str | None = flag(None, "the speech endpoint (default: https://api.openai.com/v1)")
    tts_model: str | None = flag(None, "the speech model (default: gpt-4o-mini-tts)")
    tts_voice: str | None = flag(None, "the speech voice (default: alloy)")


class Tts(Toolset):
    name = "tts"
    tools = (TextToSpeechTool(),)
    Settings = TtsSettings
    opt_in = True  # as in the reference: offered when asked for by name, in no distribution

    def why_not(self, config: Any) -> str | None:
        if config.tts_provider == "openai" and not speech_key(config.tts_base_url):
            return f"--tts_provider=openai needs {' or '.join(KEY_VARIABLES[:1 if config.tts_base_url else None])}"
        if config.tts_provider == "espeak" and config.backend == "local" and not shutil.which("espeak-ng"):
            return "no espeak-ng on this machine for the local sandboxes (apt-get install espeak-ng)"
        return None

    def fingerprint(self, config: Any, use: str) -> dict[str, Any]:
        if use != "offered":  # who spoke (only when offered: older runs keep theirs)
            return {}
        return {"tts": [config.tts_provider, config.tts_model, config.tts_voice] if config.tts_provider == "openai"
                else config.tts_provider}

    def keys(self, config: Any) -> dict[str, str]:
        key = speech_key(config.tts_base_url) if config.tts_provider == "openai" else None
        return {"tts": key} if key else {}

    async def open(self, opening: Opening) -> Any:
        config = opening.config
        return make_speech(config.tts_provider, config.tts_base_url, config.tts_model, config.tts_voice,
                           opening.keys.get("tts"), opening.http)
