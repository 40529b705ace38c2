"""Pretraining as a Ray job:

    ray job submit --working-dir . -- python jobs/pretrain.py --config configs/pretrain-tiny.yaml [--set train.max_steps=200]

Takes the arguments of `eae pretrain` (see `eae pretrain --help`)."""

import sys

from eae_platform.cli import main

if __name__ == "__main__":
    sys.exit(main(["pretrain", *sys.argv[1:]]))
