#!/bin/bash
touch /app/anything.txt
