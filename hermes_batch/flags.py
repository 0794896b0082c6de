"""What a command-line flag is here: a pydantic field with a description (its line in `--help`),
and the two coercions python-fire's parsing calls for (`--model=1.5` arrives as a float,
`--toolsets=a,b` as one string). Every component that takes flags declares them with these."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field


def flag(default: Any, help: str, **kw: Any) -> Any:
    """A field that is a command-line flag (`--name=value`); `help` is what `--help` prints for it."""
    return Field(default, description=help, **kw)


def _text(v: Any) -> Any:
    return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def _comma_list(v: Any) -> Any:
    if isinstance(v, str):
        v = v.split(",")
    if isinstance(v, (list, tuple)):
        return [s for s in (str(item).strip() for item in v) if s]
    return v


Text = Annotated[str, BeforeValidator(_text)]  # a name or a path, whatever fire made of it
CommaList = Annotated[list[str], BeforeValidator(_comma_list)]  # `a,b,c` or a list
