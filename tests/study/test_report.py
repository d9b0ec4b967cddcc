import json
import math
import re

import numpy as np

from ppo_rlhf.cli import main
from ppo_rlhf.ppo.dashboard import DASHBOARD
from ppo_rlhf.study.evaluate import before_after, format_evaluation, model_label, standardize_records, summarize
from ppo_rlhf.study.report import (
    MONITOR_PANELS,
    PANELS,
    dashboard_figure,
    history_table,
    learning_curve_figure,
    overoptimisation_figure,
    read_history,
    seeds_figure,
    write_report,
)


def fake_run(root, name, iterations=8, drift=1.0):
    run = root / name
    run.mkdir(parents=True)
    lines = []
    for i in range(iterations):
        row = {key: 0.1 * i * drift for key, _, _ in DASHBOARD}
        row.update(iteration=i, time_total=50.0, time_gen=6.0, ev=math.nan if i == 0 else -0.5 + 0.1 * i)
        lines.append(json.dumps(row, allow_nan=True))
    (run / "history.jsonl").write_text("\n".join(lines) + "\n")
    return run


def fake_evaluation(root):
    records = []
    for run, iteration, shift, kl in ((None, None, 0.0, 0.0), ("beta005", 10, 0.2, 2.7), ("beta005", 20, 0.1, 3.2),
                                      ("nokl", 10, 0.15, 2.9), ("nokl", 20, -0.1, 5.6)):
        for j in range(4):
            for i in range(2):
                records.append({
                    "model": model_label(run, iteration), "run": run, "iteration": iteration,
                    "prompt_index": j, "reply_index": i, "prompt": f"prompt <{j}> | x", "reply": f"reply {j} {i} {run}",
                    "tokens": 10 + j, "finished": (i + j) % 3 != 0, "kl": kl + 0.1 * i, "entropy_sum": 8.0,
                    "proxy_raw": j + i + shift, "gold_raw": j - i + 2 * shift * (i + 1),
                })
    standardize_records(records)
    summary = summarize(records, n_boot=200)
    examples = before_after(records, 2)
    folder = root / "eval"
    folder.mkdir()
    (folder / "evaluation.json").write_text(json.dumps({"summary": summary, "examples": examples, "records": records}))
    (folder / "evaluation.txt").write_text(format_evaluation(summary, examples, 8))
    return folder


def test_history_table_first_and_last_five(tmp_path):
    run = fake_run(tmp_path, "beta005", iterations=12)
    header, rows = history_table({"beta005": read_history(run)})
    assert header[:3] == ["run", "iterations", "score"]
    assert rows[0][:3] == ["beta005", "first 5", "+0.200"]  # mean of 0.0 .. 0.4
    assert rows[1][:3] == ["beta005", "last 5", "+0.900"]  # mean of 0.7 .. 1.1


def test_a_run_shorter_than_two_spans_gets_one_row(tmp_path):
    """Issue 29 item 16: with fewer than 10 iterations "first 5" and "last 5" overlap (with 5 or fewer, repeat)."""
    for iterations, score in ((8, "+0.350"), (2, "+0.050")):
        _, rows = history_table({"short": read_history(fake_run(tmp_path / str(iterations), "short", iterations))})
        assert [row[:3] for row in rows] == [["short", f"all {iterations}", score]]


def test_report_writes_pngs_and_self_contained_html(tmp_path):
    runs = [fake_run(tmp_path, "beta005"), fake_run(tmp_path, "nokl", drift=2.0)]
    (runs[0] / "token_table.txt").write_text("t token logp_old\n0 Hello -1.2\n")
    out = tmp_path / "report"
    page = write_report(runs, fake_evaluation(tmp_path), out)
    assert page == out / "report.html"
    for png in ("dashboard.png", "overoptimisation.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 2 and "src='dashboard.png'" not in text
    assert "prompt &lt;0&gt; | x" in text and "0 Hello -1.2" in text and "beta005 step 20" in text
    markdown = (out / "report.md").read_text()
    assert "![" in markdown and "(dashboard.png)" in markdown
    assert "PROMPT: prompt <0> | x" in markdown and "reply 0 0 nokl |" in markdown


def test_report_cli_and_errors(tmp_path, capsys):
    run = fake_run(tmp_path, "beta005")
    assert main(["report", str(run), "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "dashboard.png").is_file() and not (tmp_path / "r" / "overoptimisation.png").exists()
    assert main(["report", str(tmp_path / "missing"), "--out", str(tmp_path / "r")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["report", str(run), "--eval", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    assert "evaluation.json not found" in capsys.readouterr().err
    (run / "history.jsonl").write_text("{not json\n")
    assert main(["report", str(run), "--out", str(tmp_path / "r")]) == 2
    assert "history.jsonl:1: not valid JSON" in capsys.readouterr().err


def test_report_of_an_evaluation_without_its_start_model_is_one_line(tmp_path, capsys):
    """Every change is paired with the start model's replies; an evaluation.json without its row (hand-edited, say)
    is refused in one line, not a traceback from the figure or the headline."""
    folder = fake_evaluation(tmp_path)
    path = folder / "evaluation.json"
    evaluation = json.loads(path.read_text())
    evaluation["summary"] = [s for s in evaluation["summary"] if s["run"] is not None]
    path.write_text(json.dumps(evaluation))
    run = fake_run(tmp_path, "beta005")
    assert main(["report", str(run), "--eval", str(folder), "--out", str(tmp_path / "r")]) == 2
    assert "has no start-model row in its summary" in capsys.readouterr().err


def test_dashboard_panels_say_what_they_show(tmp_path):
    # two runs whose lines coincide, over 3 iterations (where matplotlib's default ticks are 0, 0.25, 0.5, ...)
    histories = {name: read_history(fake_run(tmp_path, name, iterations=3)) for name in ("beta005", "nokl")}
    for row in histories["nokl"]:
        row["v_loss"] = math.nan  # a critic-free run logs no value loss
    histories["beta005"] = [{**row, "v_loss": math.nan} for row in histories["beta005"]]
    figure = dashboard_figure(histories)
    assert set(PANELS) == {key for key, _, _ in DASHBOARD}
    panels = [axis for axis in figure.axes if axis.axison]
    assert len(panels) == len(DASHBOARD) + len(MONITOR_PANELS) + 1  # the dashboard's, the monitor's, a judge's
    for axis, (key, label, _) in zip(panels, DASHBOARD):
        title, unit = PANELS[key]
        assert axis.get_title() == f"{title} [{label}]" and len(title.split()) >= 2  # words, then the log's name
        assert axis.get_ylabel() == unit and unit
        assert axis.get_xlabel() == "iteration"
        ticks = axis.get_xticks()
        assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks), (key, ticks)
        first, second = axis.get_lines()
        np.testing.assert_array_equal(first.get_ydata(), second.get_ydata())  # the runs coincide here...
        assert first.get_marker() != second.get_marker()  # ...and each keeps its own marker and dashes
        assert first.get_linestyle() != second.get_linestyle() and first.get_markerfacecolor() == "none"
    texts = [t.get_text() for axis in panels for t in axis.texts]
    # the value-loss panel, which has no numbers, and the monitor's, which runs from before it do not have
    assert texts == ["not logged by these runs"] * 3 + ["no monitor_judges in these runs"]
    (legend,) = figure.legends  # above the panels, not in a row of its own
    assert [t.get_text() for t in legend.get_texts()] == ["beta005", "nokl"] and legend.get_title().get_text() == "run"
    markers = {handle.get_marker() for handle in legend.legend_handles}
    assert len(markers) == 2


def test_the_monitor_panels_show_the_monitors_numbers(tmp_path):
    histories = {name: read_history(fake_run(tmp_path, name, iterations=3)) for name in ("beta005", "nokl")}
    for k, history in enumerate(histories.values()):
        for i, row in enumerate(history):
            row.update(reward_length_corr=0.5 + 0.1 * i, length_share=None if i == 0 else 0.25 * i)
            if k == 0:  # one run with two judges, the other without
                row.update({"monitor/gold": 2.0 - 0.5 * i, "monitor/brevity": 1.0})
    figure = dashboard_figure(histories)
    corr, share, brevity, gold = figure.axes[len(DASHBOARD) : len(DASHBOARD) + 4]
    assert [axis.get_title() for axis in (corr, share, brevity, gold)] == [
        "Reward hacking? corr(reward, length) [len_r]", "Hacking? gain due to length [length_share]",
        "Judge flat while rm_raw rises = hacking\n[monitor/brevity]",
        "Judge flat while rm_raw rises = hacking\n[monitor/gold]"]
    assert [axis.get_ylabel() for axis in (corr, share, gold)] == [
        "Pearson r over the batch", "share of the reward gain (1 = all)", "mean score (the judge's units)"]
    assert all(axis.get_xlabel() == "iteration" and not axis.texts for axis in (corr, share, brevity, gold))
    ys = {axis: [list(line.get_ydata()) for line in axis.get_lines()] for axis in (corr, share, gold)}
    assert ys[corr] == [[0.5, 0.6, 0.7]] * 2
    assert all(math.isnan(y[0]) and y[1:] == [0.25, 0.5] for y in ys[share])  # None (iteration 0): no point
    assert ys[gold][0] == [2.0, 1.5, 1.0] and all(math.isnan(v) for v in ys[gold][1])  # the run without judges
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["beta005", "nokl"]


def monitored_run(tmp_path, iterations):
    """Two runs as a quick demo's: the length correlation first measured in the last iteration, the length share only
    in the first, a judge with a long name."""
    histories = {name: read_history(fake_run(tmp_path, name, iterations=iterations)) for name in ("proxy", "gold")}
    for history in histories.values():
        for i, row in enumerate(history):
            last = i == len(history) - 1
            row.update(reward_length_corr=0.9 if last else None, length_share=0.2 if i == 0 else None,
                       ev=-16.0 + i, **{"monitor/reward_model": 0.7 + 0.1 * i})
    return histories


def test_a_number_measured_in_one_iteration_gets_the_runs_integer_ticks(tmp_path):
    for iterations in (1, 2):
        figure = dashboard_figure(monitored_run(tmp_path / str(iterations), iterations))
        panels = [axis for axis in figure.axes if axis.axison]
        limits = {axis.get_xlim() for axis in panels}
        assert len(limits) == 1  # every panel over the runs' iterations, one point or many
        (low, high), = limits
        for axis in panels:
            shown = [t for t in axis.get_xticks() if low <= t <= high]
            assert shown and all(float(t).is_integer() for t in shown), (axis.get_title(), shown)
            assert set(range(iterations)) <= set(shown)


def test_the_dashboard_keeps_its_words_inside_and_no_empty_row(tmp_path):
    import io

    figure = dashboard_figure(monitored_run(tmp_path, 2))
    figure.savefig(io.BytesIO(), dpi=100)  # lays the figure out as the report's PNG is
    renderer = figure._get_renderer()
    panels = [axis for axis in figure.axes if axis.axison]
    for axis in panels:
        for text in (axis.title, axis.yaxis.label):
            box = text.get_window_extent(renderer)
            assert 0 <= box.x0 and box.x1 <= figure.bbox.width and box.y1 <= figure.bbox.height, text.get_text()
    rows = {round(axis.get_position().y0, 3) for axis in figure.axes}
    assert rows == {round(axis.get_position().y0, 3) for axis in panels}  # each row holds a panel
    # explained variance far below 0, as an untrained value model's is: the axis says what that means
    (ev,) = [axis for axis in panels if axis.get_title().endswith("[ev]")]
    assert "below 0" in ev.get_ylabel() and max(ev.get_lines()[0].get_ydata()) < 0


def test_markdown_escapes_tags_only():
    from ppo_rlhf.study.report import render_markdown

    text = render_markdown("t", [("p", "dtype auto -> bfloat16; a <= b; a reply with <script> & </b>"),
                                 ("table", ["reply"], [["x -> y <i>"]])])
    assert "auto -> bfloat16; a <= b; a reply with &lt;script> & &lt;/b>" in text and "| x -> y &lt;i> |" in text
    assert "&gt;" not in text


def test_the_seed_figure_needs_two_seeds(tmp_path):
    from ppo_rlhf.study.report import arms_blocks

    evaluation = json.loads((fake_evaluation(tmp_path) / "evaluation.json").read_text())
    change = {"mean": 0.1, "lo": -0.1, "hi": 0.3}
    curves = [{"arm": "proxy", "beta": 0.0, "target": "last", "seeds": [1], "kl": 2.9, "finished": 0.5,
               "tokens": 12.0, **{f"{score}_change": change for score in ("gold", "proxy", "gap", "length")}}]
    out = tmp_path / "report"
    out.mkdir()
    two = {"nokl": {"arm": "proxy", "beta": 0.0, "seed": 1}, "beta005": {"arm": "proxy", "beta": 0.0, "seed": 2}}
    assert [b[1] for b in arms_blocks(curves, evaluation, two, out) if b[0] == "img"] == ["arms.png", "seeds.png"]
    # one seed: its points are the arms figure's already; an earlier page's seeds.png goes with it
    one = {"nokl": two["nokl"]}
    assert [b[1] for b in arms_blocks(curves, evaluation, one, out) if b[0] == "img"] == ["arms.png"]
    assert not (out / "seeds.png").exists()
    # the heading and the caption name the arms that ran (a quick demo runs two of the three)
    both = curves + [{**curves[0], "arm": "gold"}]
    heading, figure = arms_blocks(both, evaluation, one, out)[:2]
    assert heading == ("h2", "Two arms: what the proxy and the gold judge each buy at each KL")
    assert "for PPO on the proxy and on the gold judge itself;" in figure[2] and "word counts" not in figure[2]


def test_no_issue_numbers_in_what_the_study_says():
    from pathlib import Path

    import ppo_rlhf.study
    import ppo_rlhf.tasks.report

    sources = [*Path(ppo_rlhf.study.__file__).parent.glob("*.py"), Path(ppo_rlhf.tasks.report.__file__)]
    found = [f"{path.name}: {line.strip()}" for path in sources for line in path.read_text().splitlines()
             if re.search(r"\bissues? \d", line, re.I)]
    assert not found


def test_overoptimisation_plot_reads_without_the_chapter(tmp_path):
    summary = json.loads((fake_evaluation(tmp_path) / "evaluation.json").read_text())["summary"]
    figure = overoptimisation_figure(summary)
    gold, proxy = figure.axes
    assert "Gold" in gold.get_title() and "Proxy" in proxy.get_title()
    for axis in (gold, proxy):
        assert axis.get_xlabel() == "KL to the start model (nats per reply)"
        assert axis.get_ylabel() == "score change (start-model sd)"
        legend = axis.get_legend()
        assert [t.get_text() for t in legend.get_texts()] == ["beta005", "nokl"]
        assert "95% interval" in legend.get_title().get_text()
        labels = [t.get_text() for t in axis.texts]
        assert labels.count("it 10") == 2 and labels.count("it 20") == 2 and "start model" in labels
    assert gold.get_ylim() == proxy.get_ylim()  # one scale: the proxy's claim against the gold judge's view


def test_a_file_given_as_a_run_directory_says_so(tmp_path, capsys):
    path = tmp_path / "history.jsonl"
    path.write_text("{}\n")
    assert main(["report", str(path), "--out", str(tmp_path / "r")]) == 2
    assert "is a file, not a run directory" in capsys.readouterr().err


def test_study_report_opens_with_the_result_in_words(tmp_path):
    from ppo_rlhf.study.findings import SMOKE_NOTE, headline

    evaluation = fake_evaluation(tmp_path)
    curve = [{"pairs": 0, "epochs": 0, "accuracy": 0.5, "mean_margin": 0.0, "length_corr": 0.1},
             {"pairs": 40, "epochs": 1, "accuracy": 0.6, "mean_margin": 0.2, "length_corr": 0.2},
             {"pairs": 80, "epochs": 1, "accuracy": 0.7, "mean_margin": 0.4, "length_corr": None}]
    study = {"quick": True, "realtoxicityprompts": False, "runs": {"beta005": 0.05, "nokl": 0.0},
             "settings": {"model": "smollm2", "betas": "0.05,0", "iterations": 20, "batch_size": 8, "reply_cap": 48},
             "rm_info": {"heldout_pairs": 30, "train_pairs": 80, "before": {"accuracy": 0.5},
                         "after": {"accuracy": 0.7, "length_corr": None}, "learning_curve": curve}}
    out = tmp_path / "report"
    page = write_report([fake_run(tmp_path, "beta005"), fake_run(tmp_path, "nokl")], evaluation, out, study)
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# What PPO against a learned reward model really gained (smoke run)\n\n" + SMOKE_NOTE)
    result = headline(json.loads((evaluation / "evaluation.json").read_text()), study)
    # the result paragraphs come right after the smoke note, before any figure or table
    assert markdown.index("## The result") < markdown.index(result[0]) < markdown.index("![")
    assert "Content note" not in markdown and "## Read with care" in markdown
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 40 | 1 | 0.600 | +0.200 | +0.20 |" in markdown and "| 80 | 1 | 0.700 | +0.400 | nan |" in markdown
    assert page.read_text().count("data:image/png;base64,") == 3  # dashboard, over-optimisation, learning curve

    # a full run: the result is the first paragraph; the content note follows it, before any quoted reply
    write_report([], evaluation, out, study | {"quick": False, "realtoxicityprompts": True})
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# What PPO against a learned reward model really gained\n\n## The result\n\n"
                               + result[0])
    assert markdown.index(result[-1]) < markdown.index("Content note") < markdown.index("PROMPT:")
    assert SMOKE_NOTE not in markdown


def test_learning_curve_figure_marks_chance_and_target():
    figure = learning_curve_figure([{"pairs": 0, "epochs": 0, "accuracy": 0.5},
                                    {"pairs": 10, "epochs": 1, "accuracy": 0.6},
                                    {"pairs": 10, "epochs": 2, "accuracy": 0.65}])
    (axis,) = figure.axes
    labels = [t.get_text() for t in axis.get_legend().get_texts()]
    assert labels == ["first pass", "after 2 epochs", "chance", "target"]
    assert list(axis.get_lines()[0].get_xdata()) == [0, 10] and axis.get_ylim() == (-0.04, 1.04)


def test_learning_curve_figure_keeps_its_labels_and_lines_inside():
    """Issue 29 item 16: the y label was cut off at both ends, and an accuracy of 1 hid in the frame."""
    import io

    figure = learning_curve_figure([{"pairs": 0, "epochs": 0, "accuracy": 0.5},
                                    {"pairs": 40, "epochs": 1, "accuracy": 1.0},
                                    {"pairs": 80, "epochs": 1, "accuracy": 0.0}])
    figure.savefig(io.BytesIO(), dpi=100)  # lays the figure out as the report's PNG is
    (axis,) = figure.axes
    renderer = figure._get_renderer()
    width, height = figure.bbox.width, figure.bbox.height
    for text in (axis.yaxis.label, axis.xaxis.label, axis.title):
        box = text.get_window_extent(renderer)
        assert 0 <= box.x0 and box.x1 <= width and 0 <= box.y0 and box.y1 <= height, (text.get_text(), box)
    (low, high), (left, right) = axis.get_ylim(), axis.get_xlim()
    for line in axis.get_lines():
        if line.get_label() == "first pass":
            assert low < min(line.get_ydata()) and max(line.get_ydata()) < high  # 0 and 1 off the frame
            assert left < min(line.get_xdata()) and max(line.get_xdata()) < right


def test_paths_nan_correlations_and_empty_replies_are_explained(tmp_path):
    """Issue 29 item 16: the proxy's folder relative to the report, a length correlation that cannot be formed says
    why, an empty reply says it is empty; and the KL says which estimate it is."""
    from ppo_rlhf.study.report import evaluation_table, example_table

    folder = fake_evaluation(tmp_path)
    evaluation = json.loads((folder / "evaluation.json").read_text())
    evaluation["settings"] = {"n_prompts": 4, "replies_per_prompt": 2, "seed": 1, "gold": "gold",
                              "proxy": f"rm:{tmp_path / 'demo' / 'reward_model'}", "kl": "k3 estimate of KL"}
    evaluation["examples"][0]["replies"][0]["reply"] = ""
    (folder / "evaluation.json").write_text(json.dumps(evaluation))
    write_report([], folder, tmp_path / "demo" / "report")
    markdown = (tmp_path / "demo" / "report" / "report.md").read_text()
    assert "proxy rm:../reward_model, gold gold" in markdown and str(tmp_path) not in markdown
    assert "KL: the k3 estimate of KL." in markdown
    assert example_table(evaluation["examples"][0])[1][0][-1] == "(empty reply)"

    one_finished = dict(evaluation["summary"][0], length_corr=math.nan, finished=1 / 8, replies=8)
    same_length = dict(one_finished, finished=0.5)
    cells = [row[-1] for row in evaluation_table([one_finished, same_length])[1]]
    assert cells == ["n/a (only 1 finished reply; it needs 2)",
                     "n/a (the finished replies all have the same length or the same proxy score)"]
    text = format_evaluation([one_finished, dict(same_length, run="r", iteration=1)], evaluation["examples"], 8)
    assert "length correlation n/a (only 1 finished reply; it needs 2)" in text and "nan" not in text
    assert "(empty reply)" in text


def test_the_raw_reward_panel_shows_each_runs_change_in_its_own_units(tmp_path):
    # the length arm's reward is a word count (~35), a reward model's ~0.7: on one axis the latter was a flat line
    histories = {"proxy": [{"iteration": i, "rm_raw": 0.7 + 0.1 * i} for i in range(3)],
                 "length": [{"iteration": i, "rm_raw": math.nan if i == 0 else 35.0 + i} for i in range(3)]}
    figure = dashboard_figure(histories)
    (panel,) = [axis for axis in figure.axes if axis.get_title().endswith("[rm_raw]")]
    assert panel.get_ylabel() == "the run's own reward's units" and "change from iteration 0" in panel.get_title()
    proxy, length = (list(line.get_ydata()) for line in panel.get_lines())
    np.testing.assert_allclose(proxy, [0.0, 0.1, 0.2])
    assert math.isnan(length[0]) and length[1:] == [0.0, 1.0]  # from its first logged value


def test_each_seed_starts_at_the_start_model(tmp_path):
    # a seed with one evaluated checkpoint is a line from (0, 0), as in the other figures, not a lone point
    change = {"mean": 0.4, "lo": 0.1, "hi": 0.7}
    summary = [{"run": run, "kl": kl, "gold_change": change, "proxy_change": change}
               for run, kl in (("proxy_s1", 1.5), ("proxy_s2", 0.8), ("proxy_s2", 2.0))]
    figure = seeds_figure(summary, ["proxy_s1", "proxy_s2"])
    for axis in figure.axes:
        one, two = (container.lines[0] for container in axis.containers)  # each seed's errorbar: its data line
        assert list(one.get_xdata()) == [0.0, 1.5] and list(one.get_ydata()) == [0.0, 0.4]
        assert list(two.get_xdata()) == [0.0, 0.8, 2.0]
