# shellcheck shell=bash
# Sourced by scripts/stack.sh (its settings and helpers are in scope). MariaDB: its own datadir, or the machine's server if one answers.

# ---------------------------------------------------------------- mysql
MYSQL_SOCK=$STACK_DIR/mysql.sock
# The datadir's administrator: the OS user that made it (mariadb-install-db --user gives
# that account, like root, socket authentication), so the stack starts as any user.
mysql_root() { mariadb --no-defaults --socket="$MYSQL_SOCK" -u"$(id -un)" "$@"; }
health_mysql() {
  MYSQL_PWD=$(cat "$STACK_DIR/mysql.password" 2>/dev/null) mariadb --no-defaults -h127.0.0.1 \
    -P"$MYSQL_PORT" -u"$MYSQL_USER" -e 'SELECT 1' "$MYSQL_DATABASE" >/dev/null 2>&1
}
provision_mysql() { # the database and an account of Stampede's own
  local pw; pw=$(cat "$(secret_file mysql.password)")
  "$@" <<SQL
CREATE DATABASE IF NOT EXISTS \`$MYSQL_DATABASE\`;
CREATE USER IF NOT EXISTS '$MYSQL_USER'@'127.0.0.1' IDENTIFIED BY '$pw';
ALTER USER '$MYSQL_USER'@'127.0.0.1' IDENTIFIED BY '$pw';
GRANT ALL PRIVILEGES ON \`${MYSQL_DATABASE}%\`.* TO '$MYSQL_USER'@'127.0.0.1';
SQL
}
start_mysql() {
  secret_file mysql.password >/dev/null
  before_start_mysql || return 0
  local data=$STACK_DIR/mysql
  if [ ! -d "$data/mysql" ]; then
    mkdir -p "$data"
    mariadb-install-db --no-defaults --datadir="$data" --user="$(id -un)" \
      --auth-root-authentication-method=socket --skip-test-db >"$LOGS/mysql-install.log" 2>&1 \
      || die "mariadb-install-db failed; see $LOGS/mysql-install.log"
  fi
  local extra
  read -ra extra <<<"$MYSQL_SERVER_ARGS"
  nohup mariadbd --no-defaults --datadir="$data" --socket="$MYSQL_SOCK" \
    --bind-address=127.0.0.1 --port="$MYSQL_PORT" --user="$(id -un)" \
    --pid-file="$PIDS/mysql.pid" --log-error="$LOGS/mysql.log" --skip-name-resolve \
    --innodb-buffer-pool-size=512M --innodb-log-file-size=256M --max-connections=1000 \
    --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci \
    "${extra[@]}" >>"$LOGS/mysql.out" 2>&1 &
  local i
  for ((i = 0; i < 300; i++)); do
    mysql_root -e 'SELECT 1' >/dev/null 2>&1 && break
    sleep 0.1
  done
  provision_mysql mysql_root || die "MariaDB did not come up; see $LOGS/mysql.log and $LOGS/mysql.out"
  wait_for mysql 10 || die "MariaDB answers but not for $MYSQL_USER; see $LOGS/mysql.log"
  say "  mysql: started on 127.0.0.1:$MYSQL_PORT (database $MYSQL_DATABASE)"
}
before_start_mysql() {
  if health_mysql; then
    say "  mysql: already running on 127.0.0.1:$MYSQL_PORT"
    return 1
  fi
  if port_open "$MYSQL_PORT"; then
    # The machine's own server: give Stampede a database and account there, if root may.
    if ! alive mysql && mariadb --no-defaults -uroot -e 'SELECT 1' >/dev/null 2>&1; then
      provision_mysql mariadb --no-defaults -uroot
      health_mysql && say "  mysql: using the machine's server on 127.0.0.1:$MYSQL_PORT, not the stack's own: make down leaves it running and make chaos cannot kill it" && return 1
    fi
    die "port $MYSQL_PORT is taken by something that is not a MariaDB Stampede can use; free it or set MYSQL_PORT"
  fi
  return 0
}
