#!/usr/bin/env bash
# Sets everything up and runs the main job: compile a sample .score file and
# show what flexc makes of it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
sample=samples/gemma2.score
echo "== flexc check $sample"
build/flexc check "$sample"
echo "== flexc ir $sample"
build/flexc ir "$sample"
