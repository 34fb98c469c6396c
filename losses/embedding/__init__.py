"""Embedding losses: embeddings ``(N, D)`` + class ids ``(N,)``; some own a head (class weights)."""

__all__: list = []
