#!/bin/sh
# Inside the stand-in's rootfs: the official image's layout, where /usr/local/bin/python and
# /usr/local/bin/pip are a Python 3.11 of their own (here a venv over Debian's python3.11), and
# the host's extra CA certificates are trusted (Debian's pip reads the system bundle).
set -eu
python3.11 -m venv /usr/local
update-ca-certificates >/dev/null
