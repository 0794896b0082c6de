"""A model's chat template and tokenizer run by the runner itself, for token servers that only
generate from ids (SGLang's `/generate`): `--tokenizer_file` (the model's tokenizer.json, read by the
`tokenizers` library) and `--chat_template_file` (a Jinja chat template, or the model's
tokenizer_config.json holding one). The template runs as Hugging Face's `apply_chat_template` runs
it (a sandboxed Jinja environment, blocks trimmed; a call's JSON arguments handed to it as an
object, as vLLM and SGLang hand them)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import UserError


class LocalRenderer:
    def __init__(self, tokenizer_file: str, template_file: str):
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise UserError("--token_server=sglang renders and tokenises in the runner, with jinja2 and tokenizers: "
                            "pip install -e '.[export]'") from exc
        try:
            self._tok = Tokenizer.from_file(tokenizer_file)
        except Exception as exc:  # the library raises its own kinds for a missing or bad file
            raise UserError(f"--tokenizer_file={tokenizer_file}: not a tokenizer.json the tokenizers library reads "
                            f"({exc})") from None
        source, self.specials = _template(Path(template_file))
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise UserError(f"--chat_template_file={template_file}: not a Jinja template ({exc})") from None
        self.identity = (hashlib.sha256(Path(tokenizer_file).read_bytes()).hexdigest()[:16],
                         hashlib.sha256(source.encode()).hexdigest()[:16])

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation: bool) -> str:
        return str(self._template.render(messages=[_with_object_arguments(m) for m in messages], tools=tools or None,
                                         add_generation_prompt=generation, **self.specials))

    def tokenize(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def detokenize(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=False))


def _template(path: Path) -> tuple[str, dict[str, str]]:
    """(the template's source, the special tokens it may name) from a .jinja file or a tokenizer_config.json."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"--chat_template_file={path}: {exc.strerror}") from None
    if path.suffix != ".json":
        return text, {}
    try:
        config = json.loads(text)
        template = config["chat_template"]
    except (ValueError, KeyError, TypeError):
        raise UserError(f"--chat_template_file={path}: a tokenizer_config.json without a chat_template") from None
    if isinstance(template, list):  # named templates: the tool-use one where there is one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("tool_use") or named.get("default")
    if not isinstance(template, str):
        raise UserError(f"--chat_template_file={path}: its chat_template is not a template")
    specials = {k: v if isinstance(v, str) else (v or {}).get("content", "")
                for k in ("bos_token", "eos_token") if (v := config.get(k)) is not None}
    return template, specials


def _with_object_arguments(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for c in calls:
        fn = dict(c.get("function") or {})
        try:
            fn["arguments"] = json.loads(fn.get("arguments") or "{}")
        except (TypeError, ValueError):
            pass  # a model's malformed arguments stay the text it wrote
        out.append({**c, "function": fn})
    return {**message, "tool_calls": out}


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)
