"""More than one process: DDP, FSDP2 and DeepSpeed ZeRO (`distributed`, `zero`)."""
