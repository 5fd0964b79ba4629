#!/bin/bash
python3 /tests/verify.py
