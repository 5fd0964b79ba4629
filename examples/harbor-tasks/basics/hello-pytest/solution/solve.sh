#!/bin/bash
# [solution.env] GREETING: the oracle alone gets it.
echo "$GREETING" > /app/hello.txt
