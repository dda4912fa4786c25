#!/bin/sh
# The entrypoint of every multinode image. Job containers run as the node's SSH user
# (`docker run --user UID:GID`, scripts/multinode/plan/runtime.py); the MPI sshd container runs as root.
set -e
if [ "$(id -u)" = 0 ]; then
  # sshd refuses to start without its privilege-separation directory; /run may be a fresh tmpfs.
  mkdir -p /run/sshd
  # MODE=mpi: mpirun on the head logs in here as the node's SSH user, who must exist in this container's
  # passwd (sshd looks the name up); the ranks it starts then write the work directory as that user.
  if [ -n "${MULTINODE_USER:-}" ] && [ -n "${MULTINODE_GID:-}" ] && [ "${MULTINODE_UID:-0}" != 0 ]; then
    getent group "${MULTINODE_GID}" >/dev/null || echo "${MULTINODE_USER}:x:${MULTINODE_GID}:" >>/etc/group
    getent passwd "${MULTINODE_USER}" >/dev/null \
      || echo "${MULTINODE_USER}:x:${MULTINODE_UID}:${MULTINODE_GID}::${HOME:-/tmp}:/bin/sh" >>/etc/passwd
    # AMD GPUs: the user joins the groups of /dev/kfd and the render nodes by number (the host's `render`
    # gid, unknown to the image; ROCm/ROCm-docker issue 90).
    for dev in /dev/kfd /dev/dri/renderD*; do
      [ -e "$dev" ] || continue
      gid=$(stat -c %g "$dev")
      getent group "$gid" >/dev/null || echo "render${gid}:x:${gid}:" >>/etc/group
      sed -i "/^[^:]*:[^:]*:${gid}:/ s/\$/,${MULTINODE_USER}/; s/:,/:/" /etc/group
    done
  fi
elif ! getent passwd "$(id -u)" >/dev/null && wrapper=$(find /usr/lib -name libnss_wrapper.so -print -quit) \
     && [ -n "$wrapper" ]; then
  # A uid the image does not know (Docker adds no passwd entry for --user; podman does): ssh, which
  # mpirun starts the other nodes' ranks with, refuses to run ("No user exists for uid"). nss_wrapper
  # (cwrap.org; libnss-wrapper in the image) serves an entry from a copy of passwd without root.
  nss=$(mktemp -d)
  cat /etc/passwd >"$nss/passwd"
  echo "${USER:-user}:x:$(id -u):$(id -g)::${HOME:-/tmp}:/bin/sh" >>"$nss/passwd"
  cat /etc/group >"$nss/group"
  getent group "$(id -g)" >/dev/null || echo "${USER:-user}:x:$(id -g):" >>"$nss/group"
  export LD_PRELOAD="$wrapper${LD_PRELOAD:+ $LD_PRELOAD}" NSS_WRAPPER_PASSWD="$nss/passwd" NSS_WRAPPER_GROUP="$nss/group"
fi
exec "$@"
