#!/usr/bin/env bash
# The test command (README): its body is tools/ci/test.sh, with the other CI scripts.
exec "$(dirname "$0")/ci/test.sh" "$@"
