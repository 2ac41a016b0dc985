"""What a resume of ``nxd train`` must match, asked before launch (``preflight``) and again by the
ranks when they restore (``loop``): one rule in one place."""

from __future__ import annotations


def data_position_refusal(saved_dp: int | None, dp: int, what: str) -> str | None:
    """Why the data position of ``what`` (written by ``saved_dp`` data-parallel ranks, one position
    each) cannot continue at ``dp`` ranks; None when it can (or the checkpoint records none)."""
    if saved_dp and saved_dp != dp:
        return (f"{what} was written with {saved_dp} data-parallel ranks and this run has {dp}: the data position "
                "cannot continue exactly")
    return None
