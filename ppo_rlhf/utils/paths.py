"""Checks of the files and folders a command names, made before anything heavy is imported or loaded: a typo is
reported at once, in one line that says what is wrong (missing, a folder where a file is wanted, not a model)."""

from __future__ import annotations

from pathlib import Path

from ppo_rlhf.errors import UsageError, require


def require_file(what: str, name: str) -> Path:
    """`name` is an existing file (not a folder) holding `what`."""
    path = Path(name).expanduser()
    require(not path.is_dir(), f"{what} {name} is a directory, not a file")
    require(path.is_file(), f"{what} file {name} not found")
    return path


def require_run_dir(name: str) -> Path:
    """`name` is a run directory of `ppo-rlhf train`: a folder with its config.yaml."""
    path = Path(name).expanduser()
    require(not path.is_file(), f"{name} is a file, not a run directory")
    require(path.is_dir(), f"run directory {name} not found")
    require((path / "config.yaml").is_file(),
            f"{name} is not a run directory (no config.yaml; if its run was stopped while loading, start it again "
            "without --resume)")
    return path


def looks_like_path(name: str) -> bool:
    """A name meant as a local path, never a hub id (which is ORG/NAME)."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def check_model_name(name: str) -> None:
    """What can be said of a model name without loading anything: a .gguf is an existing file, a folder holds a
    model (config.json, or adapter_config.json for a PEFT adapter), a path exists and is no plain file. The offline
    alias and hub ids are checked when they are loaded."""
    require(bool(name.strip()), "empty model name")
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        require(path.is_file(), f"GGUF file {name} not found")
    elif path.is_dir():
        has_model = (path / "config.json").is_file() or (path / "adapter_config.json").is_file()
        require(has_model, f"{name} is not a model folder (no config.json)")
    else:
        require(not path.is_file(), f"{name} is a file, not a model folder (nor a .gguf file)")
        require(not looks_like_path(name), f"model folder {name} not found")


def demo_output_hint(flag: str, name: str) -> str:
    """What writes a missing `name` inside a demo's folder (configs/smollm2_offline.yaml reads runs/demo/reward_model),
    and the other demo's copy to pass instead: `; `make demo` writes it, or use --reward-model
    runs/demo-quick/reward_model (written by `make demo-quick`)`. "" for any other path."""
    path = Path(name)
    demo = next((folder for folder in path.parents if folder.name.startswith("demo")), None)
    if demo is None or path.exists():
        return ""

    def writer(folder: Path, quick: bool) -> str:
        make = {Path("runs/demo"): "`make demo`", Path("runs/demo-quick"): "`make demo-quick`"}
        return make.get(folder, f"`ppo-rlhf demo {'--quick ' if quick else ''}--out {folder}`")

    quick = demo.name == "demo-quick"
    other = demo.with_name("demo" if quick else "demo-quick")
    instead = other / path.relative_to(demo)
    written = "" if instead.exists() else f" (written by {writer(other, not quick)})"
    return f"; {writer(demo, quick)} writes it, or use {flag} {instead}{written}"


def function_spec(spec: str) -> tuple[str, str] | None:
    """(file or module, function) of a "path/to/file.py:function" or "package.module:function" reward spec; None for
    any other name (a reward-model folder or hub id)."""
    source, colon, function = spec.rpartition(":")
    is_module = all(part.isidentifier() for part in source.split("."))
    if not colon or not (source.endswith(".py") or is_module):
        return None
    require(function.isidentifier(), f"reward function {spec}: {function!r} after the colon is not a function name")
    return source, function


def check_reward_spec(spec: str) -> None:
    """A reward function named in a config: a "file.py:function" whose file exists, a "module:function" (imported
    when the run loads), or a reward model's name (`check_model_name`)."""
    parts = function_spec(spec)
    require(parts is not None or not spec.endswith(".py"), f"reward function {spec} needs its function: {spec}:NAME")
    if parts is None:
        check_model_name(spec)
    else:
        check_function_spec(spec, "reward function")


def check_function_spec(spec: str, what: str) -> None:
    """A function named in a config as "file.py:function" or "module:function" (`what`: "reward function", "tool",
    "environment"): a file must exist and compile, so that a typo or a syntax error is one line before anything
    loads (the file is not run: its imports and the function are found when the run loads it)."""
    parts = function_spec(spec)
    require(parts is not None, f"{what} {spec}: expected 'file.py:function' or 'module:function'")
    assert parts is not None  # (for mypy: require raised otherwise)
    if parts[0].endswith(".py"):
        path = require_file(what, parts[0])
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as error:  # ValueError: null bytes in the file
            where = f" line {error.lineno}" if isinstance(error, SyntaxError) and error.lineno else ""
            message = error.msg if isinstance(error, SyntaxError) else str(error)
            raise UsageError(f"{what} {spec}: {parts[0]}{where}: {message}") from None
