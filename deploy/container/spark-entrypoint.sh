#!/usr/bin/env bash
# Entrypoint of the consumer image. Spark on Kubernetes starts the driver pod with
# `driver <spark-submit arguments>` and each executor pod with `executor`, passing the executor's
# settings as SPARK_* variables; anything else runs as given (`walbridge-consumer run`, a shell).
# Spark's own entrypoint lives only in the apache/spark images (see consumer.Containerfile for
# why this image does not start from them), so this is the small part of it the image needs.
set -euo pipefail

SPARK_HOME="${SPARK_HOME:-/opt/spark}"
JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"

case "${1:-}" in
  driver)
    shift
    # The driver binds to its pod IP; executors reach it through the driver's headless Service.
    exec "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:?Spark sets SPARK_DRIVER_BIND_ADDRESS for the driver pod}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
      --deploy-mode client \
      "$@"
    ;;
  executor)
    shift
    # Spark passes extra JVM options as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ... in order.
    java_opts=()
    while IFS='=' read -r name _; do
      java_opts+=("${!name}")
    done < <(env | grep -E '^SPARK_JAVA_OPT_[0-9]+=' | sort -t_ -k4 -n)
    exec "$JAVA" "${java_opts[@]}" \
      -Xms"${SPARK_EXECUTOR_MEMORY:?}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${SPARK_CLASSPATH:+$SPARK_CLASSPATH:}${SPARK_CONF_DIR:-$SPARK_HOME/conf}:$SPARK_HOME/jars/*" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL:?}" \
      --executor-id "${SPARK_EXECUTOR_ID:?}" \
      --cores "${SPARK_EXECUTOR_CORES:?}" \
      --app-id "${SPARK_APPLICATION_ID:?}" \
      --hostname "${SPARK_EXECUTOR_POD_IP:?}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME:?}"
    ;;
  *)
    exec "$@"
    ;;
esac
