#!/bin/sh
echo "coverage reports are not available in the offline statecache build" >&2
exit 1
