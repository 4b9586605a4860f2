#!/usr/bin/env bash
# Builds the DocC reference of Replica's library modules with the toolchain's own `docc` (no plug-in package):
# symbol graphs from `swift build -emit-symbol-graph`, then `docc convert` of each module's catalog
# (Sources/<Module>/<Module>.docc). Fails when a symbol link (``Symbol``, <doc:Article>) does not resolve.
#
#   Scripts/build-docs.sh [OUTPUT_DIR]     (default .build/docs; open OUTPUT_DIR/<Module>.doccarchive with a DocC host,
#                                           or serve it statically: the archives are built for static hosting)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.build/docs}
modules=${DOCS_MODULES:-"Replica ReplicaTesting ReplicaPostgres"}
scratch=.build/docs-build
graphs=$scratch/symbol-graphs
swift=${SWIFT:-swift}
docc=${DOCC:-$(command -v docc || echo "$(dirname "$(command -v "$swift")")/docc")}

# The graphs directory is kept between runs: swift build writes a module's graph only when it compiles the module,
# so an up-to-date module keeps the graph of its last compilation.
mkdir -p "$graphs" "$out"
targets=()
for module in $modules; do
  [ -d "Sources/$module" ] && targets+=(--target "$module")
done
for target in "${targets[@]}"; do
  [ "$target" = --target ] && continue
  $swift build --scratch-path "$scratch" --target "$target" \
    -Xswiftc -emit-symbol-graph -Xswiftc -emit-extension-block-symbols -Xswiftc -emit-symbol-graph-dir -Xswiftc "$PWD/$graphs" >/dev/null
done

status=0
for module in $modules; do
  [ -d "Sources/$module/$module.docc" ] || continue
  if [ ! -f "$graphs/$module.symbols.json" ]; then
    echo "docs: no symbol graph for $module in $graphs (remove $scratch and run again)"; status=1; continue
  fi
  dir=$scratch/graphs-$module
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$graphs/$module.symbols.json" "$dir/"
  cp "$graphs/$module"@*.symbols.json "$dir/" 2>/dev/null || true
  log=$scratch/docc-$module.log
  if ! "$docc" convert "Sources/$module/$module.docc" --additional-symbol-graph-dir "$dir" \
      --fallback-display-name "$module" --fallback-bundle-identifier "org.replica.$module" \
      --output-path "$out/$module.doccarchive" >"$log" 2>&1; then
    cat "$log"; echo "docs: docc convert failed for $module"; status=1; continue
  fi
  # Broken links: a ``Symbol`` or <doc:Article> that names nothing, or names several things.
  broken=$(grep -E -A3 "^warning: .*(has no page|isn't available for linking|is ambiguous|doesn't exist|No symbol matched|can't be resolved|Topic reference)" "$log" || true)
  if [ -n "$broken" ]; then
    echo "$broken"; echo "docs: $module has broken symbol links (above)"; status=1
  fi
  warnings=$(grep -c '^warning:' "$log" || true)
  echo "docs: $module -> $out/$module.doccarchive ($warnings warnings; full log $log)"
done
exit $status
