"""Repository-level conftest.

The plugin itself is loaded through its ``pytest11`` entry point (``pip install -e .``);
this file only makes a checkout safe to run offline: no library may phone home at
import time (litellm fetches a price map, Hugging Face libraries probe the Hub).
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
