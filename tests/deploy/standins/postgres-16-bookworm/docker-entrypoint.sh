#!/bin/sh
# The postgres stand-in's entrypoint: a test fixture that behaves as the official image's does
# where compose.yaml relies on it. POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB set up the
# first start on an empty PGDATA; that first start runs a temporary server on the Unix socket
# only (so a TCP client is refused until it is over), runs /docker-entrypoint-initdb.d/*.sh and
# *.sql in it, stops it, and then starts the real server on every address. Any command other
# than `postgres` (psql, pg_isready) runs as given.
set -eu

case "${1:-}" in
  -*) set -- postgres "$@" ;;
esac
if [ "${1:-}" != postgres ]; then
  exec "$@"
fi

PGDATA="${PGDATA:-/var/lib/postgresql/data}"
export PGDATA
if [ "$(id -u)" = 0 ]; then
  # A fresh named volume belongs to root: hand it to the server's user, then drop to it.
  mkdir -p "$PGDATA" /var/run/postgresql
  chown postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?is required on the first start, as in the official image}"
  user="${POSTGRES_USER:-postgres}"
  db="${POSTGRES_DB:-$user}"
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"

  pg_ctl --wait --silent -o "-c listen_addresses=''" start
  if [ "$db" != postgres ]; then
    psql --quiet -v ON_ERROR_STOP=1 --username="$user" --dbname=postgres -v db="$db" <<'SQL'
CREATE DATABASE :"db";
SQL
  fi
  for f in /docker-entrypoint-initdb.d/*; do
    case "$f" in
      *.sh) echo "entrypoint: running $f"; . "$f" ;;
      *.sql) echo "entrypoint: running $f"
             psql -v ON_ERROR_STOP=1 --username="$user" --dbname="$db" -f "$f" ;;
    esac
  done
  pg_ctl --wait --silent -m fast stop
  echo "entrypoint: first-start initialisation done; starting the server"
fi

exec "$@"
