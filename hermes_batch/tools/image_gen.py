"""`image_generate`: a picture made by the run's image provider (`--image_provider`), written
into the prompt's sandbox (`images/` in its work directory); the answer is its path there,
never a host path or an expiring URL.

- `openai`: any OpenAI-compatible `/images/generations` (`/images/edits` when images are given).
- `fal`: fal.ai's synchronous endpoint (`<base>/<model>`, `sync_mode`: the picture comes back in
  the answer as a `data:` URL).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import posixpath
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..flags import flag
from .base import Image, ToolContext, ToolError, ToolResult, confine
from .media import as_image, load_image
from .toolset import Opening, Toolset

MAX_REFERENCES = 4
OPENAI_SIZES = {"landscape": "1536x1024", "square": "1024x1024", "portrait": "1024x1536"}
FAL_SIZES = {"landscape": "landscape_4_3", "square": "square_hd", "portrait": "portrait_4_3"}
EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}
DEFAULTS = {"openai": ("https://api.openai.com/v1", "gpt-image-1"), "fal": ("https://fal.run", "fal-ai/flux/dev")}
KEY_VARIABLES = {"openai": ("IMAGE_API_KEY", "OPENAI_API_KEY"), "fal": ("FAL_KEY",)}


async def _answer(res: Any, who: str) -> Any:
    if res.status_code >= 400:
        raise ToolError(f"{who} answered HTTP {res.status_code}: {res.text[:300]}")
    try:
        return res.json()
    except ValueError:
        raise ToolError(f"{who} answered with something other than JSON") from None


async def _picture(item: Any, fetch: Any, who: str) -> bytes:
    """The bytes of one returned picture: inline base64, a `data:` URL, or a public URL (guarded)."""
    if isinstance(item, dict) and item.get("b64_json"):
        return base64.b64decode(item["b64_json"])
    url = item.get("url") if isinstance(item, dict) else None
    if not isinstance(url, str):
        raise ToolError(f"{who} returned no picture")
    if url.startswith("data:"):
        return base64.b64decode(url.split(",", 1)[1])
    if fetch is None:
        raise ToolError(f"{who} returned a URL, and this run fetches none")
    res = await fetch.get(url, follow_redirects=True)
    if res.status_code >= 400:
        raise ToolError(f"the picture at {who}'s URL answered HTTP {res.status_code}")
    return bytes(res.content)


class OpenAIImages:
    def __init__(self, base_url: str, model: str, api_key: str | None, http: Any, fetch: Any):
        self.base, self.model, self.http, self.fetch = base_url.rstrip("/"), model, http, fetch
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}

    async def generate(self, prompt: str, aspect: str, references: list[Image]) -> bytes:
        size = OPENAI_SIZES[aspect]
        try:
            if references:
                files = [("image[]", (f"ref{i}.{EXTENSIONS.get(r.mime, 'png')}", r.data, r.mime))
                         for i, r in enumerate(references)]
                res = await self.http.post(f"{self.base}/images/edits", headers=self.headers, files=files,
                                           data={"model": self.model, "prompt": prompt, "size": size, "n": "1"})
            else:
                res = await self.http.post(f"{self.base}/images/generations", headers=self.headers,
                                           json={"model": self.model, "prompt": prompt, "size": size, "n": 1})
        except Exception as exc:
            raise ToolError(f"the image provider could not be reached: {type(exc).__name__}: {exc}") from None
        body = await _answer(res, "the image provider")
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not data:
            raise ToolError("the image provider returned no picture")
        return await _picture(data[0], self.fetch, "the image provider")


class FalImages:
    def __init__(self, base_url: str, model: str, api_key: str | None, http: Any, fetch: Any):
        self.url = f"{base_url.rstrip('/')}/{model.strip('/')}"
        self.http, self.fetch = http, fetch
        self.headers = {"authorization": f"Key {api_key}"} if api_key else {}

    async def generate(self, prompt: str, aspect: str, references: list[Image]) -> bytes:
        body: dict[str, Any] = {"prompt": prompt, "image_size": FAL_SIZES[aspect], "num_images": 1, "sync_mode": True}
        if references:
            body["image_url"] = references[0].data_url()
            if len(references) > 1:
                body["image_urls"] = [r.data_url() for r in references]
        try:
            res = await self.http.post(self.url, headers=self.headers, json=body)
        except Exception as exc:
            raise ToolError(f"fal could not be reached: {type(exc).__name__}: {exc}") from None
        answer = await _answer(res, "fal")
        images = answer.get("images") if isinstance(answer, dict) else None
        if not isinstance(images, list) or not images:
            raise ToolError("fal returned no picture")
        return await _picture(images[0], self.fetch, "fal")


def make_provider(name: str, base_url: str | None, model: str | None, api_key: str | None, http: Any,
                  fetch: Any) -> OpenAIImages | FalImages:
    default_url, default_model = DEFAULTS[name]
    cls = OpenAIImages if name == "openai" else FalImages
    return cls(base_url or default_url, model or default_model, api_key, http, fetch)


class ImageGenerateArgs(BaseModel):
    prompt: str = Field(min_length=1, description="What the picture shows, in detail.")
    aspect_ratio: Literal["landscape", "square", "portrait"] = Field("landscape", description="Its shape.")
    image_url: str | None = Field(None, description="An image to change (a file in your work directory, an http(s) "
                                                    "URL, or a data: URL).")
    reference_image_urls: list[str] | None = Field(None, max_length=MAX_REFERENCES,
                                                   description="Images to take after, as image_url.")


class ImageGenerateTool:
    name = "image_generate"
    toolset = "image_gen"
    description = ("Make a picture from a description (or change a given one) and save it in your work directory "
                   "under images/. Returns JSON {success, image_path, mime, bytes}.")
    Args = ImageGenerateArgs

    async def run(self, args: ImageGenerateArgs, ctx: ToolContext) -> ToolResult:
        images = ctx.toolsets.get("image_gen")
        if images is None:
            raise ToolError("image_generate is unavailable: no image provider is configured for this run")
        refs = [r for r in [args.image_url, *(args.reference_image_urls or [])] if r]
        references = [await load_image(r, ctx) for r in refs]
        picture = as_image(await images.generate(args.prompt, args.aspect_ratio, references), "the picture made")
        name = f"{hashlib.sha256(picture.data).hexdigest()[:16]}.{EXTENSIONS.get(picture.mime, 'png')}"
        sandbox, path = await confine(ctx, posixpath.join("images", name))  # `images` may be the agent's link
        await sandbox.write_file(path, picture.data)
        return ToolResult(True, json.dumps({"success": True, "image_path": path, "mime": picture.mime,
                                            "bytes": len(picture.data)}), structured=True, images=(picture,))


def image_key(provider: str, base_url: str | None) -> str | None:
    """The image provider's key, from the environment: OPENAI_API_KEY only for OpenAI's own endpoint."""
    names = KEY_VARIABLES[provider][:1 if base_url else None]
    return next((os.environ[v] for v in names if os.environ.get(v)), None)


class ImageGenSettings(BaseModel):
    image_provider: Literal["openai", "fal"] | None = flag(
        None, "image_generate's provider (offers the image_gen toolset): openai, any /images/generations (key in "
              "IMAGE_API_KEY, else OPENAI_API_KEY at OpenAI's own), or fal (FAL_KEY)")
    image_base_url: str | None = flag(None, "the image provider's endpoint (default: https://api.openai.com/v1, or "
                                            "https://fal.run)")
    image_model: str | None = flag(None, "the image model (default: gpt-image-1, or fal-ai/flux/dev)")


class ImageGen(Toolset):
    name = "image_gen"
    tools = (ImageGenerateTool(),)
    Settings = ImageGenSettings

    def why_not(self, config: Any) -> str | None:
        if not config.image_provider:
            return "no image provider is configured (--image_provider=openai or fal)"
        if not image_key(config.image_provider, config.image_base_url):
            names = KEY_VARIABLES[config.image_provider][:1 if config.image_base_url else None]
            return f"--image_provider={config.image_provider} needs {' or '.join(names)}"
        return None

    def fingerprint(self, config: Any, use: str) -> dict[str, Any]:
        # who drew (only when set)
        return {k: getattr(config, k) for k in ("image_provider", "image_model") if getattr(config, k)}

    def keys(self, config: Any) -> dict[str, str]:
        key = image_key(config.image_provider, config.image_base_url) if config.image_provider else None
        return {"image": key} if key else {}

    def wanted(self, config: Any, offered: bool) -> bool:
        return bool(config.image_provider)

    async def open(self, opening: Opening) -> Any:
        config = opening.config
        return make_provider(config.image_provider, config.image_base_url, config.image_model,
                             opening.keys.get("image"), opening.http, opening.fetch_http)
