"""`vision_analyze`: an image from the sandbox (or a public URL, or a `data:` URL) described by the
run's auxiliary vision model, any OpenAI-compatible chat endpoint (`--vision_model`), or, with
`--vision_model=main`, handed to the run's own model: after the turn's tool results, a message
shows it the images (`looked_at`, which browser_vision answers through too)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from ..util import clip
from .base import TOOL_OUTPUT_CHARS, Image, ToolContext, ToolError, ToolResult
from .media import load_image

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
    if getattr(ctx.vision, "native", False):
        body = {"success": True, "question": question, "image": "shown after the tool results: look at it to answer"}
        return ToolResult(True, json.dumps({**body, **extra}, ensure_ascii=False), structured=True, images=(image,),
                          shown=True)
    analysis = await ctx.vision.describe(image, question)
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
        if ctx.vision is None:
            raise ToolError("vision_analyze is unavailable: no vision model is configured for this run")
        return await looked_at(await load_image(args.image_url, ctx), args.question, ctx)
