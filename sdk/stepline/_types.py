"""Typed workflows: pydantic models as a workflow's input and output and as step results.

A workflow whose ``input`` parameter is annotated with a pydantic model receives that model,
and one whose return annotation is a model has its output dumped to JSON; app sync registers
both JSON Schemas. ``ctx.step(..., type=T)`` turns a step's JSON result into ``T`` (any type
pydantic can validate) on the first execution and on replay alike.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, TypeAdapter


@dataclass(frozen=True)
class Signature:
    """What a workflow function's annotations say: its input and output models, if any."""

    input_model: type[BaseModel] | None = None
    output_model: type[BaseModel] | None = None

    def input_schema(self) -> dict[str, Any] | None:
        return self.input_model.model_json_schema() if self.input_model else None

    def output_schema(self) -> dict[str, Any] | None:
        return self.output_model.model_json_schema() if self.output_model else None


def signature_of(fn: Any) -> Signature:
    """The models in ``fn(ctx, input) -> output``'s annotations (strings resolved)."""
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError):
        return Signature()  # annotations that do not resolve: the workflow is untyped
    params = list(inspect.signature(fn).parameters)
    given = hints.get(params[1]) if len(params) > 1 else None
    return Signature(_model(given), _model(hints.get("return")))


def _model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


@lru_cache(maxsize=256)
def _adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


def convert(kind: Any, value: Any) -> Any:
    """``value`` (JSON) as ``kind``: a model, or anything else pydantic validates."""
    if kind is None:
        return value
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return kind.model_validate(value)
    return _adapter(kind).validate_python(value)
