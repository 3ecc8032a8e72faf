# Sourced by scripts/test.sh and scripts/test_vllm.sh: where the tests' temporary files go.
# The round trips and the vLLM runs write a few GB at peak; when TMPDIR is unset and /tmp has
# less room than that while the checkout's disk has more (a small tmpfs /tmp, say), they go to
# .test-tmp/ in the checkout instead (ignored by git).  The line printed says which and how much.
_avail_kb() { df -Pk "$1" | awk 'NR == 2 {print $4}'; }
if [ -z "${TMPDIR:-}" ] && [ "$(_avail_kb /tmp)" -lt 4000000 ] && [ "$(_avail_kb .)" -gt "$(_avail_kb /tmp)" ]; then
  mkdir -p .test-tmp
  TMPDIR=$PWD/.test-tmp
  export TMPDIR
fi
df -h "${TMPDIR:-/tmp}" | awk -v d="${TMPDIR:-/tmp}" 'NR == 2 {print "test temp files in " d ": " $4 " free of " $2}'
