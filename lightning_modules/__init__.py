"""LightningModules, DataModules and the LightningCLI entry point for benchmarking the losses.

Imports only ``pytorch_lightning`` (never ``lightning.pytorch``). Depends on ``losses``; the
reverse dependency never exists.
"""
