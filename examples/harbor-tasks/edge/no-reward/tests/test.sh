#!/bin/bash
echo "verifier: cannot import the checker" >&2
exit 3
