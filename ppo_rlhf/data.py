"""Prompt datasets: every source a run can take its prompts from, read into `PromptRow`s.

A source is one of:
* a file: JSON Lines (one object per line), JSON (an array of objects, pretty-printed or not, or an object holding
  one such array, like {"data": [...]}), CSV/TSV (a header row; cells are strings) or Parquet;
* a folder: written by `datasets.Dataset.save_to_disk` (a DatasetDict gives its "train" split, or its only one),
  or any folder `datasets.load_dataset` reads (data files, split "train");
* a hub id: `datasets.load_dataset(ID, split="train")`; `ID:SPLIT` picks another split. Offline
  (HF_HUB_OFFLINE=1) a cached copy is used;
* a `datasets.Dataset`, a list of strings, or a list of dicts (or of chat-message lists).

A prompt is a non-empty string or a non-empty list of chat messages ({"role": ..., "content": ...}); the column that
holds it is `prompt_column` (default "prompt"), and every other column of a row is kept in `PromptRow.columns` (for
reward functions: `answer`, ...). Text files may start with a UTF-8 BOM and use CRLF line ends.

Bad data is one UsageError line naming the file, the row (a 1-based line number for text files; a 0-based row index,
as `dataset[i]` takes, for datasets, Parquet and lists) and the column; a file in the wrong format also gets the
format expected, with an example, and the keys found.

Nothing here imports torch or transformers (`datasets` and pyarrow only for the sources that need them), so that
`ppo-rlhf train` checks its prompts before the heavy imports (`check_prompt_source`).
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.utils.paths import looks_like_path, require_file

Prompt = str | list[dict[str, Any]]
"""A prompt: a string (one user turn) or a list of chat messages, applied with the tokenizer's chat template."""

PROMPT_EXAMPLE = '{"prompt": "Write a haiku about the sea."}'
MESSAGE_EXAMPLE = '{"role": "user", "content": "Write a haiku about the sea."}'
JSON_FORMATS = ("JSON Lines (one object per line, like {example}), a JSON array of such objects, or a CSV (header row) "
                "or Parquet file")
FILE_SUFFIXES = (".jsonl", ".json", ".ndjson", ".csv", ".tsv", ".parquet", ".txt")  # a name meant as a file


@dataclass
class PromptRow:
    """One prompt of a dataset, with the rest of its row and where it came from (for messages)."""

    prompt: Prompt
    columns: dict[str, Any] = field(default_factory=dict)
    """Every other column of the row, by name (the reward functions' keyword arguments)."""
    where: str = ""
    """Where the row is, for messages: "prompts.jsonl:12" (file and line), "data.parquet row 12", "dataset row 12"."""


def load_prompt_rows(source: Any, prompt_column: str = "prompt") -> list[PromptRow]:
    """The prompts of `source` (a path, folder or hub id; a `datasets.Dataset`; a list of strings or dicts), checked
    row by row: a UsageError naming the first bad row."""
    require(isinstance(prompt_column, str) and prompt_column.strip() != "",
            f"prompt_column must be a non-empty column name, got {prompt_column!r}")
    if isinstance(source, (str, os.PathLike)):
        return _named_source_rows(os.fspath(source), prompt_column)
    if type(source).__name__ in ("DatasetDict", "IterableDatasetDict"):
        splits = ", ".join(source.keys())
        raise UsageError(f"train_dataset is a {type(source).__name__} (splits: {splits}); pass one split, like "
                         f"dataset[\"train\"]")
    if type(source).__module__.startswith("datasets.") and hasattr(source, "column_names") and hasattr(source,
                                                                                                       "to_list"):
        return _dataset_rows(source, prompt_column, "dataset")
    if isinstance(source, (list, tuple)):
        return _list_rows(source, prompt_column)
    raise UsageError("prompts must be a file, folder or hub id, a datasets.Dataset, or a list of strings or dicts; got "
                     f"{type(source).__name__}")


def check_prompt_source(source: str, prompt_column: str = "prompt") -> list[PromptRow]:
    """Read and check a `prompts` setting (a file, folder or hub id) without importing torch or transformers: `train`
    calls it before the heavy imports, so bad data is refused at once. Returns the rows it read."""
    return load_prompt_rows(source, prompt_column)


def check_prompt(value: Any, where: str, column: str | None = "prompt") -> Prompt:
    """`value` if it is a prompt (a non-blank string, or a list of chat messages with role and content strings and
    some text); else a UsageError naming `where` (file and row) and `column` (None: the value is the prompt itself).
    """
    subject = f'"{column}"' if column else "prompt"
    if isinstance(value, str):
        require(value.strip() != "", f"{where}: needs a non-empty {subject} string or chat-message list, got a blank "
                                     "string")
        return value
    if isinstance(value, (list, tuple)) and value:
        messages = []
        for number, message in enumerate(value, start=1):
            if not (isinstance(message, dict) and all(isinstance(message.get(k), str) for k in ("role", "content"))):
                found = (f"keys {', '.join(map(str, message)) or 'none'}" if isinstance(message, dict)
                         else f"a {type(message).__name__}")
                raise UsageError(f'{where}: {subject} message {number} needs a "role" and a "content" string, like '
                                 f"{MESSAGE_EXAMPLE}; found {found}")
            require(message["role"].strip() != "", f"{where}: {subject} message {number} has an empty role")
            # datasets fills the keys a message lacks with None (its messages are structs): not part of the message
            messages.append({key: item for key, item in message.items() if item is not None})
        require(any(m["content"].strip() for m in messages), f"{where}: {subject} messages have no text (every "
                                                             "content is blank)")
        return messages
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    raise UsageError(f"{where}: needs a non-empty {subject} string or chat-message list like [{MESSAGE_EXAMPLE}], "
                     f"got {type(value).__name__} {shown}")


# ---------------------------------------------------------------- rows of one kind of source


def prompt_row(row: dict, column: str, where: str) -> PromptRow:
    """The PromptRow of one row (a dict of columns), checked: a UsageError naming `where` and `column`."""
    if column not in row:
        found = ", ".join(map(str, row)) or "none"
        raise UsageError(f'{where}: no "{column}" column (columns found: {found}); expected rows like '
                         f'{{"{column}": "Write a haiku about the sea."}}, or set prompt_column to the column that '
                         "holds the prompts")
    prompt = check_prompt(row[column], where, column)
    return PromptRow(prompt, {key: value for key, value in row.items() if key != column}, where)


def _list_rows(items: list | tuple, column: str) -> list[PromptRow]:
    require(len(items) > 0, "the prompt list is empty")
    rows = []
    for index, item in enumerate(items):
        where = f"dataset row {index}"
        if isinstance(item, dict):
            rows.append(prompt_row(item, column, where))
        else:  # a string or a chat-message list: the prompt itself, no other columns
            rows.append(PromptRow(check_prompt(item, where, None), {}, where))
    return rows


def _table_rows(label: str, column_names: list[str], records: list[dict], column: str) -> list[PromptRow]:
    require(column in column_names, f'{label} has no "{column}" column (columns found: '
                                     f'{", ".join(column_names) or "none"}); set prompt_column to the column that '
                                     "holds the prompts")
    require(len(records) > 0, f"{label} has no rows")
    return [prompt_row(record, column, f"{label} row {index}") for index, record in enumerate(records)]


def _dataset_rows(dataset: Any, column: str, label: str) -> list[PromptRow]:
    return _table_rows(label, list(dataset.column_names), dataset.to_list(), column)


def _named_source_rows(name: str, column: str) -> list[PromptRow]:
    require(name.strip() != "", "prompts: empty name (a file, folder or hub id)")
    given, path, split = name, Path(name).expanduser(), None
    if not path.exists() and ":" in name:  # NAME:SPLIT (a hub id never holds ":")
        base, _, after = name.partition(":")
        if base and after and "/" not in after:
            name, path, split = base, Path(base).expanduser(), after
    if path.is_dir():
        return _folder_rows(path, split, column)
    if path.is_file() and split is None:
        return _file_rows(path, column)
    if looks_like_path(name) or path.suffix.lower() in FILE_SUFFIXES:
        raise UsageError(f"prompts file {given} not found")
    try:
        dataset = load_hf_dataset(name, split or "train")
    except UsageError as error:  # say both readings of the name
        raise UsageError(f"prompts {given}: no such file or folder, and {error}") from None
    return _dataset_rows(dataset, column, f"dataset {name}")


def _file_rows(path: Path, column: str) -> list[PromptRow]:
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return [prompt_row(row, column, where) for where, row in _csv_records(path, "\t" if suffix == ".tsv" else ",")]
    if suffix == ".parquet":
        return _parquet_rows(path, column)
    example = PROMPT_EXAMPLE.replace('"prompt"', json.dumps(column))
    return [prompt_row(row, column, f"{path}:{line}") for line, row in read_records(path, "prompts", example, column)]


def _folder_rows(path: Path, split: str | None, column: str) -> list[PromptRow]:
    saved = (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()
    if not saved:  # data files: load_dataset infers their format
        # (a bounded look: the folder may be a home directory given by mistake)
        has_data = any(p.suffix.lower() in FILE_SUFFIXES for depth in ("*", "*/*", "*/*/*") for p in path.glob(depth))
        require(has_data, f"prompts {path} is a directory, not a file (nor a save_to_disk folder or a folder of data "
                          "files)")
        return _dataset_rows(load_hf_dataset(str(path), split or "train"), column, str(path))
    datasets = import_datasets(f"the save_to_disk folder {path}")
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as error:  # a damaged or foreign folder: user input
        raise UsageError(f"cannot load {path} (a save_to_disk folder): {first_line(error)}") from None
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded)
        chosen = split or ("train" if "train" in names or len(names) != 1 else names[0])
        require(chosen in names, f"{path} has no split {chosen!r} (splits: {', '.join(names)}); name one as "
                                 f"{path}:SPLIT")
        loaded = loaded[chosen]
    else:
        require(split is None, f"{path} holds a single dataset, not splits: drop :{split}")
    return _dataset_rows(loaded, column, str(path))


def _parquet_rows(path: Path, column: str) -> list[PromptRow]:
    try:
        import pyarrow.parquet as parquet  # lazy: only Parquet files need it (installed with datasets)
    except ImportError:
        raise UsageError(f"{path}: Parquet files need pyarrow: pip install ppo-rlhf[hub]") from None
    try:
        table = parquet.read_table(path)
    except Exception as error:  # not Parquet, truncated, unreadable: user input
        raise UsageError(f"{path} is not a readable Parquet file ({first_line(error)})") from None
    return _table_rows(str(path), table.column_names, table.to_pylist(), column)


def _csv_records(path: Path, delimiter: str) -> list[tuple[str, dict]]:
    """(where, row) of a CSV/TSV file with a header row; `where` is the line the row starts on."""
    text = read_text(path)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)  # newline="": CRLF and quoted newlines
    try:
        header = next(reader, [])
        require(any(name.strip() for name in header), f"{path} is empty")
        records, start = [], reader.line_num + 1
        for cells in reader:
            if any(cell.strip() for cell in cells):  # blank lines are skipped, as in JSON Lines
                require(len(cells) == len(header), f"{path}:{start}: {len(cells)} fields, the header row has "
                                                   f"{len(header)} ({', '.join(header)})")
                records.append((f"{path}:{start}", dict(zip(header, cells))))
            start = reader.line_num + 1
    except csv.Error as error:
        raise UsageError(f"{path}:{reader.line_num}: not valid CSV ({error})") from None
    require(len(records) > 0, f"{path} has a header row and no rows")
    return records


# ---------------------------------------------------------------- JSON files (JSON Lines, arrays, wrapped arrays)


def read_text(path: Path) -> str:
    """The file's text: UTF-8, a leading BOM dropped; bad bytes are named by line."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror or error}") from None
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise UsageError(f"{path}:{line}: not valid UTF-8") from None


def read_records(path: str | Path, what: str = "JSONL", example: str = PROMPT_EXAMPLE,
                 row_key: str | None = None) -> list[tuple[int, dict]]:
    """(line number, object) of every row of a JSON file: JSON Lines (blank lines skipped), a JSON array of objects
    (each at the line it starts on), or an object holding one array of objects ({"data": [...]}: an object without
    `row_key`, the key every row has, or without it a pretty-printed one). A UsageError names the line of a malformed
    row; a file in another format gets the formats expected, with `example`."""
    path = require_file(what, str(path))  # (a folder is named as one, not as "not found")
    text = read_text(path)
    stripped = text.lstrip()
    require(stripped != "", f"{path} is empty")
    first = text[: len(text) - len(stripped)].count("\n") + 1  # the line the content starts on
    expected = JSON_FORMATS.format(example=example)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        if _is_json(stripped.split("\n", 1)[0]):  # a valid first line: JSON Lines, checked line by line
            return _json_lines(path, text, expected)
        if stripped[0] in "[{":
            raise UsageError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
        raise UsageError(f"{path}:{first}: not valid JSON (this looks like plain text); expected {expected}") from None
    except RecursionError:
        raise UsageError(f"{path}: JSON nested too deeply") from None
    if isinstance(document, list):
        return _array_records(path, text, text.index("["), document)
    require(isinstance(document, dict), f"{path}:{first}: expected a JSON object, got {type(document).__name__}; "
                                        f"expected {expected}")
    arrays = [key for key, value in document.items()
              if isinstance(value, list) and value and all(isinstance(item, dict) for item in value)]
    wrapped = row_key not in document if row_key else "\n" in stripped.strip()
    if len(arrays) == 1 and wrapped:  # like {"data": [...]}
        return _array_records(path, text, _value_start(text, arrays[0]), document[arrays[0]])
    return [(first, document)]  # a JSON Lines file of one line


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return False
    return True


def _json_lines(path: Path, text: str, expected: str) -> list[tuple[int, dict]]:
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 may sit inside a string
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"{path}:{number}: not valid JSON ({error.msg}); expected {expected}") from None
        except RecursionError:
            raise UsageError(f"{path}:{number}: JSON nested too deeply") from None
        require(isinstance(row, dict), f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        rows.append((number, row))
    return rows


_DECODER = json.JSONDecoder()


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _array_records(path: Path, text: str, start: int, items: list) -> list[tuple[int, dict]]:
    """(line, item) of the array `items`, parsed from the valid JSON at text[start] == "[": each item's line is where
    it starts (the decoder keeps no positions, so the items are walked once more)."""
    require(len(items) > 0, f"{path}: the JSON array is empty")
    rows, line, counted, position = [], 1, 0, start
    for index, item in enumerate(items):
        position = _skip_space(text, position + 1)  # past "[" or ","
        line, counted = line + text.count("\n", counted, position), position
        require(isinstance(item, dict), f"{path}:{line}: expected a JSON object, got {type(item).__name__}")
        rows.append((line, item))
        position = _skip_space(text, _DECODER.raw_decode(text, position)[1])  # at the "," (or the closing "]")
    return rows


def _value_start(text: str, key: str) -> int:
    """Where the value of `key` starts in the valid JSON object that is the whole of `text` (the last one, as
    json.loads keeps the last of duplicate keys)."""
    position, found = _skip_space(text, 0) + 1, -1
    while text[_skip_space(text, position)] != "}":
        name, position = _DECODER.raw_decode(text, _skip_space(text, position))
        value_start = _skip_space(text, _skip_space(text, position) + 1)  # past ":"
        found = value_start if name == key else found
        position = _skip_space(text, _DECODER.raw_decode(text, value_start)[1])
        position += text[position] == ","
    return found


# ---------------------------------------------------------------- hub datasets


def import_datasets(what: str):
    try:
        import datasets  # lazy: optional (pip install ppo-rlhf[hub]), and slow to import
    except ImportError:
        raise UsageError(f"{what} needs the datasets package: pip install ppo-rlhf[hub]") from None
    return datasets


def load_hf_dataset(name: str, split: str):
    """datasets.load_dataset (a hub id or a local folder of data files) with one-line errors."""
    datasets = import_datasets(f"dataset {name}")
    # "Generating train split" bars on stderr would turn a refusal's one line into three
    bars_were_on = datasets.utils.is_progress_bar_enabled()
    datasets.utils.disable_progress_bars()
    try:
        return datasets.load_dataset(name, split=split)
    except Exception as error:  # offline, unknown dataset, unknown split: all user input
        raise UsageError(f"cannot load dataset {name} split {split}: {first_line(error)}") from error
    finally:
        if bars_were_on:
            datasets.utils.enable_progress_bars()


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
