#!/bin/bash
# Convert the dashboard's snapshot pictures (tests/__snapshots__/**/*.svg) to PNG for looking at them.
# Needs rsvg-convert (Debian: librsvg2-bin). Output: build/snapshots/<test>/<name>.png
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/snapshots
mkdir -p "$out"
find tests/__snapshots__ -name '*.svg' | while read -r svg; do
    dir="$out/$(basename "$(dirname "$svg")")"
    mkdir -p "$dir"
    # xml:space="preserve": rsvg-convert would otherwise drop the spaces that start a styled text run
    sed 's/<svg /<svg xml:space="preserve" /' "$svg" | rsvg-convert -o "$dir/$(basename "${svg%.svg}").png"
done
echo "PNGs in $out"
