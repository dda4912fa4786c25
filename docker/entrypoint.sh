#!/bin/sh
# sshd refuses to start without its privilege-separation directory; /run may be a fresh tmpfs.
mkdir -p /run/sshd
exec "$@"
