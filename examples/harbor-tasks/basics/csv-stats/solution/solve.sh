#!/bin/bash
python3 - <<'PY'
import csv, json
rows = list(csv.DictReader(open("/app/data.csv")))
values = [float(r["value"]) for r in rows]
json.dump({"mean": sum(values) / len(values), "count": len(values)}, open("/app/answer.json", "w"))
PY
