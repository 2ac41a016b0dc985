"""``neuronx_distributed.utils.logger``: NxD's logger factory on the standard logging module."""

import logging
import os

_LEVEL = os.environ.get("NXD_LOG_LEVEL", "INFO").upper()


def get_log_level() -> int:
    return logging.getLevelName(_LEVEL) if isinstance(logging.getLevelName(_LEVEL), int) else logging.INFO


def get_logger(name: str = "neuronx_distributed", rank0_only: bool = True) -> logging.Logger:
    """A logger named ``name`` at ``NXD_LOG_LEVEL`` (INFO); with ``rank0_only`` other ranks log errors only."""
    logger = logging.getLogger(name)
    level = get_log_level()
    if rank0_only:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            level = logging.ERROR
    logger.setLevel(level)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    return logger
