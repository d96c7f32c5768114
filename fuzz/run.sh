#!/usr/bin/env bash
# The fuzz tier (`make fuzz`, Note [fuzz targets] in fuzz/CMakeLists.txt): every fuzz target of a build runs for a
# bounded time over its corpus, FUZZ_JOBS (default 2) at a time. New inputs go to BUILD/fuzz-run/corpus/, never
# into fuzz/corpus/. Fails naming each target that found something, with its log and the saved input.
# Usage: fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET]    (reproduce a finding: BUILD_DIR/fuzz/TARGET INPUT)
set -euo pipefail
if [ $# -lt 1 ] || [ ! -d "$1/fuzz" ]; then
  echo "usage: fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET]; BUILD_DIR must hold a -DMP_FUZZ=ON build (make fuzz)" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
seconds=${2:-45}
src=$(cd "$(dirname "$0")" && pwd)
out=$build/fuzz-run
mkdir -p "$out"
# The targets write each input to a file (the readers take paths) and the safetensors and kernel-path targets save
# files too (fsync'd: atomic_write_file): on tmpfs that is ten times as many inputs per second as on a disk.
scratch=$(mktemp -d /dev/shm/mixprec-fuzz.XXXXXX 2>/dev/null || mktemp -d "$out/tmp.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
# The JSON readers get the JSON dictionary.
json_targets=" fuzz_safetensors fuzz_run_log fuzz_config fuzz_kernel_path_cache "

run_one() {
  local t=$1 dict=()
  [[ "$json_targets" == *" $t "* ]] && dict=(-dict="$src/json.dict")
  mkdir -p "$out/corpus/$t"
  rm -f "$out/$t".crash-* "$out/$t".timeout-* "$out/$t".oom-* "$out/$t".leak-*
  # detect_leaks=0: the runtime state and kernel caches are leaked on purpose (freed by the OS at exit).
  if ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 TMPDIR="$scratch" \
     "$build/fuzz/$t" "$out/corpus/$t" "$src/corpus/$t" "${dict[@]}" -max_total_time="$seconds" -timeout=10 \
     -rss_limit_mb=2048 -artifact_prefix="$out/$t." -print_final_stats=1 >"$out/$t.log" 2>&1; then
    echo "fuzz: $t: $(grep -m1 '^Done' "$out/$t.log" || echo done), no finding"
  else
    echo "fuzz: $t FOUND SOMETHING: log $out/$t.log, input $(ls "$out/$t".*-* 2>/dev/null | head -1)"
    grep -m3 -E 'fuzz finding|runtime error|ERROR: (AddressSanitizer|libFuzzer)|SUMMARY' "$out/$t.log" || tail -20 "$out/$t.log"
    return 1
  fi
}
export -f run_one
export build out src seconds json_targets scratch

targets=$(cd "$src" && ls fuzz_*.cpp | sed 's/\.cpp$//')
for t in $targets; do
  [ -x "$build/fuzz/$t" ] || { echo "fuzz: $build/fuzz/$t is not built; run make fuzz" >&2; exit 2; }
done
start=$(date +%s)
if printf '%s\n' $targets | xargs -P "${FUZZ_JOBS:-2}" -I{} bash -c 'run_one {}'; then
  echo "fuzz: $(echo $targets | wc -w) targets, ${seconds}s each, no finding ($(( $(date +%s) - start ))s)"
else
  echo "fuzz: a target found something (above); fix the reader and add a regression test (Note [fuzz targets])" >&2
  exit 1
fi
