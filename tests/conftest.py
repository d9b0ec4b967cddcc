import os
import sys
from pathlib import Path

import pytest
import torch

# Tiny models gain nothing from a second thread, and on a shared 2-core machine threads fight each other.
torch.set_num_threads(1)

sys.path.insert(0, str(Path(__file__).parent))

import tiny  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--device", choices=("cpu", "cuda"), default="cpu",
                     help="where the tiny-model tests run: cpu (the default; CUDA is hidden, so a config's device "
                          "auto is the CPU too) or cuda (configs with device auto, i.e. the model tests that "
                          "bench/gpu_check.py lists, run on the GPU; tests that name the CPU stay there)")


def pytest_configure(config):
    """--device: set before any test imports a model or touches CUDA (torch initialises CUDA lazily)."""
    device = config.getoption("--device")
    if device == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: CUDA is not available here")
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # subprocesses (the distributed tests' workers) inherit it too


@pytest.fixture(scope="session")
def device(pytestconfig) -> torch.device:
    """The device of this run (--device): for tests that place tiny models themselves."""
    return torch.device(pytestconfig.getoption("--device"))


@pytest.fixture(scope="session")
def tokenizer():
    return tiny.tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory, tokenizer):
    """A tiny policy folder and a tiny reward-model folder, saved like hub downloads."""
    root = tmp_path_factory.mktemp("tiny_models")
    policy = tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, root / "policy")
    reward = tiny.save_tiny(tiny.tiny_reward_model(tokenizer), tokenizer, root / "reward")
    return {"policy": policy, "reward": reward}


@pytest.fixture(scope="module")
def env(tmp_path_factory, tiny_model_dirs):
    """The reliability tests' tiny models and prompts file (tests/reliability.py)."""
    import json

    from transformers.utils import logging as hf_logging

    from reliability import PROMPTS

    hf_logging.disable_progress_bar()  # transformers' "Loading weights" bars are not ours; stderr is one error line
    root = tmp_path_factory.mktemp("reliability")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    yield {"policy": str(tiny_model_dirs["policy"]), "reward": str(tiny_model_dirs["reward"]),
           "prompts": str(prompts), "root": root}
    hf_logging.enable_progress_bar()


# Under pytest-xdist (`make test` runs -n auto) each worker process counts the survivals of its own tests; the workers
# hand their counts to the controller, which prints the sum.
_WORKERS_SURVIVAL: dict[str, list[int]] = {}


def _survival_counts() -> dict[str, list[int]]:
    counts = getattr(sys.modules.get("reliability"), "RELIABILITY_SURVIVAL", None)
    return {name: list(pair) for name, pair in counts.items()} if isinstance(counts, dict) else {}


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)  # set only inside an xdist worker
    if workeroutput is not None:
        workeroutput["reliability_survival"] = _survival_counts()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    for name, (tried, survived) in getattr(node, "workeroutput", {}).get("reliability_survival", {}).items():
        total = _WORKERS_SURVIVAL.setdefault(name, [0, 0])
        total[0] += tried
        total[1] += survived


def pytest_terminal_summary(terminalreporter):
    """The reliability tests' survival counts (tests/reliability.py's RELIABILITY_SURVIVAL), shown even with -q."""
    counts = _survival_counts()
    for name, (tried, survived) in _WORKERS_SURVIVAL.items():
        counts.setdefault(name, [0, 0])
        counts[name] = [counts[name][0] + tried, counts[name][1] + survived]
    if any(tried for tried, _ in counts.values()):
        parts = [f"{name}: {survived}/{tried} survived" for name, (tried, survived) in counts.items()]
        terminalreporter.write_line("reliability: " + ", ".join(parts))
