"""Wikipedia -> Parquet shards as a Ray job:

    ray job submit --working-dir . -- python jobs/preprocess.py --dump enwiki.xml.bz2 --out /data/eae

Takes the arguments of `eae data build` (see `eae data build --help`)."""

import sys

from eae_platform.cli import main

if __name__ == "__main__":
    sys.exit(main(["data", "build", *sys.argv[1:]]))
