#!/usr/bin/env bash
# The Python client's checks: ruff format, ruff lint, pytest. Installs what it needs first
# (quietly; pip skips what is already there). torch is optional: its tests skip without it, and
# tests marked gpu skip without a CUDA device. KvikIO (kvikio-cu12, the gpu-cu12 extra) and
# pyarrow are installed when pip can get them (KvikIO only with MILLRACE_TEST_KVIKIO=1): KvikIO
# 26.10 imports without a GPU but needs the CUDA driver (libcuda.so.1) for any transfer, so
# without one its tests skip by name with that reason.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
  numpy safetensors pytest hypothesis ruff matplotlib >/dev/null || exit 1
extras=(pyarrow)
# KvikIO brings 2.5 GB of CUDA libraries and, without a GPU, can move no byte here: it is
# installed where asked (MILLRACE_TEST_KVIKIO=1, as on a GPU machine); its tests skip by name
# otherwise.
[[ ${MILLRACE_TEST_KVIKIO:-0} != 0 ]] && extras+=(kvikio-cu12)
if ! "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
  "${extras[@]}" >/dev/null 2>&1; then
  echo "note: could not install ${extras[*]}; the tests that need them skip" >&2
fi
if ! "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps \
  -e . >/dev/null 2>&1; then
  echo "note: 'pip install -e python' failed; testing the source tree through PYTHONPATH" >&2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -m ruff format --check . || exit 1
"$PY" -m ruff check . || exit 1
# Each skipped test is named with its reason; under scripts/test.sh (MILLRACE_SKIPS) they are
# counted in its summary as skipped, never as passed.
out=$(mktemp)
"$PY" -m pytest -q -p no:cacheprovider -rs --no-fold-skipped tests "$@" | tee "$out"
rc=${PIPESTATUS[0]}
if [[ -n ${MILLRACE_SKIPS:-} ]]; then
  sed -n 's/^SKIPPED \(.*\)$/python: \1/p' "$out" >> "$MILLRACE_SKIPS"
fi
rm -f "$out"
if [[ $rc -eq 5 ]]; then echo "pytest collected no tests" >&2; exit 1; fi
exit $rc
