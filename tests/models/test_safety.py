"""Safety: torch.load only with weights_only=True, trust_remote_code never on by default or literally."""

from __future__ import annotations

import re

from ppo_rlhf.ppo.train_config import TrainConfig

from reliability import REPO


def test_weights_load_safely_and_remote_code_is_opt_in():
    import inspect

    import ppo_rlhf.models.loading as models

    sources = {str(path): path.read_text() for path in (REPO / "ppo_rlhf").rglob("*.py")}
    for name, text in sources.items():
        for match in re.finditer(r"torch\.load\(", text):
            depth, end = 1, match.end()
            while depth and end < len(text):  # the whole call, up to its matching parenthesis
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                end += 1
            assert "weights_only=True" in text[match.end(): end], f"{name}: torch.load without weights_only=True"
        assert not re.search(r"trust_remote_code\s*=\s*True", text), f"{name} passes trust_remote_code=True"
        assert not re.search(r"\bpickle\.loads?\(|\bnp\.load\([^)]*allow_pickle\s*=\s*True", text), f"{name} unpickles"
    assert TrainConfig.trust_remote_code is False
    for fn_name, fn in inspect.getmembers(models, inspect.isfunction):
        parameter = inspect.signature(fn).parameters.get("trust_remote_code")
        assert parameter is None or parameter.default is False, fn_name
    from ppo_rlhf.cli import build_parser

    args = build_parser(only="train").parse_args(["train"])
    assert not hasattr(args, "trust_remote_code")  # the config default (False) applies unless the flag is given
