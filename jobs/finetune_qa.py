"""QA fine-tuning as a Ray job:

    ray job submit --working-dir . -- python jobs/finetune_qa.py --init models:/eae@pretrained --data synth:runs/world

Takes the arguments of `eae finetune qa` (see `eae finetune qa --help`)."""

import sys

from eae_platform.cli import main

if __name__ == "__main__":
    sys.exit(main(["finetune", "qa", *sys.argv[1:]]))
