#!/usr/bin/env bash
# The settings table of docs/environment.md must be exactly what the settings
# registry (src/util/params.def) declares, as meshccl_info --markdown prints it,
# between the doc's begin and end markers. Regenerate it with:
# build/tools/meshccl_info --markdown
set -euo pipefail
info="$1"
doc="$2"
want=$(env -i "$info" --markdown)
have=$(awk '/^<!-- begin: meshccl_info --markdown -->$/ {on = 1; next} /^<!-- end: meshccl_info --markdown -->$/ {exit} on {print}' "$doc")
if [ "$want" != "$have" ]; then
  echo "docs/environment.md is out of date with src/util/params.def:"
  diff <(echo "$have") <(echo "$want") || true
  exit 1
fi
echo "docs/environment.md matches the settings registry ($(echo "$want" | wc -l) lines)"
