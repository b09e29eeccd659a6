"""Kubernetes quantities as numbers (pure): lightkube's parser, None for what is not one."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from lightkube.utils.quantity import parse_quantity as _parse


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity as a number ("1Gi" == "1024Mi", "500m" == "0.5"); None when it
    is not one."""
    if value is None:
        return None
    try:
        return _parse(str(value).strip())
    except (ValueError, TypeError, ArithmeticError):
        return None
