"""Library noise a user can do nothing about, silenced before models load: transformers draws a "Loading weights"
progress bar at every model load (13 in a demo, each over in milliseconds), and peft reads transformers' deprecated
`is_gradient_checkpointing` whenever it wraps a model, which repeats a FutureWarning about code that is not ours.
Where DeepSpeed is installed, transformers' `save_pretrained` (through accelerate's unwrapping) imports it on every
plain CPU run, and DeepSpeed warns at import that it is "Setting accelerator to CPU": true, and nothing to act on."""

from __future__ import annotations

import logging
import warnings

from huggingface_hub import utils as hub_utils
from transformers.utils import logging as transformers_logging


def quiet_libraries() -> None:
    """Idempotent. Called at each model load rather than once at import: test runners reset warning filters."""
    downloads_shown = not hub_utils.are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()  # also turns off the hub's bars ...
    if downloads_shown:
        hub_utils.enable_progress_bars()  # ... but a first download can take minutes: keep showing it
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    deepspeed_logger = logging.getLogger("DeepSpeed")  # DeepSpeed's own logger; it resets the level, not the filters
    if _deepspeed_cpu_notice not in deepspeed_logger.filters:
        deepspeed_logger.addFilter(_deepspeed_cpu_notice)


def _deepspeed_cpu_notice(record: logging.LogRecord) -> bool:
    """False (drop it) for DeepSpeed's "Setting accelerator to CPU" only; its other messages pass."""
    return not record.getMessage().startswith("Setting accelerator to CPU")
