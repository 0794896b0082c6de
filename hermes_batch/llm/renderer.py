"""A model's chat template and tokenizer run by the runner itself, for token servers that only
generate from ids (SGLang's `/generate`): `--tokenizer_file` (the model's tokenizer.json, read by the
`tokenizers` library) and `--chat_template_file` (a Jinja chat template, or the model's
tokenizer_config.json holding one; a template file takes its special tokens from the
tokenizer_config.json beside it, as Hugging Face's model repositories ship them). The template runs as
Hugging Face's `apply_chat_template` runs it (a sandboxed Jinja environment, blocks trimmed, its
`generation` blocks rendered as they are; a call's JSON arguments handed to it as an object, as vLLM
and SGLang hand them).

`ids` tokenises a chat with the special tokens (the tokenizer's added tokens marked special) only
where the template wrote them (tokens/controls.py): every stretch between them is encoded with special
tokens read as text (`encode_special_tokens`), so a message's text is its characters' ids."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..tokens import Skeleton
from ..tokens.controls import KIND, excess
from . import PromptFailed


class LocalRenderer:
    def __init__(self, tokenizer_file: str, template_file: str):
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:
            raise UserError("--token_server=sglang renders in the runner, with jinja2: pip install -e '.[export]'") from exc
        self._tok = tokenizer_from(tokenizer_file, "--tokenizer_file")
        self._text = tokenizer_from(tokenizer_file, "--tokenizer_file")  # reads a special token's text as text
        self._text.encode_special_tokens = True
        added = self._tok.get_added_tokens_decoder()
        self.controls = {t.content: i for i, t in added.items() if t.special}
        self._names = {i: text for text, i in self.controls.items()}
        self._splits_alike = self._stretches_alike()
        source, self.specials = _template(Path(template_file))
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols", _generation_blocks()])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise UserError(f"--chat_template_file={template_file}: not a Jinja template ({exc})") from None
        for name in ("bos_token", "eos_token"):  # a template that writes one must know it, or it writes nothing
            if name in source and name not in self.specials:
                raise UserError(f"--chat_template_file={template_file}: the template writes {name}, and no "
                                "tokenizer_config.json names it: give the model's tokenizer_config.json instead, or "
                                "put it beside the template")
        self.identity = (hashlib.sha256(Path(tokenizer_file).read_bytes()).hexdigest()[:16],
                         hashlib.sha256(json.dumps([source, self.specials]).encode()).hexdigest()[:16])

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation: bool) -> str:
        return str(self._template.render(messages=[_with_object_arguments(m) for m in messages], tools=tools or None,
                                         add_generation_prompt=generation, **self.specials))

    def tokenize(self, text: str) -> list[int]:
        """`text` with its special tokens parsed (a template's own text)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation: bool) -> list[int]:
        """The chat's ids: special tokens where the template wrote them, every message's text as text;
        PromptFailed rather than a forged turn."""
        rendered = self.render(messages, tools, generation)
        skeleton = Skeleton.of(messages)
        shape = self.render(skeleton.messages, tools, generation)
        parts = skeleton.layout(shape, rendered).parts(self.controls) if self._splits_alike else None
        if parts is None:  # the template rewrote a message's text: tokenised whole, checked against the skeleton
            ids = self.tokenize(rendered)
            if why := excess(ids, self.tokenize(shape), self._names):
                raise PromptFailed(KIND, why)
            return ids
        out: list[int] = []
        for part in parts:
            out += [part] if isinstance(part, int) else self._text.encode(part, add_special_tokens=False).ids
        if sum(t in self._names for t in out) != sum(isinstance(p, int) for p in parts):
            raise PromptFailed(KIND, "the tokenizer read a message's text as special tokens: sending it would forge turns")
        return out

    def _stretches_alike(self) -> bool:
        """Whether text split at a special token encodes as the tokenizer encodes it whole (not so for a
        token that strips the spaces beside it, or a vocabulary that prefixes a text's first word)."""
        for text, i in list(self.controls.items())[:8]:
            for before, after in (("x ", " x"), ("\n", "\n\nx"), ("", "a")):
                split = self._text.encode(before, add_special_tokens=False).ids + [i] + \
                    self._text.encode(after, add_special_tokens=False).ids
                if self.tokenize(before + text + after) != split:
                    return False
        return True

    def detokenize(self, ids: list[int], skip_special: bool = False) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=skip_special))


def tokenizer_from(path: str, flag: str) -> Any:
    """A Hugging Face tokenizer.json, read by the `tokenizers` library; UserError naming `flag` if not."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise UserError(f"{flag} reads a tokenizer.json with the tokenizers package: pip install -e '.[export]'") from exc
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # the library raises its own kinds for a missing or bad file
        raise UserError(f"{flag}={path}: not a tokenizer.json the tokenizers library reads ({exc})") from None


def _template(path: Path) -> tuple[str, dict[str, str]]:
    """(the template's source, the special tokens it may name) from a tokenizer_config.json, or from a
    template file and the tokenizer_config.json beside it (when there is one)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"--chat_template_file={path}: {exc.strerror}") from None
    if path.suffix != ".json":
        beside = path.with_name("tokenizer_config.json")
        return text, (_specials(_config(beside)) if beside.is_file() else {})
    config = _config(path)
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the tool-use one where there is one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("tool_use") or named.get("default")
    if not isinstance(template, str):
        raise UserError(f"--chat_template_file={path}: a tokenizer_config.json without a chat_template")
    return template, _specials(config)


def _config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a tokenizer_config.json ({exc})") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: not a tokenizer_config.json (not an object)")
    return config


def _specials(config: dict[str, Any]) -> dict[str, str]:
    """bos_token and eos_token as text (a config writes each as text or as an added token's object)."""
    return {k: v if isinstance(v, str) else str((v or {}).get("content", ""))
            for k in ("bos_token", "eos_token") if (v := config.get(k)) is not None}


def _generation_blocks() -> Any:
    """`{% generation %}…{% endgeneration %}`, which Hugging Face's templates use to mark what the
    assistant wrote: its body, rendered as it is."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    return Generation


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


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False,
            separators: Any = None) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys,
                      separators=tuple(separators) if separators else None)


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)
