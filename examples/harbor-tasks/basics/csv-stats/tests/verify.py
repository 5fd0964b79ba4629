"""Scores /app/answer.json: one key per check, `reward` is 1 only when both hold."""

import json
from pathlib import Path

rewards = {"reward": 0.0, "mean_ok": 0.0, "count_ok": 0.0, "abs_error": 99.0}
try:
    answer = json.loads(Path("/app/answer.json").read_text())
    error = abs(float(answer["mean"]) - 4.0)
    rewards["abs_error"] = round(error, 6)
    rewards["mean_ok"] = float(error < 1e-6)
    rewards["count_ok"] = float(int(answer["count"]) == 4)
    rewards["reward"] = float(rewards["mean_ok"] == 1.0 and rewards["count_ok"] == 1.0)
except Exception as exc:
    print("no valid answer:", exc)
Path("/logs/verifier/reward.json").write_text(json.dumps(rewards))
print(rewards)
