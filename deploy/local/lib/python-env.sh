# Sourced by deploy/local/test and deploy/local/demo: a virtualenv under $WALBRIDGE_HOME with walbridge
# installed in editable mode. Re-installs only when pyproject.toml, setup.py or the C extension's
# source (built in place by the editable install) changes.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
export WALBRIDGE_HOME="${WALBRIDGE_HOME:-$ROOT/.walbridge}"
VENV="$WALBRIDGE_HOME/venv"
# Spark's connector jars (1.2 GB with the S3 connector) are resolved into deploy/local/stack's
# download cache, shared by every clone, unless the caller chose another place.
source "$ROOT/deploy/local/lib/download-cache.sh"
export WALBRIDGE_SPARK_IVY_DIR="${WALBRIDGE_SPARK_IVY_DIR:-$(walbridge_download_cache)/ivy2}"

ensure_python_env() {
  local python="${WALBRIDGE_PYTHON:-python3}"
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    || { echo "walbridge needs Python 3.11 or newer ('$python' is $("$python" --version 2>&1))" >&2; exit 1; }
  local stamp="$VENV/.walbridge-installed" want
  want="$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT"/schemas/*.c | sha256sum | cut -d' ' -f1)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then return 0; fi
  echo "python-env: installing walbridge and its dependencies into $VENV" >&2
  mkdir -p "$WALBRIDGE_HOME/logs"
  [[ -x "$VENV/bin/python" ]] || "$python" -m venv "$VENV"
  local log="$WALBRIDGE_HOME/logs/pip.log"
  { "$VENV/bin/python" -m pip install -q --upgrade pip && "$VENV/bin/python" -m pip install -q -e "$ROOT[dev]"; } >"$log" 2>&1 \
    || { tail -n 30 "$log" >&2; echo "python-env: pip install failed (log: $log)" >&2; exit 1; }
  echo "$want" >"$stamp"
}
