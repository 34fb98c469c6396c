"""Ranking / retrieval losses: scores ``(B, L)`` + positives, or positive / negative scores."""

__all__: list = []
