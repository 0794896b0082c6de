"""`vision_analyze`: an image from the sandbox (or a public URL, or a `data:` URL) described by the
run's auxiliary vision model, any OpenAI-compatible chat endpoint (`--vision_model`), or, with
`--vision_model=main`, handed to the run's own model: after the turn's tool results, a message
shows it the images (`looked_at`, which browser_vision answers through too)."""

from __future__ import annotations

import json
import os
from typing import Any

from pydantic import BaseModel, Field

from ..flags import flag
from ..util import clip
from .base import TOOL_OUTPUT_CHARS, Image, ToolContext, ToolError, ToolResult
from .media import load_image
from .toolset import Opening, Toolset

INSTRUCTION = ("Look at the image and answer the question about it. Describe what is there plainly and "
               "exactly (text in it word for word); say so when the image does not show what is asked.")


class VisionClient:
    """One user message (the instruction and question as text, the image as a `data:` URL part), temperature 0.1."""

    def __init__(self, base_url: str, model: str, api_key: str | None, http: Any):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.http = model, http
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}

    async def describe(self, image: Image, question: str) -> str:
        body = {"model": self.model, "temperature": 0.1, "messages": [{"role": "user", "content": [
            {"type": "text", "text": f"{INSTRUCTION}\n\nQuestion: {question}"},
            {"type": "image_url", "image_url": {"url": image.data_url()}}]}]}
        try:
            res = await self.http.post(self.url, json=body, headers=self.headers)
        except Exception as exc:  # the endpoint's failures, as the model can read them
            raise ToolError(f"the vision model could not be reached: {type(exc).__name__}: {exc}") from None
        if res.status_code >= 400:
            raise ToolError(f"the vision model answered HTTP {res.status_code}: {res.text[:300]}")
        try:
            content = res.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ToolError("the vision model's answer had no message") from None
        if not isinstance(content, str) or not content.strip():
            raise ToolError("the vision model answered with nothing")
        return content


NATIVE = "main"  # --vision_model=main: the run's own model looks at the images itself


class MainModelLooks:
    """The vision of a run whose own model reads images: nothing to ask, the image goes with the answer."""

    native = True


async def looked_at(image: Image, question: str, ctx: ToolContext, **extra: Any) -> ToolResult:
    """A tool's answer about an image: what the vision model said of it, or (native) the image itself
    for the run's model, after a line saying what it was asked to look for."""
    vision = ctx.toolsets.get("vision")
    if getattr(vision, "native", False):
        body = {"success": True, "question": question, "image": "shown after the tool results: look at it to answer"}
        return ToolResult(True, json.dumps({**body, **extra}, ensure_ascii=False), structured=True, images=(image,),
                          shown=True)
    if vision is None:
        raise ToolError("no vision model is configured for this run")
    analysis = await vision.describe(image, question)
    return ToolResult(True, json.dumps({"success": True, "analysis": clip(analysis, TOOL_OUTPUT_CHARS), **extra},
                                       ensure_ascii=False), structured=True, images=(image,))


class VisionArgs(BaseModel):
    image_url: str = Field(min_length=1, description="The image: a file in your work directory, an http(s) URL, "
                                                     "or a data: URL.")
    question: str = Field(min_length=1, description="What to find out about the image.")


class VisionAnalyzeTool:
    name = "vision_analyze"
    toolset = "vision"
    description = ("Look at an image and answer a question about it: what it shows, the text in it, details. "
                   "Returns JSON {success, analysis}.")
    Args = VisionArgs

    async def run(self, args: VisionArgs, ctx: ToolContext) -> ToolResult:
        if ctx.toolsets.get("vision") is None:
            raise ToolError("vision_analyze is unavailable: no vision model is configured for this run")
        return await looked_at(await load_image(args.image_url, ctx), args.question, ctx)


class VisionSettings(BaseModel):
    vision_model: str | None = flag(None, "the OpenAI-compatible vision model vision_analyze asks (offers the vision "
                                          "toolset); its key in VISION_API_KEY, else the run's at the run's own "
                                          "endpoint; main: the run's own model reads the images itself")
    vision_base_url: str | None = flag(None, "the vision model's endpoint (default: --base_url)")


class Vision(Toolset):
    name = "vision"
    tools = (VisionAnalyzeTool(),)
    Settings = VisionSettings

    def why_not(self, config: Any) -> str | None:
        if not config.vision_model:
            return "no vision model is configured (--vision_model=NAME, at --vision_base_url, its key in VISION_API_KEY)"
        return None

    def fingerprint(self, config: Any, use: str) -> dict[str, Any]:
        return {"vision_model": config.vision_model} if config.vision_model else {}  # who saw (only when set)

    def keys(self, config: Any) -> dict[str, str]:
        key = os.environ.get("VISION_API_KEY", "")
        return {"vision": key} if key else {}

    def wanted(self, config: Any, offered: bool) -> bool:
        return bool(config.vision_model)  # browser_vision looks through it too

    async def open(self, opening: Opening) -> Any:
        config = opening.config
        if config.vision_model == NATIVE:
            return MainModelLooks()
        # the run's own key only goes to the run's own endpoint
        same = not config.vision_base_url or config.vision_base_url.rstrip("/") == config.base_url.rstrip("/")
        key = opening.keys.get("vision") or (opening.api_key if same else None)
        return VisionClient(config.vision_base_url or config.base_url, config.vision_model, key, opening.http)
