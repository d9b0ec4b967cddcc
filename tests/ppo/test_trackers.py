"""report_to trackers and RUN_DIR/completions.jsonl (ppo_rlhf/ppo/trackers.py): TensorBoard as dashboard.TensorBoard
writes it, wandb offline and trackio local (no network), the one-line errors, and what a resume drops."""

import json
import os
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ppo_rlhf.errors import UsageError
from ppo_rlhf.ppo.dashboard import TensorBoard
from ppo_rlhf.ppo.trackers import CompletionsLog, check_report_to, make_trackers

REPO = Path(__file__).resolve().parents[2]


def iteration_stats(index: int) -> dict:
    return {"iteration": index, "phase": "policy", "kl_used": "k1 in reward", "score": 0.25 * index, "kl": 0.5,
            "fin": 1.0, "time_gen": 2.0, "reward/exact_match": 0.75, "skipped_steps": 0}


ROWS = [{"prompt": "2+2?", "completion": "4 | four\nyes", "score": 1.0, "reward/exact_match": 1.0},
        {"prompt": "3+3?", "completion": "7", "score": -0.5, "reward/exact_match": None}]


def scalars(tb_dir: Path) -> dict:
    events = EventAccumulator(str(tb_dir))
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_writes_what_dashboard_tensorboard_writes(tmp_path):
    trackers = make_trackers(["tensorboard"], tmp_path / "run", {"lr": 1e-3}, first_iteration=0)
    board = TensorBoard(tmp_path / "reference", first_iteration=0)
    for index in range(3):
        trackers.log(iteration_stats(index), step=index)
        board.log(iteration_stats(index))
    trackers.close()
    board.close()
    written = scalars(tmp_path / "run" / "tb")
    assert written == scalars(tmp_path / "reference")
    # the names every tracker uses; strings (phase, kl_used) and the step itself are not scalars
    assert sorted(written) == ["ppo/fin", "ppo/kl", "ppo/reward/exact_match", "ppo/score", "ppo/skipped_steps",
                               "time/time_gen"]
    assert written["ppo/score"] == [(0, 0.0), (1, 0.25), (2, 0.5)]


def test_tensorboard_resume_drops_the_killed_runs_later_points_and_shows_completions(tmp_path):
    run_dir = tmp_path / "run"
    trackers = make_trackers(["tensorboard"], run_dir, {}, first_iteration=0)
    for index in range(4):  # killed after iteration 3, its checkpoint at 2
        trackers.log(iteration_stats(index), step=index)
    trackers.close()
    time.sleep(1.1)  # a resume is a later process: TensorBoard orders event files by name (see test_trainer.py)
    trackers = make_trackers(["tensorboard"], run_dir, {}, first_iteration=2)
    trackers.log({**iteration_stats(2), "score": 9.0}, step=2)
    trackers.log_completions(ROWS, step=2)
    trackers.close()
    assert scalars(run_dir / "tb")["ppo/score"] == [(0, 0.0), (1, 0.25), (2, 9.0)]
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    [text] = events.Tensors("completions/text_summary")
    table = text.tensor_proto.string_val[0].decode()
    assert text.step == 2
    assert table.splitlines()[0] == "| prompt | completion | score | reward/exact_match |"
    assert "| 2+2? | 4 \\| four<br>yes | +1.000 | +1.000 |" in table and "| 3+3? | 7 | -0.500 |  |" in table


def read_wandb_offline_runs(wandb_dir: Path) -> list[dict]:
    """Each offline run under `wandb_dir`, oldest first: its id, project, name, config and history by step, read from
    its run-ID.wandb file."""
    import wandb

    wandb.teardown()  # wandb's service writes the file after `finish()` returns: wait for it
    return [read_wandb_offline_run(folder) for folder in sorted(wandb_dir.glob("offline-run-*"))]


def read_wandb_offline_run(folder: Path) -> dict:
    """A LevelDB-style log of protobuf records: 32 KiB blocks of (checksum, length, type, piece of a record)."""
    from wandb.proto import wandb_internal_pb2

    data = next(folder.glob("run-*.wandb")).read_bytes()
    run, history, pending, pos = {}, {}, b"", 7  # after the header ":W&B", magic, version
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if room >= 7 else (0, 0, 0)
        if kind == 0:  # the padded end of a block
            pos += room
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "run":
                config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
                run = {"id": record.run.run_id, "project": record.run.project,
                       "name": record.run.display_name, "config": config}
            elif record.WhichOneof("record_type") == "history":
                items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item}
                history.setdefault(record.history.step.num, {}).update(items)
    return {**run, "history": history, "folder": folder}


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """No WANDB_* variable of the user's, wandb's settings and caches under tmp_path, and wandb's process-wide
    settings (read from the environment once) rebuilt before and after the test."""
    wandb = pytest.importorskip("wandb")
    for name in [name for name in os.environ if name.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    wandb.teardown()
    yield monkeypatch
    wandb.teardown()


@pytest.fixture
def wandb_offline(wandb_env):
    """wandb in offline mode: nothing leaves the machine."""
    wandb_env.setenv("WANDB_MODE", "offline")


def test_wandb_offline_logs_numbers_and_the_completions_table_and_resumes_the_same_run(tmp_path, wandb_offline):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trackers = make_trackers(["wandb"], run_dir, {"lr": 0.001, "iterations": 4}, first_iteration=0)
    for index in range(2):
        trackers.log(iteration_stats(index), step=index)
    trackers.log_completions(ROWS, step=1)
    trackers.close()
    resumed = make_trackers(["wandb"], run_dir, {"lr": 0.001, "iterations": 4}, first_iteration=2)
    resumed.log(iteration_stats(2), step=2)
    resumed.close()

    first, second = read_wandb_offline_runs(run_dir / "wandb")
    run_id = (run_dir / "wandb_run_id").read_text()
    assert first["id"] == second["id"] == run_id  # the resumed run continues the same W&B run
    assert first["project"] == "ppo-rlhf" and first["name"] == "run"
    assert first["config"]["lr"] == 0.001 and first["config"]["iterations"] == 4
    assert sorted(first["history"]) == [0, 1] and sorted(second["history"]) == [2]
    logged = first["history"][1]
    assert {key: logged[key] for key in ("ppo/score", "ppo/reward/exact_match", "time/time_gen")} == {
        "ppo/score": 0.25, "ppo/reward/exact_match": 0.75, "time/time_gen": 2.0}
    assert "ppo/phase" not in logged and "ppo/iteration" not in logged
    assert logged["completions/_type"] == "table-file" and logged["completions/nrows"] == 2
    table = json.loads((first["folder"] / "files" / logged["completions/path"]).read_text())
    assert table["columns"] == ["prompt", "completion", "score", "reward/exact_match"]
    assert table["data"] == [[row[key] for key in table["columns"]] for row in ROWS]

    fresh = make_trackers(["wandb"], run_dir, {}, first_iteration=0)  # a new run from iteration 0: a new W&B run
    fresh.close()
    assert (run_dir / "wandb_run_id").read_text() != run_id


def test_wandb_honours_the_users_wandb_environment(tmp_path, wandb_offline, monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "my-project")
    monkeypatch.setenv("WANDB_RUN_ID", "myrun123")
    trackers = make_trackers(["wandb"], tmp_path, {}, first_iteration=0, run_name="try-3")
    trackers.close()
    [run] = read_wandb_offline_runs(tmp_path / "wandb")
    assert (run["id"], run["project"], run["name"]) == ("myrun123", "my-project", "try-3")


def test_wandb_without_a_login_is_one_line(tmp_path, wandb_env, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, and no saved login in WANDB_CONFIG_DIR (wandb_env)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    with pytest.raises(UsageError) as error:
        make_trackers(["tensorboard", "wandb"], tmp_path / "run", {}, first_iteration=0)
    message = str(error.value)
    assert "\n" not in message and message.startswith("report_to wandb: ") and "WANDB_MODE=offline" in message


TRACKIO_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from ppo_rlhf.ppo.trackers import make_trackers
    from trackio.sqlite_storage import SQLiteStorage

    run_dir = Path(sys.argv[1])
    stats = lambda index: {"iteration": index, "phase": "policy", "score": 0.25 * index, "time_gen": 2.0}
    trackers = make_trackers(["trackio"], run_dir, {"lr": 0.001}, first_iteration=0)
    for index in range(2):
        trackers.log(stats(index), step=index)
    trackers.log_completions([{"prompt": "2+2?", "completion": "4", "score": 1.0}], step=1)
    trackers.close()
    resumed = make_trackers(["trackio"], run_dir, {"lr": 0.001}, first_iteration=2)
    resumed.log(stats(2), step=2)
    resumed.close()
    fresh = make_trackers(["trackio"], run_dir, {}, first_iteration=0)
    fresh.log(stats(0), step=0)
    fresh.close()
    records = SQLiteStorage.get_run_records("ppo-rlhf")
    logs = [SQLiteStorage.get_logs("ppo-rlhf", run_id=record["id"]) for record in records]
    result = {"runs": [record["name"] for record in records],
              "config": SQLiteStorage.get_run_config("ppo-rlhf", run_id=records[0]["id"]),
              "logs": [[{k: v for k, v in log.items() if k != "timestamp"} for log in run] for run in logs]}
    print("RESULT " + json.dumps(result))
""")


def test_trackio_logs_locally_and_resumes_the_same_run(tmp_path):
    pytest.importorskip("trackio")
    # trackio reads TRACKIO_DIR when it is imported: a process of its own keeps it under tmp_path
    env = {name: value for name, value in os.environ.items() if not name.startswith("TRACKIO_")}
    env.update(TRACKIO_DIR=str(tmp_path / "trackio"), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    (tmp_path / "run").mkdir()
    done = subprocess.run([sys.executable, "-c", TRACKIO_SCRIPT, str(tmp_path / "run")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["runs"] == ["run", "run"]  # the resumed run continued the first; a run from 0 is a new one
    assert result["config"]["lr"] == 0.001
    logs, fresh = result["logs"]
    assert [log["step"] for log in fresh] == [0]
    assert [log["step"] for log in logs if "ppo/score" in log] == [0, 1, 2]
    assert [log["ppo/score"] for log in logs if "ppo/score" in log] == [0.0, 0.25, 0.5]
    assert all("ppo/phase" not in log for log in logs)
    [table] = [log["completions"] for log in logs if "completions" in log]
    assert table["_value"] == [{"prompt": "2+2?", "completion": "4", "score": 1.0}]
    assert list((tmp_path / "trackio").glob("ppo-rlhf.*"))  # stored locally, where `trackio show` looks


@pytest.mark.parametrize("name", ["wandb", "trackio"])
def test_a_missing_tracker_package_is_one_line_naming_the_extra(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # as if not installed: importing it raises ImportError
    message = f"report_to {name} needs {name}: pip install 'ppo-rlhf[{name}]'"
    with pytest.raises(UsageError) as error:
        check_report_to(["tensorboard", name])
    assert str(error.value) == message
    with pytest.raises(UsageError) as error:
        make_trackers([name], tmp_path, {}, first_iteration=0)
    assert str(error.value) == message
    # "all" means every installed one: no error for a missing one
    assert name not in check_report_to("all") and "tensorboard" in check_report_to("all")


def test_unknown_or_mixed_report_to_is_one_line_and_none_still_writes_completions(tmp_path):
    with pytest.raises(UsageError) as error:
        make_trackers(["tensorboard", "mlflow"], tmp_path / "run", {}, first_iteration=0)
    assert str(error.value) == ("report_to: unknown tracker 'mlflow'; choose from tensorboard, wandb, trackio, all, "
                                "none")
    assert not (tmp_path / "run").exists()  # refused before anything is written
    with pytest.raises(UsageError, match="'none' cannot be combined"):
        check_report_to(["none", "tensorboard"])
    assert check_report_to(["tensorboard", "tensorboard"]) == ["tensorboard"]
    assert check_report_to([]) == check_report_to("none") == []

    (tmp_path / "run").mkdir()
    trackers = make_trackers("none", tmp_path / "run", {}, first_iteration=0)
    trackers.log(iteration_stats(0), step=0)
    trackers.log_completions(ROWS, step=0)
    trackers.close()
    assert sorted(path.name for path in (tmp_path / "run").iterdir()) == ["completions.jsonl"]


def test_completions_log_appends_rows_and_a_resume_drops_the_iterations_that_run_again(tmp_path):
    log = CompletionsLog(tmp_path, first_iteration=0)
    for index in (0, 2, 4):
        log.write([{**row, "score": row["score"] + index} for row in ROWS], iteration=index)
    lines = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [0, 0, 2, 2, 4, 4]
    assert lines[1] == {"iteration": 0, "prompt": "3+3?", "completion": "7", "score": -0.5,
                        "reward/exact_match": None}
    with open(tmp_path / "completions.jsonl", "a") as handle:
        handle.write('{"iteration": 5, "prompt": "cut by the ki')  # a kill in the middle of a line

    resumed = CompletionsLog(tmp_path, first_iteration=3)  # the checkpoint at 3: iterations 3, 4, 5 run again
    assert [json.loads(line)["iteration"] for line in (tmp_path / "completions.jsonl").read_text().splitlines()] == [
        0, 0, 2, 2]
    resumed.write(ROWS[:1], iteration=3)
    assert [json.loads(line)["iteration"] for line in (tmp_path / "completions.jsonl").read_text().splitlines()] == [
        0, 0, 2, 2, 3]
