#!/bin/sh
# Inside the stand-in's rootfs: no cluster of Debian's own (the entrypoint makes one in PGDATA),
# the socket directory the server and pg_isready use, and the official image's entrypoint path.
set -eu
rm -rf /var/lib/postgresql/15 /etc/postgresql/15
mkdir -p /var/run/postgresql /var/lib/postgresql/data /docker-entrypoint-initdb.d
chown postgres:postgres /var/run/postgresql /var/lib/postgresql/data
chmod 3777 /var/run/postgresql
install -m 0755 /standin/docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
