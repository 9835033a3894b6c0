#!/bin/sh
# A program under test that fails on every run: a message, then status 3.
echo "crash.sh: cannot read $1" >&2
exit 3
