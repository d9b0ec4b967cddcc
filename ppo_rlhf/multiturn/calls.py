"""Tool calls in a reply, and guarded calls into user code (tools, environments).

The plain format (any tokenizer): `<tool>name(arguments)</tool>`. The arguments are Python literals
(`f(1, x="a")`); anything else is passed as one string (`calc(12*7+3)` calls calc("12*7+3")). The JSON format of
chat templates with tools (Hermes, Qwen2.5): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. Both are
parsed from every reply. Where the chat template has a tool format (`chat.template_has_tools`) the prompt carries the
tools' JSON schemas (`tool_schemas`), which the template describes to the policy, as TRL's trainers pass `tools=` to
`apply_chat_template`; with a template without one (SmolLM2's) nothing is added, and the prompt itself must say how to
call a tool (calc-steps' does, in the plain format). A turn ends at its first complete call: the tokens sampled after
it are dropped.

User code may raise, hang or return the wrong type: each of these stops the run with one `UserCodeFailed` line naming
the tool or environment and the turn. A call the policy got wrong (an unknown tool, arguments the function does not
take) is the policy's mistake, not the tool's: its observation says so and it counts as a tool error.
"""

from __future__ import annotations

import ast
import inspect
import json
import queue
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ppo_rlhf.errors import UserCodeFailed

PLAIN_CALL = re.compile(r"<tool>\s*([A-Za-z_]\w*)\s*\((.*?)\)\s*</tool>", re.S)
JSON_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


@dataclass
class ToolCall:
    name: str
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    end: int = 0  # where the call's text ends in the reply (characters)
    malformed: str | None = None  # why the call cannot be made (JSON that does not parse), else None


def _plain_arguments(text: str) -> tuple[tuple, dict[str, Any]]:
    try:
        call = ast.parse(f"f({text})", mode="eval").body
        if not isinstance(call, ast.Call):  # the text closed f( and went on: not plain arguments
            raise ValueError(text)
        args = tuple(ast.literal_eval(a) for a in call.args)
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}
        if len(kwargs) == len(call.keywords):
            return args, kwargs
    except (SyntaxError, ValueError, TypeError):
        pass
    return ((text.strip(),) if text.strip() else ()), {}


def first_tool_call(text: str) -> ToolCall | None:
    """The first complete tool call in a reply, in either format, or None."""
    found = [m for m in (PLAIN_CALL.search(text), JSON_CALL.search(text)) if m is not None]
    if not found:
        return None
    match = min(found, key=lambda m: m.start())
    if match.re is PLAIN_CALL:
        args, kwargs = _plain_arguments(match.group(2))
        return ToolCall(match.group(1), args, kwargs, match.end())
    try:
        call = json.loads(match.group(1))
        arguments = call.get("arguments", {})
        if not isinstance(call.get("name"), str) or not isinstance(arguments, dict):
            raise ValueError("needs a string name and an object of arguments")
        return ToolCall(call["name"], (), arguments, match.end())
    except ValueError as error:
        return ToolCall("?", end=match.end(), malformed=f"the tool call is not valid JSON ({error})")


def opens_tool_call(text: str) -> bool:
    """Whether a reply without a complete call began one: cut off by its token cap, it never closes."""
    return "<tool>" in text or "<tool_call>" in text


def guarded(what: str, fn: Callable, *args: Any, timeout: float, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) in a daemon thread: its result, or a UserCodeFailed naming `what` when it raises or takes
    longer than `timeout` seconds (the thread is left behind: Python cannot stop it; daemon, so it never keeps the
    process alive)."""
    answer: queue.Queue = queue.Queue(maxsize=1)

    def target() -> None:
        try:
            answer.put((True, fn(*args, **kwargs)))
        except BaseException as error:  # noqa: BLE001 (reported on the caller's thread, in one line)
            answer.put((False, error))

    threading.Thread(target=target, daemon=True).start()
    try:
        ok, value = answer.get(timeout=timeout)
    except queue.Empty:
        raise UserCodeFailed(f"{what} did not return within tool_timeout={timeout:g} s") from None
    if not ok:
        text = str(value).strip().splitlines()
        raise UserCodeFailed(f"{what} raised {type(value).__name__}" + (f": {text[0]}" if text else "")) from value
    return value


def call_tool(call: ToolCall, tools: dict[str, Callable], turn: int, timeout: float,
              spec: str | None = None) -> tuple[str, bool]:
    """(the observation text, whether it is a tool error of the policy's) of one call. A tool returns text or a
    number; anything else stops the run, naming the tool by `spec` (how the user gave it: "file.py:function")."""
    if call.malformed is not None:
        return f"error: {call.malformed}", True
    if call.name not in tools:
        return f"error: no tool named {call.name!r} (tools: {', '.join(sorted(tools))})", True
    tool = tools[call.name]
    try:
        inspect.signature(tool).bind(*call.args, **call.kwargs)
    except TypeError as error:
        return f"error: {call.name}: {error}", True
    named = f"{spec}, " if spec and spec != call.name else ""
    what = f"tool {call.name} ({named}turn {turn})"
    result = guarded(what, tool, *call.args, timeout=timeout, **call.kwargs)
    if isinstance(result, bool) or not isinstance(result, str | int | float):
        raise UserCodeFailed(f"{what} returned a {type(result).__name__}, not text or a number")
    return str(result), False


JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def tool_schemas(tools: dict[str, Callable]) -> list[dict[str, Any]]:
    """The tools as the JSON schemas chat templates render: transformers' `get_json_schema` where the docstring
    documents every argument (Google style, "Args:"), else a schema from the signature (annotated str, int, float,
    bool; anything else a string) and the docstring's first paragraph, so that any plain function can be described."""
    from transformers.utils import get_json_schema  # lazy: this module is imported before transformers loads

    schemas = []
    for name, tool in tools.items():
        try:
            schema = get_json_schema(getattr(tool, "func", tool))
        except Exception:  # noqa: BLE001 (transformers raises several kinds for a docstring it cannot read)
            parameters = inspect.signature(tool).parameters.values()
            doc = (inspect.getdoc(tool) or name).split("\n\n")[0].replace("\n", " ")
            schema = {"type": "function", "function": {"name": name, "description": doc, "parameters": {
                "type": "object", "properties": {p.name: {"type": JSON_TYPES.get(p.annotation, "string")}
                                                 for p in parameters},
                "required": [p.name for p in parameters if p.default is inspect.Parameter.empty]}}}
        schema["function"]["name"] = name  # the name a call must use
        schemas.append(schema)
    return schemas


def tool_name(tool: Callable) -> str:
    inner = getattr(tool, "func", tool)  # functools.partial
    return getattr(inner, "__name__", type(tool).__name__)
