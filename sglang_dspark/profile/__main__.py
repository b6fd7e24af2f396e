import os
import sys

from sglang_dspark.profile.cli import main

if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
