# Sourced by the postgres image's entrypoint during a fresh volume's first start (it runs
# /docker-entrypoint-initdb.d/*.sh there): a slow first init, as a large restore or a slow disk
# makes one. All along the temporary server answers on its Unix socket and refuses TCP.
echo "slow-init: holding the first-start init for ${SLOW_INIT_SECONDS:-20} s"
sleep "${SLOW_INIT_SECONDS:-20}"
