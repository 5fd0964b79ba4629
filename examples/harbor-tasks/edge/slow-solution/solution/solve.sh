#!/bin/bash
sleep 120
echo done > /app/status.txt
