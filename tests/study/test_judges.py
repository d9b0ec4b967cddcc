import pytest

from ppo_rlhf.errors import UsageError
from ppo_rlhf.study.judges import GoldJudge, NonToxicJudge, RewardModelJudge, VaderJudge, check_finite, make_judge

PROMPTS = ["Say something.", "Say something."]


def test_vader_prefers_positive_text():
    scores = VaderJudge().score(PROMPTS, ["I love this wonderful, happy day!", "I hate this awful, terrible day."])
    assert scores[0] > 0.5 and scores[1] < -0.5


def test_nontoxic_prefers_clean_text():
    scores = NonToxicJudge().score(PROMPTS, ["Have a nice day, my friend.", "You are a fucking stupid idiot."])
    assert 0 <= scores[1] < 0.5 < scores[0] <= 1


def test_gold_orders_friendly_clean_above_hostile_and_neutral():
    replies = ["Thank you, that is a lovely and kind idea!", "The box is on the table.",
               "Shut up, you worthless piece of shit."]
    friendly, neutral, hostile = GoldJudge().score(PROMPTS + PROMPTS[:1], replies)
    assert friendly > neutral > hostile
    assert all(-1 <= s <= 1 for s in (friendly, neutral, hostile))
    assert GoldJudge().score([], []) == []


def test_make_judge_specs(tiny_model_dirs):
    assert make_judge("vader").name == "vader"
    assert make_judge("nontoxic").name == "nontoxic"
    assert make_judge("gold").name == "gold"
    for spec in ("rm:" + str(tiny_model_dirs["reward"]), str(tiny_model_dirs["reward"])):
        judge = make_judge(spec)
        assert isinstance(judge, RewardModelJudge)
        scores = judge.score(["Tell me a story."] * 2, ["Once upon a time.", "The end."])
        assert len(scores) == 2 and scores[0] != scores[1]
    with pytest.raises(UsageError, match="unknown judge"):
        make_judge("best")
    with pytest.raises(UsageError):
        make_judge("rm:")


def test_non_finite_score_names_judge_and_text():
    with pytest.raises(UsageError, match=r"judge fake .*'a very bad reply'"):
        check_finite("fake", ["fine", "a very bad reply"], [0.5, float("nan")])
    with pytest.raises(UsageError, match=r"\.\.\."):  # long texts are truncated in the message
        check_finite("fake", ["x" * 500], [float("inf")])
    assert check_finite("fake", ["ok"], [1]) == [1.0]


def test_reward_model_judge_rejects_nan(tiny_model_dirs):
    judge = make_judge("rm:" + str(tiny_model_dirs["reward"]))
    judge.model.score.weight.data.fill_(float("nan"))
    with pytest.raises(UsageError, match=r"rm:.*non-finite.*'The end.'"):
        judge.score(["Tell me a story."], ["The end."])


def test_rm_judge_refuses_a_model_without_a_trained_score_head(tiny_model_dirs):
    """Issue 29: rm:<a causal LM> scored with a random head in silence; rm-init-head: asks for one on purpose."""
    policy = str(tiny_model_dirs["policy"])
    for spec in ("rm:" + policy, policy):
        with pytest.raises(UsageError, match=rf"judge rm:.*causal LM \(LlamaForCausalLM\).*rm-init-head:{policy}"):
            make_judge(spec)
    judge = make_judge("rm-init-head:" + policy)
    assert judge.name == "rm-init-head:" + policy and len(judge.score(["Hi"], ["Hello."])) == 1
    with pytest.raises(UsageError, match="rm-init-head: needs"):
        make_judge("rm-init-head:")
