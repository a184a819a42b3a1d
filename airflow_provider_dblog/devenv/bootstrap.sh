#!/usr/bin/env bash
# Local set-up for airflow-provider-dblog on Debian 12 (idempotent; quick when done).
#
#   1. Debian packages (only when missing): mariadb-server, redis-server,
#      postgresql-15, libmariadb-java, libpostgresql-jdbc-java, a Java runtime,
#      chromium (the browser tests drive it with Playwright, which cannot
#      download its own browser here).
#   2. <repo>/.venv with `pip install -e '.[test]'` (skipped while the stamp
#      .venv/.installed-<hash of setup.cfg + pyproject.toml> exists).
#   3. Checks that pyspark and pyspark-client agree on their version.
#   4. Starts the private MariaDB (13306), PostgreSQL (15432) and Redis (16379)
#      via `python -m airflow_provider_dblog.devenv.servers start`.
#
# Environment: PYTHON (interpreter for the venv, default python3),
# DBLOG_LOCAL_DIR (server base dir), DBLOG_SKIP_SERVERS=1 (skip step 4).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="$REPO/.venv"
PYTHON="${PYTHON:-python3}"
export DEBIAN_FRONTEND=noninteractive
T0=$SECONDS

log() { printf '[bootstrap %3ds] %s\n' "$((SECONDS - T0))" "$*"; }
die() { printf '[bootstrap] ERROR: %s\n' "$*" >&2; exit 1; }

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=(sudo); fi
fi

# --------------------------------------------------------------------------- #
# 1. Debian packages
# --------------------------------------------------------------------------- #
pkg_installed() { dpkg -s "$1" 2>/dev/null | grep -q '^Status: install ok installed'; }

missing=()
for p in mariadb-server redis-server postgresql-15 libmariadb-java libpostgresql-jdbc-java chromium; do
    pkg_installed "$p" || missing+=("$p")
done
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
command -v make >/dev/null 2>&1 || missing+=(make)
if ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    # Only Debian's own python3 can be fixed with a package.
    if [ "$(command -v "$PYTHON")" = /usr/bin/python3 ]; then missing+=(python3-venv); fi
fi

POLICY=/usr/sbin/policy-rc.d
OUR_POLICY=0
remove_policy() { if [ "$OUR_POLICY" = 1 ]; then "${SUDO[@]}" rm -f "$POLICY"; OUR_POLICY=0; fi; }
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    if [ "$(id -u)" -ne 0 ] && [ "${#SUDO[@]}" -eq 0 ]; then
        die "missing packages (${missing[*]}) and not root (no sudo): install them first"
    fi
    # Keep apt from starting (or failing to start) the system-wide MariaDB /
    # PostgreSQL / Redis: we only run private instances on our own ports. A
    # failed service start in a postinst would leave dpkg half-configured.
    if [ ! -e "$POLICY" ]; then
        printf '#!/bin/sh\n# temporary, from airflow-provider-dblog bootstrap.sh\nexit 101\n' \
            | "${SUDO[@]}" tee "$POLICY" >/dev/null
        "${SUDO[@]}" chmod 755 "$POLICY"
        OUR_POLICY=1
        trap remove_policy EXIT
    fi
    # openjdk's postinst fails on slim images without this directory.
    "${SUDO[@]}" mkdir -p /usr/share/man/man1
    if [ -n "$(dpkg --audit 2>/dev/null || true)" ]; then
        log "dpkg reports unfinished packages: running dpkg --configure -a"
        "${SUDO[@]}" dpkg --configure -a || true
    fi
    "${SUDO[@]}" apt-get update -q
    "${SUDO[@]}" apt-get install -y -q -o DPkg::Lock::Timeout=300 "${missing[@]}"
    if [ -n "$(dpkg --audit 2>/dev/null || true)" ]; then
        log "WARNING: dpkg still reports unfinished packages (system services are not used; continuing):"
        dpkg --audit || true
    fi
    remove_policy
    trap - EXIT
    log "Debian packages installed"
else
    log "Debian packages: all present"
fi

for f in /usr/sbin/mariadbd /usr/bin/mariadb-install-db /usr/bin/redis-server \
         /usr/lib/postgresql/15/bin/initdb /usr/lib/postgresql/15/bin/pg_ctl \
         /usr/share/java/mariadb-java-client.jar /usr/share/java/postgresql.jar /usr/bin/chromium; do
    [ -e "$f" ] || die "$f is missing after the package install"
done
java_major="$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)"
[ -n "$java_major" ] && [ "$java_major" -ge 17 ] \
    || die "Spark 4 needs Java >= 17, found: $(java -version 2>&1 | head -n1) (apt-get install openjdk-17-jre-headless)"

# --------------------------------------------------------------------------- #
# 2. Virtualenv
# --------------------------------------------------------------------------- #
cd "$REPO"
venv_ok() {
    [ -x "$VENV/bin/python" ] \
        && "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1
}
if ! venv_ok; then
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "$PYTHON is $("$PYTHON" -V 2>&1); Python >= 3.11 is required (set PYTHON=...)"
    log "creating virtualenv $VENV with $("$PYTHON" -V 2>&1)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
fi

STAMP="$VENV/.installed-$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && ! "$VENV/bin/python" -c \
        'import importlib.metadata as m; m.distribution("airflow-provider-dblog")' >/dev/null 2>&1; then
    rm -f "$STAMP"   # the stamp lies: the project is not installed
fi
if [ ! -f "$STAMP" ]; then
    log "upgrading pip"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    log "pip install -e '.[test]' (a cold pip cache builds the pyspark sdist: several minutes)"
    "$VENV/bin/python" -m pip install --progress-bar off -e '.[test]'
    rm -f "$VENV"/.installed-*
    touch "$STAMP"
    log "venv ready"
else
    log "venv up to date ($(basename "$STAMP"))"
fi

# --------------------------------------------------------------------------- #
# 3. pyspark and pyspark-client share the pyspark/ package: versions must agree
# --------------------------------------------------------------------------- #
imported="$("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)')" \
    || die "cannot import pyspark from $VENV"
shown="$("$VENV/bin/python" -m pip show pyspark pyspark-client 2>/dev/null \
         | awk '/^Name:/{n=$2} /^Version:/{print n"="$2}')"
v_pyspark="$(printf '%s\n' "$shown" | sed -n 's/^pyspark=//p')"
v_client="$(printf '%s\n' "$shown" | sed -n 's/^pyspark-client=//p')"
if [ -z "$v_pyspark" ] || [ "$v_pyspark" != "$imported" ] \
        || { [ -n "$v_client" ] && [ "$v_client" != "$imported" ]; }; then
    die "pyspark version mismatch: import pyspark -> $imported, pip: pyspark=${v_pyspark:-none}," \
        "pyspark-client=${v_client:-none}. pyspark-client overwrites pyspark/; pin both to the same" \
        "version in setup.cfg, then: rm -f $VENV/.installed-* && $0"
fi
[ -x "$VENV/bin/spark-submit" ] || die "$VENV/bin/spark-submit missing (pyspark install incomplete)"
log "pyspark $imported (pyspark-client ${v_client:-not installed}), java $java_major"

# --------------------------------------------------------------------------- #
# 4. Private servers
# --------------------------------------------------------------------------- #
if [ "${DBLOG_SKIP_SERVERS:-0}" != 1 ]; then
    log "starting private servers"
    "$VENV/bin/python" -m airflow_provider_dblog.devenv.servers start
fi
log "done"
