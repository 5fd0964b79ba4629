#!/bin/bash
python3 - <<'PY'
import os, urllib.request
try:
    with urllib.request.urlopen(os.environ["DATA_URL"], timeout=20) as response:
        open("/app/value.txt", "w").write(response.read().decode().strip())
    print("fetched")
except Exception as exc:
    print("could not fetch:", exc)
PY
