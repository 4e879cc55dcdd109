# Sourced by the local tools (deploy/local/stack, flink-sql, debezium-server, the test and demo
# commands, deploy/container/build, deploy/monitoring/install-promtool, deploy/local/install-toxiproxy): where downloads are kept,
# shared by every clone and state directory so that nothing is downloaded or built twice.
#
#   $WALBRIDGE_DOWNLOADS if set; else, for root, /var/cache/walbridge: PostgreSQL runs as the
#   `postgres` user there, and it could not reach binaries under root's home (mode 0700); else
#   ${XDG_CACHE_HOME:-~/.cache}/walbridge.
# tests/support/scratch_stack.py and deploy/kubernetes/check follow the same rule.
walbridge_download_cache() {
  if [[ -n "${WALBRIDGE_DOWNLOADS:-}" ]]; then
    echo "$WALBRIDGE_DOWNLOADS"
  elif [[ "$(id -u)" == 0 ]]; then
    echo /var/cache/walbridge
  else
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/walbridge"
  fi
}
