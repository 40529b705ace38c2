"""An evaluation as a Ray job:

    ray job submit --working-dir . -- python jobs/eval.py masked --model models:/eae@pretrained --data runs/data

Takes the arguments of `eae eval` (see `eae eval --help`)."""

import sys

from eae_platform.cli import main

if __name__ == "__main__":
    sys.exit(main(["eval", *sys.argv[1:]]))
