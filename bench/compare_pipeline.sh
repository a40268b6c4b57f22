#!/bin/sh
# Thin wrapper: the Debian interpreter is the one that sees python3-torch (a pyenv python3 may shadow it).
exec /usr/bin/python3 "$(dirname "$0")/compare_pipeline.py" "$@"
