"""A Ray Tune sweep of QA fine-tuning as a Ray job:

    ray job submit --working-dir . -- python jobs/tune.py --space tune_spaces/synth.yaml --set finetune.init=...

Takes the arguments of `eae tune` (see `eae tune --help`)."""

import sys

from eae_platform.cli import main

if __name__ == "__main__":
    sys.exit(main(["tune", *sys.argv[1:]]))
