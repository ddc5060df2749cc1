"""Advice: a catalog of independent rules, each from the analysis to at most one card."""

from __future__ import annotations

from perfmagic.advise.card import Card
from perfmagic.advise.catalog import Advice, advise

__all__ = ["Advice", "Card", "advise"]
