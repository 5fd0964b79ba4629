#!/bin/bash
if [ "$(cat /app/value.txt 2>/dev/null)" = "harbor-value-7" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
