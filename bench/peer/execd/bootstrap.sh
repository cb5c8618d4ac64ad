#!/bin/sh
# Stand-in for execd's bootstrap.sh (benchmark peer only): the reference server
# copies it to /opt/opensandbox/bootstrap.sh and makes it the entrypoint of every
# sandbox container. Same contract as the real one: start execd in the
# background, then exec the sandbox's own entrypoint. /bin/sh instead of bash,
# because the busybox test image has no bash.
EXECD="${EXECD:=/opt/opensandbox/execd}"
EXECD_ENVS="${EXECD_ENVS:-/opt/opensandbox/.env}"
mkdir -p "$(dirname "$EXECD_ENVS")" 2>/dev/null || true
touch "$EXECD_ENVS" 2>/dev/null || true
export EXECD_ENVS
"$EXECD" &
CMD=""
if [ "${BOOTSTRAP_CMD:-}" != "" ]; then
	CMD="$BOOTSTRAP_CMD"
elif [ $# -ge 1 ] && [ "$1" = "-c" ]; then
	shift
	CMD="$*"
fi
if [ "$CMD" != "" ]; then
	exec /bin/sh -c "$CMD"
fi
if [ $# -eq 0 ]; then
	exec /bin/sh
fi
exec "$@"
