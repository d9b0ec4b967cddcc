"""Library noise silenced before models load (ppo_rlhf/utils/quiet.py)."""

from __future__ import annotations

import logging

from ppo_rlhf.utils.quiet import quiet_libraries


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_deepspeed_cpu_notice_is_dropped_and_its_other_warnings_kept():
    # transformers' save_pretrained imports DeepSpeed wherever it is installed, which then warns on every CPU run
    logger = logging.getLogger("DeepSpeed")
    records = _Records()
    logger.addHandler(records)
    try:
        quiet_libraries()
        quiet_libraries()  # idempotent: one filter, not one per model load
        logger.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.")
        logger.warning("a warning of DeepSpeed's that says something")
    finally:
        logger.removeHandler(records)
    assert records.messages == ["a warning of DeepSpeed's that says something"]
    assert len(logger.filters) == 1
