from ppo_rlhf.ppo.dashboard import dashboard_line, token_table_text

ROWS = [
    {"t": 0, "token": "Hello", "logp_old": -1.2, "logp_ref": -1.3, "value": -7.5, "reward": -0.005, "advantage": 7.9,
     "return": 0.4, "advantage_whitened": 1.25},
    {"t": 1, "token": "<|im_end|>", "logp_old": -0.2, "logp_ref": -0.3, "value": 0.1, "reward": 0.8, "advantage": 0.7,
     "return": 0.8, "advantage_whitened": -0.0},
]


def test_token_table_prints_raw_gae_and_whitened_advantage_in_own_columns():
    lines = token_table_text(ROWS, "header").splitlines()
    assert lines[0] == "header"
    assert lines[1].split() == ["t", "token", "log", "pi_old", "log", "pi_ref", "V(s_t)", "r_t", "A_t", "(GAE)",
                                "return", "A_t", "whitened"]
    assert lines[2].split() == ["0", "'Hello'", "-1.200", "-1.300", "-7.500", "-0.005", "+7.900", "+0.400", "+1.250"]
    assert lines[3].split()[-3:] == ["+0.700", "+0.800", "+0.000"]  # -0.0 printed as 0
    # every column's cells end where its title ends
    for title in ("V(s_t)", "A_t (GAE)", "return", "A_t whitened"):
        end = lines[1].index(title) + len(title)
        assert all(line[end - 1] != " " and (len(line) == end or line[end] == " ") for line in lines[2:])


def test_token_table_of_critic_free_estimators_names_the_estimator():
    header = token_table_text(ROWS, "header", "rloo").splitlines()[1]
    assert "A_t (RLOO)" in header and "whitened" not in header and "GAE" not in header


def test_the_dashboard_line_shows_a_multi_turn_runs_episodes():
    stats = {"iteration": 3, "score": 0.5, "ev": 0.25, "time_total": 9.0, "time_gen": 2.0, "time_score": 1.0,
             "time_update": 6.0}
    episodes = {"env_reward": 0.375, "turns": 2.25, "tool_calls": 1.0, "tool_errors": 0.125, "masked_share": 0.4}
    line = dashboard_line({**stats, **episodes})
    assert "ev +0.25  vclip -  env_r +0.38  turns 2.25  tools 1.00  tool_err 0.12  masked 0.40  (9s" in line
    assert "turns" not in dashboard_line(stats)  # a single-turn run's line is as before


def test_the_dashboard_line_shows_the_ev_gate_after_ev():
    stats = {"iteration": 3, "score": 0.5, "ev": -0.25, "ev_gate": 0.0, "time_total": 9.0, "time_gen": 2.0,
             "time_score": 1.0, "time_update": 6.0}
    assert "ev -0.25  gate 0  vclip -" in dashboard_line(stats)
    assert "gate" not in dashboard_line({k: v for k, v in stats.items() if k != "ev_gate"})


def test_unmeasured_numbers_are_a_dash_and_why_is_said_once():
    """A critic warm-up iteration has no policy step: clipfrac and approx_kl are '-' (not 'nan'), with one line
    saying why, the first time only; a negative k1 KL is explained once too."""
    from ppo_rlhf.ppo.dashboard import dashboard_notes

    nan = float("nan")
    warmup = {"iteration": 0, "phase": "critic-warmup", "kl": -0.01, "clipfrac": nan, "approx_kl": nan,
              "v_loss": 0.5, "ev": 0.1, "time_total": 9.0, "time_gen": 2.0, "time_score": 1.0, "time_update": 6.0}
    line = dashboard_line(warmup)
    assert "clipfrac -  approx_kl -" in line and "nan" not in line
    said: set[str] = set()
    notes = dashboard_notes(warmup, said)
    assert len(notes) == 2 and "critic warm-up" in notes[0] and "k1 estimate" in notes[1]
    assert dashboard_notes({**warmup, "iteration": 1}, said) == []  # said once per run
    same_length = {**warmup, "reward_length_corr": nan, "kl": 0.2}
    assert dashboard_notes(same_length, said) == [
        "(note: len_r is '-' when the batch's replies all have one length (or all one reward): no correlation to "
        "measure)"]
    # another KL estimator in the loss is not k1's: no note about its sign
    assert dashboard_notes({"kl": -0.1, "kl_used": "k3 in loss"}, set()) == []
