#!/usr/bin/env bash
# Start a local PostgreSQL server for the shared-tuning-storage test and export its URL as
# GRAPHOPT_TEST_POSTGRES_URL. Best effort: where no server can be installed or started, say why
# and leave the variable unset, and the test skips with that reason. Source it from .ci/run.
_graphopt_postgres() {
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then
        echo "postgres: installing Debian's postgresql package"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) \
            >/dev/null 2>&1 || { echo "postgres: cannot install postgresql; its test will skip"; return 0; }
    fi
    local version
    version=$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1) || true
    if [ -z "$version" ]; then
        echo "postgres: no server binaries under /usr/lib/postgresql; its test will skip"
        return 0
    fi
    if ! pg_lsclusters -h 2>/dev/null | grep -q "^$version main"; then
        pg_createcluster "$version" main >/dev/null 2>&1 || true
    fi
    pg_ctlcluster "$version" main start >/dev/null 2>&1 || true
    if ! pg_lsclusters -h 2>/dev/null | grep -q "^$version main .* online"; then
        echo "postgres: the $version/main cluster does not start; its test will skip"
        return 0
    fi
    # Loopback only; a throwaway role and database that every run recreates.
    su postgres -c "psql -q -v ON_ERROR_STOP=1" >/dev/null 2>&1 <<'SQL' || { echo "postgres: cannot create the test role"; return 0; }
DROP DATABASE IF EXISTS graphopt_test;
DROP ROLE IF EXISTS graphopt_test;
CREATE ROLE graphopt_test LOGIN PASSWORD 'graphopt_test';
CREATE DATABASE graphopt_test OWNER graphopt_test;
SQL
    local port
    port=$(pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $3}') || true
    export GRAPHOPT_TEST_POSTGRES_URL="postgresql+psycopg://graphopt_test:graphopt_test@127.0.0.1:${port}/graphopt_test"
    echo "postgres: $version/main on 127.0.0.1:$port for the shared-storage test"
}
_graphopt_postgres
