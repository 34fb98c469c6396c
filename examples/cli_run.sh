#!/usr/bin/env bash
# Run a recipe through the LightningCLI entry point: fit, then test from the saved checkpoint.
#   bash examples/cli_run.sh configs/vision/z_loss.yaml
set -euo pipefail
cfg=${1:-configs/vision/z_loss.yaml}
out=${2:-outputs/cli_run}
python -m lightning_modules fit --config "$cfg" --trainer.default_root_dir="$out"
ckpt=$(ls -t "$out"/lightning_logs/version_*/checkpoints/*.ckpt | head -1)
python -m lightning_modules test --config "$cfg" --trainer.default_root_dir="$out" --ckpt_path="$ckpt"
# print the resolved configuration (it can be fed back with --config)
python -m lightning_modules fit --config "$cfg" --print_config > "$out/config.yaml"
echo "resolved config written to $out/config.yaml"
