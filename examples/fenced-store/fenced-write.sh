#!/bin/sh
# fenced-write.sh KEY VALUE: sets KEY to VALUE in the Redis at $STORE_URL (a redis:// or rediss:// URL) through
# fenced-set.lua, with this holder's fencing token: re-read at each write from the file REDLOCK_FENCING_TOKEN_FILE
# names when it is set (it follows a holder's new grants), else REDLOCK_FENCING_TOKEN. Exits 1, saying why, when
# the store refuses the write (a later holder wrote) or the token is not digits, 2 when no token is given; as the command of
# `redlock-operator lock`, that status is lock's.
set -eu
key=$1
value=$2
if [ -n "${REDLOCK_FENCING_TOKEN_FILE:-}" ]; then
  token=$(cat "$REDLOCK_FENCING_TOKEN_FILE")
else
  token=${REDLOCK_FENCING_TOKEN:?no fencing token: run this under redlock-operator lock, elect or guard}
fi
reply=$(redis-cli -u "$STORE_URL" --eval "$(dirname "$0")/fenced-set.lua" "$key" "$key:fencing-token" , "$token" "$value")
if [ "$reply" != 1 ]; then
  echo "fenced-write: $reply" >&2
  exit 1
fi
