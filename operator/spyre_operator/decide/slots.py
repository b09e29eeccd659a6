"""A budget's answer for one model (a :class:`Slot`) and the waiting model's recheck period:
what the pure decisions read. The counting, the waiting order and the reservations are the
controller's (control/budgets.py)."""

from __future__ import annotations

from dataclasses import dataclass

#: A waiting model is reconciled again at least this often (a slot freed while no event came).
WAITING_RECHECK_SECONDS = 60.0


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True)
class Slot:
    """One budget's answer for one model: may it start (a Job, a rollout) now?

    ``limit`` 0 means no budget (always free).
    """

    free: bool = True
    in_use: int = 0
    limit: int = 0
    #: 1-based place among the models waiting for this budget (0: not asked).
    position: int = 0
    #: The slots the model's namespace holds, and its cap (0: none); whether that cap is what
    #: holds the model back.
    ns_in_use: int = 0
    ns_limit: int = 0
    namespace_full: bool = False

    def message(self, what: str, flag: str) -> str:
        """E.g. "3 of 3 precompile slots in use (max-concurrent-compiles); queued 5th", or
        "2 of 2 precompile slots of this namespace in use
        (max-concurrent-compiles-per-namespace); queued 3rd"."""
        if self.namespace_full:
            return (
                f"{self.ns_in_use} of {self.ns_limit} {what} slots of this namespace in use "
                f"({flag}-per-namespace); queued {ordinal(self.position)}"
            )
        return (
            f"{self.in_use} of {self.limit} {what} slots in use ({flag}); "
            f"queued {ordinal(self.position)}"
        )


FREE = Slot()
